"""The catalog, shuffle, Spark and events sections of the config."""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from iceberg_cdc.config.base import Redacting, Strict
from iceberg_cdc.redaction import redact_value
from iceberg_cdc.units import MiB, format_size, parse_duration, parse_size


class CatalogConfig(Redacting):
    """``load_catalog(name, **properties)``: every key but ``name`` is a catalog property."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str
    airflow_conn_id: str | None = None

    @property
    def properties(self) -> dict[str, str]:
        return {k: str(v) for k, v in (self.model_extra or {}).items()}


def catalog_key(catalog: CatalogConfig) -> str:
    """A stable, secret-free name for one catalog: what tables polled together share (the event triggers).

    A digest of the catalog's name, type and URI (a URI may hold a password,
    so it is never used as such).
    """
    properties = catalog.properties
    text = "\x00".join([catalog.name, properties.get("type", ""), properties.get("uri", "")])
    return f"{catalog.name}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


class ShuffleConfig(Redacting):
    model_config = ConfigDict(extra="allow", frozen=True)

    uri: str
    partitions: int = Field(64, ge=1, le=65536)
    target_partition_size: int = 64 * MiB
    min_partition_size: int | None = None
    # Spark's coalescePartitions.minPartitionNum: a shuffle under this many targets is packed to
    # total / min_read_ranges (never below min_partition_size), so every core reading it gets a share.
    min_read_ranges: int = Field(2, ge=1, le=65536)
    write_task_size: int = 256 * MiB  # bytes of input files bin-packed into one write task
    retain_files: bool = False
    airflow_conn_id: str | None = None
    # Carryover cancelled in the write tasks (a partition's removed and added files in one task).
    cancel_before_shuffle: bool = True
    # A partition's files above this many bytes are packed file by file instead (default 8 x write_task_size).
    cancel_partition_max_size: int | None = None
    cancel_memory: int = 256 << 20  # Arrow bytes a write task holds while cancelling; beyond: local spill
    row_lineage: bool = True  # format v3: rows with equal _row_id and sequence number are carryover

    @field_validator("target_partition_size", "write_task_size", "cancel_memory", mode="before")
    @classmethod
    def _size(cls, value: Any) -> int:
        return parse_size(value)

    @field_validator("cancel_partition_max_size", mode="before")
    @classmethod
    def _optional_cancel_size(cls, value: Any) -> int | None:
        return None if value is None else parse_size(value)

    @property
    def cancel_max_bytes(self) -> int:
        """Input bytes of one partition above which its carryover is left to the shuffle."""
        if self.cancel_partition_max_size is not None:
            return self.cancel_partition_max_size
        return 8 * self.write_task_size

    @field_validator("min_partition_size", mode="before")
    @classmethod
    def _optional_size(cls, value: Any) -> int | None:
        return None if value is None else parse_size(value)

    @field_validator("uri")
    @classmethod
    def _uri(cls, value: str) -> str:
        if not (value.startswith("s3://") or value.startswith("file:///")):
            raise ValueError(f"{value!r}: use s3://bucket/prefix or file:///absolute/dir")
        return value.rstrip("/")

    @model_validator(mode="before")
    @classmethod
    def _only_s3_extras(cls, raw: Any) -> Any:
        if isinstance(raw, dict):
            unknown = [k for k in raw if k not in cls.model_fields and not str(k).startswith("s3.")]
            if unknown:
                raise ValueError(
                    f"unknown key(s) {unknown}; allowed: {', '.join(cls.model_fields)} and s3.* properties"
                )
        return raw

    @model_validator(mode="after")
    def _min_below_half_target(self) -> ShuffleConfig:
        """Coalescing needs ``2 * min <= target`` (see :func:`iceberg_cdc.shuffle.coalesce.coalesce`).

        Checked at load, so a bad value fails the config, not the coalesce step
        of the first run that gets that far.
        """
        minimum, target = self.min_partition_size, self.target_partition_size
        if minimum is not None and 2 * minimum > target:
            raise ValueError(
                f"min_partition_size ({format_size(minimum)}) is above half of target_partition_size "
                f"({format_size(target)}): read ranges smaller than the minimum are merged into a "
                "neighbour, which only stays near the target when the minimum is at most half of it. "
                f"Set shuffle.min_partition_size to at most {format_size(target // 2)}, raise "
                "shuffle.target_partition_size, or leave min_partition_size out (default: a fifth of the "
                "target)."
            )
        return self

    @property
    def s3_properties(self) -> dict[str, str]:
        return {k: str(v) for k, v in (self.model_extra or {}).items()}


IN_PROCESS_BELOW = 1 * MiB  # bench/in_process.py: the same cost at about 1.3 MiB on warm Spark Connect


class SparkConfig(Strict):
    """How the phases run: ``submit`` (one ``spark-submit`` per phase group) or ``connect``.

    In ``connect`` mode the mapped tasks are Spark Connect clients of a
    long-running server (the Airflow connection ``connect_conn_id``, type
    ``spark_connect``, or ``connect_url`` for local use): no JVM starts per
    phase. Spark's own settings then belong to the server's start command.
    """

    mode: Literal["submit", "connect"] = "submit"
    conn_id: str = "spark_default"  # submit: the Airflow Spark connection (master URL)
    connect_conn_id: str = "spark_connect_default"  # connect: the Airflow spark_connect connection
    connect_url: str | None = None  # connect: sc://host:port, used instead of the connection
    parallel_jobs: int = Field(2, ge=1, le=64)  # Spark jobs per phase (mapped tasks)
    conf: dict[str, str] = Field(default_factory=dict)
    driver_memory: str | None = None
    executor_memory: str | None = None
    # A phase group reading less than this runs in the Airflow task's own process, no Spark job
    # (pipeline/in_process.py): the size where a Spark job and the in-process path cost the same,
    # measured by make bench (docs/benchmarks.md). 0: always Spark.
    in_process_below: int = IN_PROCESS_BELOW

    @field_validator("in_process_below", mode="before")
    @classmethod
    def _in_process_size(cls, value: Any) -> int:
        return 0 if value in (0, "0") else parse_size(value)

    @field_validator("connect_url")
    @classmethod
    def _connect_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        problem = connect_url_problem(value)
        if problem:
            raise ValueError(f"{redact_value(value)!r} {problem}")
        return value

    @model_validator(mode="after")
    def _mode_settings(self) -> SparkConfig:
        if self.mode == "connect":
            submit_only = [
                f"spark.{name}"
                for name in ("conf", "driver_memory", "executor_memory")
                if getattr(self, name)
            ]
            if submit_only:
                raise ValueError(
                    f"{', '.join(submit_only)} only apply to spark-submit (mode: submit); with mode: connect "
                    "Spark runs inside the Spark Connect server, so set them in the server's start command "
                    "(docs/operating.md, 'Spark Connect'), or use mode: submit"
                )
        elif self.connect_url is not None:
            raise ValueError(
                "spark.connect_url is only used with spark.mode: connect; set mode: connect, or remove "
                "connect_url (mode: submit uses the Airflow connection spark.conn_id)"
            )
        return self


def connect_url_problem(url: str) -> str | None:
    """What is wrong with a Spark Connect URL (``sc://host[:port][/;param=value...]``), or ``None``."""
    if not url.startswith("sc://"):
        return "is not a Spark Connect URL: write sc://host:port, e.g. sc://127.0.0.1:15002"
    netloc, _, rest = url[len("sc://") :].partition("/")
    host, _, port = netloc.rpartition(":") if ":" in netloc else (netloc, "", "")
    if not host:
        return "has no host: write sc://host:port, e.g. sc://127.0.0.1:15002"
    if port and not (port.isdigit() and 0 < int(port) < 65536):
        return "has a port that is not a number from 1 to 65535"
    if rest and not rest.startswith(";"):
        return "has a path; Spark Connect URLs take only ;key=value parameters after the host"
    return None


class EventsConfig(Strict):
    """Event-driven runs: a trigger polls the catalog and starts a table's run on a new source snapshot.

    ``trigger: catalog`` (default) is the pipeline's own trigger: one poll per
    catalog shared by all its tables, one catalog call per poll for SQL and
    Glue catalogs (:mod:`iceberg_cdc.airflow.triggers.catalog_snapshots`).
    ``trigger: provider`` uses the Apache Iceberg provider's
    ``IcebergTableSnapshotTrigger`` through the Airflow connection
    ``iceberg_conn_id`` (one table load per table per poll). The table's
    ``schedule`` stays as the fallback clock.
    """

    enabled: bool = True
    trigger: Literal["catalog", "provider"] = "catalog"
    poll_interval: float = 10.0
    iceberg_conn_id: str = "iceberg_default"

    @field_validator("poll_interval", mode="before")
    @classmethod
    def _interval(cls, value: Any) -> float:
        seconds = parse_duration(value)
        if seconds < 1:
            raise ValueError(f"poll_interval {value!r} is below one second: a catalog is not a busy loop")
        return seconds

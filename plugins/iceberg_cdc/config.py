"""The pipeline's YAML config: validated, with errors that name the key and the fix.

The file follows the public contract (``../shared/design/README.md``)::

    catalog:   {name: ..., <pyiceberg catalog properties>}
    shuffle:   {uri: ..., partitions: 64, target_partition_size: 64MiB, retain_files: false, s3.*: ...}
    tables:    [{source: ns.table, sink: ns.table_changes, identifier_columns: [id],
                 mirrors: [{type: postgres, dsn: postgresql://..., table: public.orders}, ...]}, ...]

plus optional knobs with defaults (``shuffle.write_task_size``, ``spark.*``,
``events.*``, per-table ``start``, ``duplicate_keys``, ``schedule``,
``protect_pending``, ``retention_warning``). ``CDC_CONFIG`` names the file for
the DAG files (and for the event trigger, in the triggerer).

Secrets need not be in the file: any string value may be ``${ENV_VAR}``
(expanded at load; a missing variable is an error naming it), S3 and catalog
credentials left out fall back to boto3's chain (environment, instance role),
and ``catalog.airflow_conn_id`` / ``shuffle.airflow_conn_id`` name Airflow
connections that supply them at run time. Secrets never appear in reprs,
logs or XCom (see :meth:`CdcConfig.redacted`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from iceberg_cdc.errors import ConfigError
from iceberg_cdc.redaction import is_secret_key, redact_value
from iceberg_cdc.units import MiB, format_size, parse_size

__all__ = ["CdcConfig", "ConfigError", "TableConfig", "is_secret_key", "load_config", "parse_config"]

CONFIG_ENV = "CDC_CONFIG"
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_IDENT = re.compile(r"^[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)+$")


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|d)?\s*$", re.IGNORECASE)
_DURATION_UNITS = {"ms": 0.001, "s": 1, "": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def parse_duration(value: Any) -> float:
    """Seconds from ``24h`` / ``90min`` / ``3d`` / ``500ms`` / a number of seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 24h")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(f"{value!r} is not a duration; write e.g. 30s, 15min, 24h or 3d")
        seconds = float(match.group(1)) * _DURATION_UNITS[(match.group(2) or "").lower()]
    if seconds <= 0:
        raise ValueError(f"duration must be positive, got {value!r}")
    return seconds


class _Redacting(BaseModel):
    """``repr()`` and ``str()`` (and pydantic's pretty printers) with every secret value replaced.

    A config object ends up in tracebacks, logs and debugger output: its
    printed form must never carry a credential. The values themselves stay
    as they are (``model_dump`` is what connects to the catalog).
    """

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            # A nested config model prints itself through this same method; anything else is redacted.
            nested = isinstance(value, _Redacting) or (
                isinstance(value, list) and value and all(isinstance(v, _Redacting) for v in value)
            )
            yield name, value if nested else redact_value(value, name or "")


class _Strict(_Redacting):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class CatalogConfig(_Redacting):
    """``load_catalog(name, **properties)``: every key but ``name`` is a catalog property."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str
    airflow_conn_id: str | None = None

    @property
    def properties(self) -> dict[str, str]:
        return {k: str(v) for k, v in (self.model_extra or {}).items()}


class ShuffleConfig(_Redacting):
    model_config = ConfigDict(extra="allow", frozen=True)

    uri: str
    partitions: int = Field(64, ge=1, le=65536)
    target_partition_size: int = 64 * MiB
    min_partition_size: int | None = None
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


class SparkConfig(_Strict):
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


_PG_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")
_MIRROR_NAME = re.compile(r"^[A-Za-z0-9_]{1,100}$")


class MirrorConfig(_Strict):
    """One mirror of a table: a copy of the source's current rows, one row per key, kept by its own DAG.

    ``{type: iceberg, table: ns.name}`` or
    ``{type: postgres, conn_id: <Airflow connection> | dsn: postgresql://..., table: schema.name}``.
    ``name`` tells two mirrors of one table apart (DAG id, lease, staging); it defaults to the
    table with ``.`` as ``__``. ``exclude_columns`` leaves source columns out of the mirror
    (e.g. a type the target cannot hold); key columns cannot be left out.

    Iceberg only: ``mode`` -- ``merge-on-read`` (default: replaced rows are deleted by position
    deletes, or deletion vectors on a format-v3 mirror) or ``copy-on-write`` (the data files
    holding replaced rows are rewritten: for small tables read by engines without delete support);
    ``format_version`` -- 2 or 3 for a mirror the first run creates (default: the source's, at
    least 2).
    """

    type: Literal["iceberg", "postgres"]
    table: str
    conn_id: str | None = None
    dsn: str | None = None
    name: str | None = None
    exclude_columns: list[str] = Field(default_factory=list)
    mode: Literal["merge-on-read", "copy-on-write"] | None = None
    format_version: Literal[2, 3] | None = None

    @model_validator(mode="after")
    def _target(self) -> MirrorConfig:
        if self.type == "iceberg":
            if not _IDENT.match(self.table):
                raise ValueError(
                    f"table {self.table!r} is not an Iceberg table identifier like namespace.table"
                )
            extra = [key for key in ("conn_id", "dsn") if getattr(self, key) is not None]
            if extra:
                raise ValueError(
                    f"{', '.join(extra)} only apply to type: postgres; an Iceberg mirror lives in the "
                    "config's catalog: remove them"
                )
            return self
        iceberg_only = [key for key in ("mode", "format_version") if getattr(self, key) is not None]
        if iceberg_only:
            raise ValueError(f"{', '.join(iceberg_only)} only apply to type: iceberg: remove them")
        parts = self.table.split(".")
        if len(parts) != 2 or not all(_PG_NAME.match(part) for part in parts):
            raise ValueError(
                f"table {self.table!r} is not a PostgreSQL table like schema.name (letters, digits, _ and $, "
                "at most 63 characters each, not starting with a digit), e.g. public.orders"
            )
        if (self.conn_id is None) == (self.dsn is None):
            raise ValueError(
                "a postgres mirror needs exactly one of conn_id (an Airflow connection, e.g. postgres_default) "
                "or dsn (postgresql://user@host:5432/database; put a password in ${ENV_VAR})"
            )
        if self.dsn is not None and not self.dsn.startswith(("postgresql://", "postgres://")):
            raise ValueError(
                f"dsn {redact_value(self.dsn)!r} is not a URL like postgresql://user@host:5432/database"
            )
        return self

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not _MIRROR_NAME.match(value):
            raise ValueError(f"name {value!r} may hold only letters, digits and _ (at most 100)")
        return value

    @property
    def mirror_name(self) -> str:
        """The mirror's name within its table: ``name``, or the table with ``.`` as ``__``."""
        return self.name or self.table.replace(".", "__")

    def describe(self) -> str:
        """For messages: ``postgres mirror public.orders`` (never the DSN: it may hold a password)."""
        return f"{self.type} mirror {self.table}" + (f" ({self.name})" if self.name else "")


class TableConfig(_Strict):
    source: str
    sink: str
    identifier_columns: list[str] | None = None
    start: Literal["earliest", "latest"] = "earliest"
    duplicate_keys: Literal["fail", "emit_unpaired"] = "fail"
    schedule: str | None = "@hourly"
    # How long a run's hold on the table lasts without renewal (seconds, or "5m"); the environment
    # variable CDC_LEASE_TTL_SECONDS overrides it. None: 300 s. See iceberg_cdc.run.lease.
    lease_ttl: float | None = None
    # Keep Iceberg tags on the source that make the watermark's and every pending snapshot
    # survive snapshot expiry (source/protection.py): needs write access to the source.
    protect_pending: bool = False
    # The run's note warns when a snapshot the sink needs may be expired within this time.
    retention_warning: float = 24 * 3600.0

    @field_validator("retention_warning", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> float:
        return parse_duration(value)

    mirrors: list[MirrorConfig] = Field(default_factory=list)

    @field_validator("lease_ttl", mode="before")
    @classmethod
    def _lease_ttl(cls, value: Any) -> float | None:
        return None if value is None else parse_duration(value)

    @field_validator("source", "sink")
    @classmethod
    def _identifier(cls, value: str) -> str:
        if not _IDENT.match(value):
            raise ValueError(f"{value!r} is not a table identifier like namespace.table")
        return value

    @field_validator("sink")
    @classmethod
    def _not_the_source(cls, sink: str, info: ValidationInfo) -> str:
        """A sink that is its source would capture its own output: each commit is a new source snapshot."""
        source = info.data.get("source")
        if source is not None and source.lower() == sink.lower():
            raise ValueError(
                f"{sink!r} is also this table's source ({source!r}): the pipeline would capture its own output (every "
                "commit to the sink is a new snapshot of the source, processed again, without end). Set "
                f"sink to another table, e.g. '{source}_changes' (identifiers compare without case, as "
                "most catalogs treat them)."
            )
        return sink

    @field_validator("identifier_columns")
    @classmethod
    def _columns(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and (not value or len(set(value)) != len(value)):
            raise ValueError("identifier_columns must be a non-empty list of distinct column names")
        return value

    @model_validator(mode="after")
    def _mirrors(self) -> TableConfig:
        names = [m.mirror_name for m in self.mirrors]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(
                f"mirrors: two mirrors of {self.source} are both named {dupes}; give each a distinct "
                "mirrors[].name (it names the mirror's DAG, lease and staging)"
            )
        for mirror in self.mirrors:
            if mirror.type == "iceberg" and mirror.table.lower() in (self.source.lower(), self.sink.lower()):
                raise ValueError(
                    f"mirrors: the Iceberg mirror {mirror.table!r} is this table's source or sink; a "
                    f"mirror needs a table of its own, e.g. '{self.source}_mirror'"
                )
            keys = set(self.identifier_columns or ())
            excluded_keys = sorted(keys & set(mirror.exclude_columns))
            if excluded_keys:
                raise ValueError(
                    f"mirrors: {mirror.describe()} excludes the key column(s) {excluded_keys}; a mirror "
                    "holds one row per key, so key columns cannot be left out"
                )
        return self

    @property
    def dag_id(self) -> str:
        return dag_id_for(self.source)

    def mirror(self, name: str) -> MirrorConfig:
        for mirror in self.mirrors:
            if mirror.mirror_name == name:
                return mirror
        raise ConfigError(
            f"table {self.source!r} has no mirror named {name!r} "
            f"(configured: {[m.mirror_name for m in self.mirrors]})"
        )

    def mirror_dag_id(self, mirror: MirrorConfig) -> str:
        return mirror_dag_id_for(self.source, mirror.mirror_name)


class EventsConfig(_Strict):
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


class CdcConfig(_Strict):
    catalog: CatalogConfig
    shuffle: ShuffleConfig
    tables: list[TableConfig] = Field(min_length=1)
    spark: SparkConfig = Field(default_factory=SparkConfig)
    events: EventsConfig = Field(default_factory=EventsConfig)

    @model_validator(mode="after")
    def _distinct(self) -> CdcConfig:
        for attr in ("source", "sink"):
            seen = [getattr(t, attr) for t in self.tables]
            dupes = sorted({s for s in seen if seen.count(s) > 1})
            if dupes:
                raise ValueError(f"tables: {attr} {dupes} configured more than once")
        captured = {t.source.lower() for t in self.tables} | {t.sink.lower() for t in self.tables}
        targets: dict[tuple[str, str | None, str], str] = {}
        for table in self.tables:
            for mirror in table.mirrors:
                if mirror.type == "iceberg" and mirror.table.lower() in captured:
                    raise ValueError(
                        f"tables: the Iceberg mirror {mirror.table!r} of {table.source} is a configured source "
                        "or sink; give the mirror a table of its own"
                    )
                where = (mirror.type, mirror.conn_id or mirror.dsn, mirror.table.lower())
                if where in targets:
                    raise ValueError(
                        f"tables: {mirror.describe()} is configured twice ({targets[where]} and {table.source}); "
                        "two mirrors must not write one table"
                    )
                targets[where] = table.source
        return self

    def table(self, source: str) -> TableConfig:
        for table in self.tables:
            if table.source == source:
                return table
        raise ConfigError(
            f"table {source!r} is not in the config (configured: {[t.source for t in self.tables]})"
        )

    def s3_properties(self) -> dict[str, str]:
        """S3 properties for shuffle objects: the shuffle's own, else the catalog's ``s3.*``."""
        own = self.shuffle.s3_properties
        if own:
            return own
        return {k: v for k, v in self.catalog.properties.items() if k.startswith("s3.")}

    def redacted(self) -> dict[str, Any]:
        """The config as a dict with every secret value replaced, safe to log."""
        return redact_value(self.model_dump(mode="json"))


def dag_id_for(source: str) -> str:
    """``shop.orders`` -> ``cdc__shop__orders`` (the public contract)."""
    return "cdc__" + source.replace(".", "__")


def mirror_dag_id_for(source: str, mirror_name: str) -> str:
    """``shop.orders`` + ``public__orders`` -> ``cdc_mirror__shop__orders__public__orders``."""
    return "cdc_mirror__" + source.replace(".", "__") + "__" + mirror_name


def _expand_env(value: Any, where: str) -> Any:
    if isinstance(value, dict):
        return {k: _expand_env(v, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, str):

        def replace(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in os.environ:
                raise ConfigError(
                    f"{where}: environment variable {name} is not set (referenced as ${{{name}}})"
                )
            return os.environ[name]

        return _ENV_REF.sub(replace, value)
    return value


def _location(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def parse_config(raw: Any, source: str = "config") -> CdcConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping with catalog, shuffle and tables")
    try:
        expanded = _expand_env(raw, "")
    except ConfigError as exc:
        raise ConfigError(
            f"{source} is invalid:\n  {exc}; set it in the environment of every process "
            "that reads the config (the DAG processor, the workers, the Spark driver)"
        ) from None
    try:
        return CdcConfig.model_validate(expanded)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            where = _location(error["loc"])
            if error["type"] == "extra_forbidden":
                problems.append(f"{where}: unknown key (check the spelling; see README 'Configuration')")
            elif error["type"] == "missing":
                problems.append(f"{where}: required key is missing")
            else:
                message = error["msg"].removeprefix("Value error, ")
                problems.append(f"{where}: {message}" if where else message)
        raise ConfigError(f"{source} is invalid:\n  " + "\n  ".join(problems)) from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """What PyYAML found wrong and where, without the snippet of the line it quotes.

    ``str()`` of a PyYAML error shows the offending line, and that line may hold
    a secret (a credential with a stray colon): line and column are enough.
    """
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        what = "; ".join(part for part in (exc.context, exc.problem) if part) or type(exc).__name__
        return f"{what} (line {mark.line + 1}, column {mark.column + 1})" if mark else what
    return type(exc).__name__


def load_config(path: str | os.PathLike[str] | None = None) -> CdcConfig:
    """Load the config from ``path``, or from the file ``CDC_CONFIG`` names."""
    path = path or os.environ.get(CONFIG_ENV)
    if not path:
        raise ConfigError(f"no config file: set {CONFIG_ENV} to the path of the YAML config")
    file = Path(path)
    try:
        raw = yaml.safe_load(file.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {file} does not exist (from {CONFIG_ENV} or --config)") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {file} is not valid YAML: {_yaml_problem(exc)}") from None
    return parse_config(raw, str(file))

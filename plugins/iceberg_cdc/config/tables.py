"""One ``tables[]`` entry, its ``mirrors[]``, and the DAG ids they get (the public contract)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from iceberg_cdc.config.base import IDENT, Strict
from iceberg_cdc.errors import ConfigError
from iceberg_cdc.redaction import redact_value
from iceberg_cdc.units import parse_duration

_PG_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")
_MIRROR_NAME = re.compile(r"^[A-Za-z0-9_]{1,100}$")


class MirrorConfig(Strict):
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
    # How often a mirror run also verifies the mirror against its source (mirror.verify): seconds
    # between verifications (0: every run, ``always``), or None (``false``: only ``make verify``).
    # Default a day: a verification reads the source and the mirror once each, far more than an
    # apply of a few changes reads, so every run would multiply a busy mirror's cost.
    verify: float | None = 86400.0
    repair: bool = True

    @model_validator(mode="after")
    def _target(self) -> MirrorConfig:
        if self.type == "iceberg":
            if not IDENT.match(self.table):
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

    @field_validator("verify", mode="before")
    @classmethod
    def _verify(cls, value: Any) -> float | None:
        if value is False or value is None or (isinstance(value, str) and value.strip().lower() == "false"):
            return None
        if value is True or (isinstance(value, str) and value.strip().lower() == "always"):
            return 0.0
        try:
            return parse_duration(value)
        except (ValueError, TypeError) as exc:
            raise ValueError(
                f"verify: {value!r} is not 'always', a duration such as 24h or 30m, or false ({exc})"
            ) from None

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


class TableConfig(Strict):
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
    # Keep a tag on the source at the watermark's snapshot (and the one a run processes), so a gap in
    # the history after it (expiry, rollback) is bridged from a state that still exists: needs write
    # access to the source's metadata (one small commit per run). false: the pipeline never writes
    # the source.
    protect_base: bool = True
    # When snapshots after the watermark are gone (expired, or main no longer descends from it):
    # bridge -- one commit of the net change to the oldest state still available, then per-snapshot
    # commits resume on the same sink; fail -- stop, naming the snapshots (source/history.py).
    on_history_gap: Literal["bridge", "fail"] = "bridge"
    # A bridge reading more input rows than this stops with its size and the way on (None: no bound).
    bridge_max_rows: int | None = Field(None, ge=1)
    # The run's note warns when a snapshot the sink needs may be expired within this time.
    retention_warning: float = 24 * 3600.0
    # Freshness promise (seconds, or "15m"): alert when the oldest source snapshot not yet in the
    # changelog is older than this (run/freshness.py). None: no promise, no alert.
    freshness_slo: float | None = None
    # Called when the SLO is breached and when it clears, at least once (a raising callback is called
    # again by later checks until it returns, run/freshness.py): a dotted path to a callable or to
    # an Airflow notifier instance (e.g. "my_alerts.slack"), called with Airflow's context plus
    # "freshness" (what was measured) and "freshness_transition" ("fired" / "cleared").
    freshness_callback: str | None = None

    @field_validator("freshness_slo", mode="before")
    @classmethod
    def _freshness_slo(cls, value: Any) -> float | None:
        return None if value is None else parse_duration(value)

    @field_validator("freshness_callback")
    @classmethod
    def _callback_path(cls, value: str | None) -> str | None:
        if value is not None and (
            value.count(".") < 1 or not all(p.isidentifier() for p in value.split("."))
        ):
            raise ValueError(
                f"freshness_callback={value!r} is not a dotted path: write module.name, e.g. my_alerts.slack"
            )
        return value

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
        if not IDENT.match(value):
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


def dag_id_for(source: str) -> str:
    """``shop.orders`` -> ``cdc__shop__orders`` (the public contract)."""
    return "cdc__" + source.replace(".", "__")


def mirror_dag_id_for(source: str, mirror_name: str) -> str:
    """``shop.orders`` + ``public__orders`` -> ``cdc_mirror__shop__orders__public__orders``."""
    return "cdc_mirror__" + source.replace(".", "__") + "__" + mirror_name

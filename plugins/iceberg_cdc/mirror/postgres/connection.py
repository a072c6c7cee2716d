"""Connections to a PostgreSQL mirror: a DSN from the config, or an Airflow connection's.

The core never imports Airflow: a mirror configured with ``conn_id`` gets its
DSN from a resolver that the Airflow adapter registers
(:func:`set_conn_resolver`, done by the mirror DAG module with the Postgres
provider's ``PostgresHook``). Outside Airflow, give ``dsn`` instead.

Every connection is an ADBC connection (``adbc-driver-postgresql``, libpq):
Arrow tables go in through binary COPY, and a DB-API transaction spans
everything until ``commit()``. DSNs may hold passwords: errors name the
mirror and the redacted DSN, never the DSN itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from iceberg_cdc.config import MirrorConfig
from iceberg_cdc.errors import MirrorConfigError, StorageError
from iceberg_cdc.redaction import redact as _redact

ConnResolver = Callable[[str], str]
_RESOLVER: ConnResolver | None = None


def set_conn_resolver(resolver: ConnResolver | None) -> None:
    """Register how a ``conn_id`` becomes a DSN (the Airflow adapter registers the Postgres provider's)."""
    global _RESOLVER
    _RESOLVER = resolver


def dsn_for(mirror: MirrorConfig) -> str:
    """The mirror's DSN: ``dsn`` from the config, or its ``conn_id`` through the registered resolver."""
    if mirror.dsn is not None:
        return mirror.dsn
    assert mirror.conn_id is not None
    if _RESOLVER is None:
        raise MirrorConfigError(
            f"{mirror.describe()} names the Airflow connection {mirror.conn_id!r}, which only a process that "
            "runs inside Airflow can read; give tables[].mirrors[].dsn instead for use outside Airflow"
        )
    try:
        return _RESOLVER(mirror.conn_id)
    except Exception as exc:
        raise MirrorConfigError(
            f"{mirror.describe()}: the Airflow connection {mirror.conn_id!r} could not be read "
            f"({type(exc).__name__}: {_redact(str(exc))}); create it (airflow connections add ... --conn-type "
            "postgres) or set AIRFLOW_CONN_" + mirror.conn_id.upper() + " to its URI"
        ) from None


def redacted(dsn: str) -> str:
    return str(_redact(dsn))


def connect(dsn: str) -> Any:
    """An ADBC DB-API connection (autocommit off: one transaction until ``commit()``)."""
    import adbc_driver_postgresql.dbapi as adbc

    try:
        return adbc.connect(dsn)
    except Exception as exc:
        message = str(exc).replace(dsn, redacted(dsn))
        raise StorageError(
            f"cannot connect to the PostgreSQL mirror at {redacted(dsn)}: {type(exc).__name__}: "
            f"{_redact(message)}; check the server is up and the DSN / Airflow connection"
        ) from None

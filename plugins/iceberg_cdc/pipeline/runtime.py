"""What a task needs to reach storage, resolved once per process and shipped to executors.

The Spark driver builds a :class:`Runtime` from the config (secrets expanded
from its environment, or from Airflow connections where configured) and
sends it to executors inside task closures: credentials travel over Spark's
RPC, never in command lines, plans, XCom or logs. ``repr`` hides them.

Every pyiceberg FileIO the pipeline makes -- the catalog's (metadata JSON,
manifests, commits) and the executors' (data files, staged files) -- is
:class:`~iceberg_cdc.storage.retrying_io.RetryingPyArrowFileIO` unless the
config names its own ``py-io-impl``: transient S3 errors are retried where
the I/O happens instead of failing the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from iceberg_cdc.config import CdcConfig, is_secret_key
from iceberg_cdc.storage import RETRYING_IO_IMPL, ObjectStore, open_store

PY_IO_IMPL = "py-io-impl"  # pyiceberg.io.PY_IO_IMPL, without importing pyiceberg here

_AWS_CONNECTION_KEYS = {
    "login": "s3.access-key-id",
    "password": "s3.secret-access-key",
}
_AWS_EXTRA_KEYS = {
    "endpoint_url": "s3.endpoint",
    "region_name": "s3.region",
    "aws_session_token": "s3.session-token",
}


def _connection_properties(conn_id: str) -> dict[str, str]:
    """``s3.*`` properties from an Airflow AWS connection (login/password/extra)."""
    from airflow.sdk import BaseHook  # only where Airflow is installed and configured

    connection = BaseHook.get_connection(conn_id)
    properties = {key: getattr(connection, attr) for attr, key in _AWS_CONNECTION_KEYS.items()}
    extra: dict[str, Any] = connection.extra_dejson or {}
    properties.update({key: extra[name] for name, key in _AWS_EXTRA_KEYS.items() if extra.get(name)})
    return {k: str(v) for k, v in properties.items() if v}


@dataclass(frozen=True)
class Runtime:
    shuffle_uri: str
    shuffle_properties: dict[str, str] = field(repr=False)
    io_properties: dict[str, str] = field(repr=False)  # pyiceberg FileIO properties (data and sink files)

    def store(self) -> ObjectStore:
        return open_store(self.shuffle_uri, self.shuffle_properties)

    def file_io(self, location: str | None = None):
        """The FileIO for data and staged files: the retrying one unless the config names its own."""
        from pyiceberg.io import load_file_io

        return load_file_io(with_retrying_io(self.io_properties), location)

    def __repr__(self) -> str:
        hidden = sorted(k for k in {**self.shuffle_properties, **self.io_properties} if is_secret_key(k))
        return f"Runtime(shuffle_uri={self.shuffle_uri!r}, secrets hidden: {hidden})"


def with_retrying_io(properties: dict[str, str]) -> dict[str, str]:
    """``properties`` with ``py-io-impl`` set to the retrying FileIO, unless one is configured already.

    pyiceberg's catalogs (the SQL catalog included) build every table's FileIO
    from their properties through ``load_file_io``, so setting it here covers
    the catalog's own metadata and manifest I/O as well as the executors'.
    """
    if properties.get(PY_IO_IMPL):
        return properties
    return {**properties, PY_IO_IMPL: RETRYING_IO_IMPL}


def catalog_properties(config: CdcConfig) -> dict[str, str]:
    """The catalog's properties with an Airflow connection's credentials laid over them, and the retrying FileIO."""
    properties = dict(config.catalog.properties)
    if config.catalog.airflow_conn_id:
        properties.update(_connection_properties(config.catalog.airflow_conn_id))
    return with_retrying_io(properties)


def runtime_from_config(config: CdcConfig) -> Runtime:
    io_properties = catalog_properties(config)
    shuffle_properties = config.s3_properties()
    if config.shuffle.airflow_conn_id:
        shuffle_properties = {**shuffle_properties, **_connection_properties(config.shuffle.airflow_conn_id)}
    elif not config.shuffle.s3_properties:
        shuffle_properties = {k: v for k, v in io_properties.items() if k.startswith("s3.")}
    return Runtime(config.shuffle.uri, shuffle_properties, io_properties)


def load_catalog_from_config(config: CdcConfig):
    from pyiceberg.catalog import load_catalog

    return load_catalog(config.catalog.name, **catalog_properties(config))

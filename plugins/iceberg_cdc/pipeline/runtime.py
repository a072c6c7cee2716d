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

from collections.abc import Callable
from dataclasses import dataclass, field

from iceberg_cdc.config import CdcConfig
from iceberg_cdc.errors import ConfigError
from iceberg_cdc.redaction import is_secret_key
from iceberg_cdc.storage import RETRYING_IO_IMPL, ObjectStore, open_store

PY_IO_IMPL = "py-io-impl"  # pyiceberg.io.PY_IO_IMPL, without importing pyiceberg here

ConnectionProperties = Callable[[str], dict[str, str]]
"""``s3.*`` properties from a named connection (``catalog.airflow_conn_id``, ``shuffle.airflow_conn_id``).

Resolving a connection is the orchestrator's job: the Airflow adapter passes
:meth:`iceberg_cdc.airflow.hooks.cdc.CdcHook.s3_properties`; code that runs
outside Airflow passes nothing, and a config that names a connection then
fails with :class:`~iceberg_cdc.errors.ConfigError`.
"""


def _from_connection(key: str, conn_id: str, connections: ConnectionProperties | None) -> dict[str, str]:
    if connections is None:
        raise ConfigError(
            f"{key}: {conn_id!r} names an Airflow connection, but this process was started outside "
            "Airflow and cannot look it up: run it from an Airflow task, or give the s3.* properties "
            "in the config (values may be ${ENV_VAR})"
        )
    return connections(conn_id)


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


def catalog_properties(config: CdcConfig, connections: ConnectionProperties | None = None) -> dict[str, str]:
    """The catalog's properties with a connection's credentials laid over them, and the retrying FileIO."""
    properties = dict(config.catalog.properties)
    if config.catalog.airflow_conn_id:
        properties.update(
            _from_connection("catalog.airflow_conn_id", config.catalog.airflow_conn_id, connections)
        )
    return with_retrying_io(properties)


def runtime_from_config(config: CdcConfig, connections: ConnectionProperties | None = None) -> Runtime:
    """Storage access for the config's shuffle store and tables; ``connections`` resolves named connections."""
    io_properties = catalog_properties(config, connections)
    shuffle_properties = config.s3_properties()
    if config.shuffle.airflow_conn_id:
        shuffle_properties = {
            **shuffle_properties,
            **_from_connection("shuffle.airflow_conn_id", config.shuffle.airflow_conn_id, connections),
        }
    elif not config.shuffle.s3_properties:
        shuffle_properties = {k: v for k, v in io_properties.items() if k.startswith("s3.")}
    return Runtime(config.shuffle.uri, shuffle_properties, io_properties)


def load_catalog_from_config(config: CdcConfig, connections: ConnectionProperties | None = None):
    from pyiceberg.catalog import load_catalog

    return load_catalog(config.catalog.name, **catalog_properties(config, connections))

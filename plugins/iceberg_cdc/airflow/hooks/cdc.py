"""The pipeline's one hook: every connection and credential an Airflow task of it needs.

Airflow resolves connections (``AIRFLOW_CONN_*``, a secrets backend, the
metadata database); the Airflow-free core never does. It takes a
:data:`~iceberg_cdc.pipeline.runtime.ConnectionProperties` callable instead,
and this hook is the one that Airflow's side passes:

* AWS connections named by ``catalog.airflow_conn_id`` / ``shuffle.airflow_conn_id``
  become ``s3.*`` properties (login, password, extra ``endpoint_url``,
  ``region_name``, ``aws_session_token``);
* the Spark Connect server of ``spark.mode: connect`` comes from
  ``spark.connect_url`` or the ``spark_connect`` connection
  ``spark.connect_conn_id`` (read by the Spark provider's ``SparkConnectHook``).

Values from connections are secrets: they go into the runtime (whose ``repr``
hides them) and the catalog, never into logs, XCom or command lines.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook

from iceberg_cdc.config import CdcConfig, load_config
from iceberg_cdc.errors import ConfigError

if TYPE_CHECKING:  # the runtime's modules (pyiceberg, pyarrow) are imported where a task runs, not at parse
    from iceberg_cdc.pipeline.runtime import Runtime
    from iceberg_cdc.run.context import Context

_AWS_CONNECTION_KEYS = {
    "login": "s3.access-key-id",
    "password": "s3.secret-access-key",
}
_AWS_EXTRA_KEYS = {
    "endpoint_url": "s3.endpoint",
    "region_name": "s3.region",
    "aws_session_token": "s3.session-token",
}


class CdcHook(BaseHook):
    """Connections and credentials of one config (``CDC_CONFIG`` unless given)."""

    hook_name = "Iceberg CDC"

    def __init__(self, config: CdcConfig | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._config = config

    @property
    def config(self) -> CdcConfig:
        if self._config is None:
            self._config = load_config()
        return self._config

    @classmethod
    def s3_properties(cls, conn_id: str) -> dict[str, str]:
        """``s3.*`` properties from the Airflow AWS connection ``conn_id``."""
        connection = cls.get_connection(conn_id)
        properties = {key: getattr(connection, attr) for attr, key in _AWS_CONNECTION_KEYS.items()}
        extra: dict[str, Any] = connection.extra_dejson or {}
        properties.update({key: extra[name] for name, key in _AWS_EXTRA_KEYS.items() if extra.get(name)})
        return {k: str(v) for k, v in properties.items() if v}

    def runtime(self) -> Runtime:
        from iceberg_cdc.pipeline.runtime import runtime_from_config

        return runtime_from_config(self.config, self.s3_properties)

    def catalog(self) -> Any:
        from iceberg_cdc.pipeline.runtime import load_catalog_from_config

        return load_catalog_from_config(self.config, self.s3_properties)

    def context(self, source: str) -> Context:
        """What a step of ``source``'s DAG run works with (:class:`~iceberg_cdc.run.context.Context`)."""
        from iceberg_cdc.run.context import Context

        return Context.of(self.config, source, self.s3_properties)

    def spark_connect_url(self, conn_id: str | None = None) -> str:
        """The Spark Connect server: ``spark.connect_url``, else the connection ``spark.connect_conn_id``.

        The provider's ``SparkConnectHook`` reads the connection (type
        ``spark_connect``: host, port, login as user id, password as token,
        extra ``use_ssl``); the URL may then hold a token, so it is never logged.
        """
        if self.config.spark.connect_url:
            return self.config.spark.connect_url
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

        from iceberg_cdc.airflow.compat import AirflowNotFoundException

        conn_id = conn_id or self.config.spark.connect_conn_id
        try:
            return SparkConnectHook(conn_id).get_connection_url()
        except AirflowNotFoundException:
            raise ConfigError(
                f"spark.mode is connect, but the Airflow connection {conn_id!r} (spark.connect_conn_id) is "
                "not defined: add a connection of type spark_connect (host sc://<server>, port 15002), e.g. "
                f'AIRFLOW_CONN_{conn_id.upper()}=\'{{"conn_type": "spark_connect", "host": "sc://<server>", '
                '"port": 15002}\', or set spark.connect_url'
            ) from None

    def get_conn(self) -> Any:
        """The catalog: what most of the pipeline's steps connect to."""
        return self.catalog()

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

from iceberg_cdc.config.loading import CONFIG_ENV, load_config, parse_config
from iceberg_cdc.config.model import CdcConfig
from iceberg_cdc.config.sections import (
    CatalogConfig,
    EventsConfig,
    ShuffleConfig,
    SparkConfig,
    catalog_key,
    connect_url_problem,
)
from iceberg_cdc.config.tables import MirrorConfig, TableConfig, dag_id_for, mirror_dag_id_for
from iceberg_cdc.errors import ConfigError
from iceberg_cdc.redaction import is_secret_key
from iceberg_cdc.units import parse_duration, parse_size

__all__ = [
    "CONFIG_ENV",
    "CatalogConfig",
    "CdcConfig",
    "ConfigError",
    "EventsConfig",
    "MirrorConfig",
    "ShuffleConfig",
    "SparkConfig",
    "TableConfig",
    "catalog_key",
    "connect_url_problem",
    "dag_id_for",
    "is_secret_key",
    "load_config",
    "mirror_dag_id_for",
    "parse_config",
    "parse_duration",
    "parse_size",
]

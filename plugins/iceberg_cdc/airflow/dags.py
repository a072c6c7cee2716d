"""Every DAG of a config, for a DAG file of two lines.

A deployment that installs the distribution writes, in its DAGs folder::

    from iceberg_cdc.airflow.dags import dags_from_config

    globals().update(dags_from_config())

One DAG per table (``cdc__<ns>__<table>``) and one per mirror of a table
(``cdc_mirror__<ns>__<table>__<mirror name>``, scheduled on the table's
changelog asset), and ``cdc_freshness`` when a table has a ``freshness_slo``,
from the config named by ``CDC_CONFIG`` unless given.
"""

from __future__ import annotations

from airflow.sdk import DAG

from iceberg_cdc.airflow.dag_factory import build_dags
from iceberg_cdc.airflow.freshness_dag import build_freshness_dag
from iceberg_cdc.airflow.mirror_dag import build_mirror_dags
from iceberg_cdc.config import CdcConfig, load_config


def dags_from_config(config_path: str | None = None) -> dict[str, DAG]:
    """The tables' and the mirrors' DAGs by DAG id, from ``config_path`` (default: ``CDC_CONFIG``)."""
    config: CdcConfig = load_config(config_path)
    freshness = build_freshness_dag(config)
    extra = {freshness.dag_id: freshness} if freshness is not None else {}
    return {**build_dags(config, config_path), **build_mirror_dags(config), **extra}

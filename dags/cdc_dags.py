"""Airflow DAG file: one change-data-capture DAG per table in the config named by CDC_CONFIG.

Thin on purpose; the DAGs are built by iceberg_cdc.airflow.dag_factory (plugins/).
"""

from iceberg_cdc.airflow.dag_factory import build_dags

globals().update(build_dags())

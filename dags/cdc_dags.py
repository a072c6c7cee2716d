"""Airflow DAG file: the change-data-capture DAGs of the tables in the config named by CDC_CONFIG.

One DAG per table (``cdc__<ns>__<table>``) and one per mirror of a table
(``cdc_mirror__<ns>__<table>__<mirror name>``, scheduled on the table's
changelog asset). Thin on purpose; the DAGs are built by iceberg_cdc.airflow
(plugins/).
"""

from iceberg_cdc.airflow.dag_factory import build_dags
from iceberg_cdc.airflow.mirror_dag import build_mirror_dags

globals().update(build_dags())
globals().update(build_mirror_dags())

"""Airflow DAG file: the change-data-capture DAGs of the tables in the config named by CDC_CONFIG.

The whole DAG file a deployment needs (see iceberg_cdc.airflow.dags).
"""

from iceberg_cdc.airflow.dags import dags_from_config

globals().update(dags_from_config())

"""Airflow DAG file: the change-data-capture DAGs of the tables in the config named by CDC_CONFIG.

The whole DAG file a deployment needs (see iceberg_cdc.airflow.dags). The ``airflow.*`` imports are
the DAGs' operators: the DAG processor imports a DAG file's ``airflow.*`` imports once, before it
forks each parse ([dag_processor] parsing_pre_import_modules), instead of at every parse.
"""

import airflow.providers.apache.spark.operators.spark_submit
import airflow.providers.common.compat.sdk
import airflow.providers.standard.operators.python
import airflow.providers.standard.operators.trigger_dagrun  # noqa: F401

from iceberg_cdc.airflow.dags import dags_from_config

globals().update(dags_from_config())

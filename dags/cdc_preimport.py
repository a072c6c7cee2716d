"""No DAGs: the airflow modules the CDC DAG files' parses need, for the DAG processor to pre-import.

The processor imports each DAG file's top-level ``airflow.*`` imports in its
own process before it forks the file's parse ([dag_processor]
parsing_pre_import_modules), so every later parse of every file finds them
loaded. A task process parses only its DAG's file (``cdc_dags.py``), so the
spark-submit provider module, which ``spark.mode: submit`` builds its Spark
tasks from and which imports OpenLineage and Airflow's ORM models, costs no
task of a run anything unless the task needs it.
"""

import airflow.providers.apache.spark.operators.spark_submit  # noqa: F401

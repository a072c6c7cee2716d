"""The ``--conf`` every phase's ``spark-submit`` gets, without importing Airflow.

The DAG factory passes it to SparkSubmitOperator; the benchmark submits the
same phases by hand and must use the same settings, but importing the DAG
factory would import Airflow (seconds, and an Airflow home).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from iceberg_cdc.pipeline.worker_heap import WORKER_ENV


def submit_conf(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """Executors run the driver's interpreter, their Python workers keep their memory between tasks
    (:data:`~iceberg_cdc.pipeline.worker_heap.WORKER_ENV`), and no Spark UI starts, unless ``spark.conf``
    says otherwise."""
    return {
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        **{f"spark.executorEnv.{name}": value for name, value in WORKER_ENV.items()},
        "spark.ui.enabled": "false",
        **(overrides or {}),
    }

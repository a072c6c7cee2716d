"""The ``--conf`` every phase's ``spark-submit`` gets, without importing Airflow.

The DAG factory passes it to SparkSubmitOperator; the benchmark submits the
same phases by hand and must use the same settings, but importing the DAG
factory would import Airflow (seconds, and an Airflow home).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping


def submit_conf(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """Executors run the driver's interpreter and no Spark UI starts, unless ``spark.conf`` says otherwise."""
    return {
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.ui.enabled": "false",
        **(overrides or {}),
    }

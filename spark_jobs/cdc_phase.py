"""Spark entry point for every phase of the CDC pipeline (write, read, insert).

Kept thin on purpose: the logic lives in ``iceberg_cdc`` (plugins/), shipped
to the driver and executors with ``--py-files``.
"""

import sys

from iceberg_cdc.airflow.spark_entry import run

if __name__ == "__main__":
    sys.exit(run())

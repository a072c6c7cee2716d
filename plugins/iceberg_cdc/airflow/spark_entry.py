"""The Spark application of every phase (write, read, insert), as the phase operators submit it.

``spark_jobs/cdc_phase.py`` runs :func:`run`; when that folder is not deployed
next to the plugins folder, the operators submit this file itself. The driver
runs on the Airflow worker (client deploy mode), so a connection the config
names (``catalog.airflow_conn_id``, ``shuffle.airflow_conn_id``) is looked up
through :class:`~iceberg_cdc.airflow.hooks.cdc.CdcHook` -- imported only then.
"""

from __future__ import annotations

import sys


def airflow_connection(conn_id: str) -> dict[str, str]:
    from iceberg_cdc.airflow.hooks.cdc import CdcHook

    return CdcHook.s3_properties(conn_id)


def run(argv: list[str] | None = None) -> int:
    from iceberg_cdc.mirror.iceberg import phase
    from iceberg_cdc.pipeline.spark_app import main

    phase.register()  # the Iceberg mirror's mirror_join, beside the shuffle's phases
    return main(argv, connections=airflow_connection)


if __name__ == "__main__":
    sys.exit(run())

"""The Iceberg mirror's Spark phase, ``mirror_join``, made known to the phase drivers.

The drivers (:mod:`iceberg_cdc.pipeline`) sit below the mirror in the layers
and do not import it; a process that drives ``mirror_join`` groups calls
:func:`register` first: the Airflow adapter at import, the Spark entry point,
the in-process runners.
"""

from __future__ import annotations

from iceberg_cdc.mirror.iceberg.join import run_mirror_join_task
from iceberg_cdc.mirror.iceberg.plan import ApplyPlan
from iceberg_cdc.pipeline.groups import register_phase

PHASE = "mirror_join"


def register() -> None:
    register_phase(PHASE, run_mirror_join_task, ApplyPlan.load)

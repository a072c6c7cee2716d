"""What each non-Spark task of a DAG run does, as plain functions: one import for the DAG and tests.

The DAG factory wraps these in Airflow tasks; tests call them directly. Each
returns a small JSON-able dict (it becomes the task's XCom and its figures in
the UI) and logs one readable line per decision. The steps live in modules by
concern: the run's lease (:mod:`.run_lease`), detect and the leftover sweep
(:mod:`.detect`), the barrier check and coalesce (:mod:`.shuffle_steps`), the
fenced, conserved commit (:mod:`.commit_step`), watermark and cleanup
(:mod:`.finish`).
"""

from __future__ import annotations

from iceberg_cdc.run.commit_step import commit
from iceberg_cdc.run.context import Context
from iceberg_cdc.run.detect import detect, left_to_run_ahead, sweep_leftovers
from iceberg_cdc.run.finish import cleanup, watermark
from iceberg_cdc.run.lease import confirm as confirm_lease
from iceberg_cdc.run.shuffle_steps import attempt_paths, coalesce, missing_map_outputs

__all__ = [
    "Context",
    "attempt_paths",
    "cleanup",
    "coalesce",
    "commit",
    "confirm_lease",
    "detect",
    "left_to_run_ahead",
    "missing_map_outputs",
    "sweep_leftovers",
    "watermark",
]

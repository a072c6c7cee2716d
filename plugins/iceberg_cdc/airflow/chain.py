"""Whether a run starts the table's next run, decided by watermark, the task that learns it.

A separate short-circuit task (``more_pending``) cost every run a task
process and a scheduler hop; deciding inside ``trigger_next_run`` instead
cost every run that does not chain a process of its own whose *skipped*
state Airflow records only after the process exits. So watermark decides:
when no next run is due it skips ``trigger_next_run`` as a short-circuit task
would (Airflow sets the skip; no process starts), and when one is,
``trigger_next_run`` starts it. ``ChainRunOperator`` checks again (a cleared
``trigger_next_run`` re-run by hand), with the same rule.
"""

from __future__ import annotations

import logging
from typing import Any

from iceberg_cdc.run.kinds import is_backfill, should_chain

log = logging.getLogger(__name__)

TRIGGER_TASK = "trigger_next_run"


def no_chain_reason(mark: dict[str, Any], params: dict[str, Any] | None, run_type: Any) -> str | None:
    """Why this run starts no next run, or None when it does.

    A backfill never chains: its runs are the backfill's, and a chained run
    would escape it. A manual reprocess (``snapshot_id``) chains only when
    asked to; a range reprocess chains to the next snapshot of its range
    (:func:`~iceberg_cdc.run.kinds.should_chain`).
    """
    backfill = is_backfill(run_type)
    if should_chain(mark, params, backfill=backfill):
        return None
    return "a backfill run does not chain" if backfill else "no next run to start"


def skip_trigger(ti: Any, mark: dict[str, Any], reason: str) -> None:
    """From watermark: keep ``mark`` as its result and skip ``trigger_next_run`` (ends the calling task).

    Airflow's ``SkipMixin`` does the skip (it also records it, so clearing
    ``trigger_next_run`` alone leaves it skipped); it raises to end the task,
    so the result is pushed first.
    """
    from airflow.providers.standard.utils.skipmixin import SkipMixin

    ti.xcom_push(key="return_value", value=mark)
    log.info("%s (remaining: %s): %s skipped", reason, mark.get("remaining", 0), TRIGGER_TASK)
    skipper = SkipMixin()
    skipper.task_id = ti.task_id  # type: ignore[attr-defined]
    skipper.skip(ti=ti, tasks=[ti.task.dag.get_task(TRIGGER_TASK)])

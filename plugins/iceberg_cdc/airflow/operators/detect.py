"""detect as an operator: the first task of every run, and the one that waits for a busy table.

The step itself is Airflow-free (:func:`iceberg_cdc.run.detect.detect`); this
operator owns what only Airflow can do around it: refuse reprocess params in
a backfill, ask Airflow whether the lease holder's run is still running, and
wait for a busy table without holding a worker slot -- a few seconds in
process (a predecessor finishing its cleanup), then by rescheduling itself,
for at most the lease-wait window per holder (:func:`iceberg_cdc.run.lease.lease_wait_step`).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from airflow.sdk import BaseOperator

from iceberg_cdc import snapshot_ids
from iceberg_cdc.airflow.compat import AirflowFailException
from iceberg_cdc.airflow.hooks.cdc import CdcHook
from iceberg_cdc.airflow.metrics import emit_safely
from iceberg_cdc.airflow.operators.lineage import LineageReporting, changelog_datasets
from iceberg_cdc.airflow.policy import (
    airflow_holder_state,
    airflow_live_chain,
    airflow_run_ahead,
    final_errors,
)
from iceberg_cdc.config import TableConfig
from iceberg_cdc.run.kinds import backfill_refusal, is_backfill
from iceberg_cdc.run.metrics import emit_retention

# The run's own modules (steps, the lease, the story: pyiceberg, pyarrow, the object stores) are
# imported where a task runs: every DAG file parse imports this module, and they are not needed there.

log = logging.getLogger("iceberg_cdc")

SENSOR_MODE_ENV = "CDC_SENSOR_MODE"  # "poke" for `airflow dags test`, else reschedule
LEASE_WAIT_ENV = "CDC_LEASE_WAIT_SECONDS"  # how long detect waits for a busy table (default 2 TTLs)
IN_PROCESS_WAIT_SECONDS = 5.0  # a chained run behind its predecessor's cleanup: poll, then reschedule


def sensor_mode() -> str:
    """``poke`` under ``airflow dags test`` (no scheduler to reschedule), else ``reschedule``."""
    return os.environ.get(SENSOR_MODE_ENV, "reschedule")


def lease_wait_seconds(table: TableConfig | None = None) -> float:
    """How long detect waits for another run of the table: two TTLs, so a dead holder is overtaken."""
    from iceberg_cdc.run.lease import lease_ttl_seconds

    raw = os.environ.get(LEASE_WAIT_ENV)
    return float(raw) if raw else 2 * lease_ttl_seconds(table)


class DetectOperator(LineageReporting, BaseOperator):
    """Take the table's lease, find the snapshot to process and plan it; XCom: detect's small dict.

    Reports to OpenLineage the source table at the snapshot the run processes
    (:mod:`iceberg_cdc.airflow.operators.lineage`), and the retention guard's
    figures to the metrics backend.
    """

    ui_color = "#cfe8fc"

    def __init__(self, *, source: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.source = source

    def execute(self, context: Any) -> dict[str, Any]:
        from iceberg_cdc.airflow.lease_wait import take_waiting
        from iceberg_cdc.run import steps
        from iceberg_cdc.run.story import chained_snapshot, story

        params = context.get("params") or {}
        ti, dag_run = context.get("ti"), context.get("dag_run")
        backfill = is_backfill(getattr(dag_run, "run_type", None))
        refusal = backfill_refusal(params) if backfill else None
        if refusal:
            raise AirflowFailException(refusal)
        with final_errors():
            ctx = CdcHook().context(self.source)
            # Ids as the form sends them (digits) or as API callers may (integers); never a rounded float.
            requested = snapshot_ids.parse(params.get("snapshot_id"), "snapshot_id")
            through = snapshot_ids.parse(params.get("through_snapshot_id"), "through_snapshot_id")
        try_started = time.time()
        waiting_since = _first_reschedule(ti, context) or try_started
        run_id = context.get("run_id") or "manual"

        # An ordinary run leaves the table to a run ahead of it instead of queueing too (run/queue.py).
        ahead = (
            airflow_run_ahead(ti, self.dag_id, run_id)
            if requested is None and not backfill and chained_snapshot(run_id) is None
            else None
        )

        def take() -> dict[str, Any]:
            reason = ahead() if ahead is not None else None
            if reason is not None:
                log.warning("%s: nothing processed, no lease taken: %s", self.source, reason)
                left = steps.left_to_run_ahead(ctx, run_id, reason)
                self._lineage_detected = left.to_xcom()
                return self._lineage_detected
            with final_errors():
                detected = steps.detect(
                    ctx,
                    run_id,
                    requested,
                    dag_id=self.dag_id,
                    try_number=getattr(ti, "try_number", None),
                    holder_state=airflow_holder_state(ti),
                    through_snapshot_id=through,
                    # One chain per table: a chained run takes the snapshot its id names or none,
                    # any other run leaves the pending snapshot to a live chained run.
                    expected_snapshot_id=chained_snapshot(run_id),
                    live_chain=airflow_live_chain(ti, self.dag_id, run_id),
                )
            log.info("this run: %s", story(detected))
            emit_safely(emit_retention, self.source, dict(detected.retention))
            # Kept for the OpenLineage listener, which asks after the task in a forked process.
            self._lineage_detected = detected.to_xcom()
            return self._lineage_detected

        return take_waiting(
            take,
            what="table",
            lease=ctx.lease,
            window=lease_wait_seconds(ctx.table),
            try_started=try_started,
            waiting_since=waiting_since,
            reschedule=sensor_mode() != "poke",
            # Only a first attempt polls in process (a predecessor finishing its cleanup);
            # a backfill's runs queue for the table: they give their slots back at once.
            in_process_seconds=0.0 if backfill or waiting_since != try_started else IN_PROCESS_WAIT_SECONDS,
        )

    def lineage_datasets(self, task_instance: Any) -> tuple[list, list]:
        detected = getattr(self, "_lineage_detected", None) or {}
        if detected.get("snapshot_id") is None:  # caught up: the run reads nothing
            return [], []
        return changelog_datasets(detected, None)


def _first_reschedule(ti: Any, context: Any) -> float | None:
    """When this try of the task first ran, if it has been rescheduled since (epoch seconds)."""
    try:
        first = ti.get_first_reschedule_date(context)
    except Exception:  # no scheduler behind the task (a test), or an older task SDK
        return None
    return first.timestamp() if first is not None else None

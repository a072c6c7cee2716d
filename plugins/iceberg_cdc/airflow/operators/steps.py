"""The run's in-worker steps as operators: write_jobs / insert_jobs, coalesce, commit, watermark, cleanup.

Each is a plain :class:`~airflow.sdk.BaseOperator` rather than a ``@task``
function built inside the DAG factory: the DAG processor builds every task of
every table at every parse, and a ``@task`` costs it several times an
operator (signature binding, annotation checks, three layers of
``apply_defaults``): about half of a table's DAG build was its ``@task`` calls
(``bench/tables.py``). detect's result reaches them as a templated field (an
XComArg, resolved when the task runs), which also makes detect their upstream.
The steps themselves are Airflow-free (:mod:`iceberg_cdc.run.steps`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from airflow.sdk import BaseOperator

from iceberg_cdc import snapshot_ids
from iceberg_cdc.airflow.chain import no_chain_reason, skip_trigger
from iceberg_cdc.airflow.hooks.cdc import CdcHook
from iceberg_cdc.airflow.metrics import emit_safely
from iceberg_cdc.airflow.operators.lineage import LineageReporting, changelog_datasets
from iceberg_cdc.airflow.policy import final_errors
from iceberg_cdc.run.metrics import emit_commit, emit_lag

# The run's modules (steps, the lease: pyiceberg, pyarrow, the object stores) are imported in execute:
# every DAG file parse imports this module, and builds no task's work there.

log = logging.getLogger("iceberg_cdc")


class JobListOperator(BaseOperator):
    """Hands one of detect's job lists (``key``) to the mapped Spark task of its path.

    A mapped task cannot expand over one key of detect's XCom (Airflow records
    one map length per task, the length of its whole return value), so each
    path's list is its own task's return value; empty when the run takes the
    other path.
    """

    template_fields: Sequence[str] = ("detected",)
    ui_color = "#f0f0f0"

    def __init__(self, *, detected: Any, key: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.detected = detected
        self.key = key

    def execute(self, context: Any) -> list[list[str]]:
        return self.detected[self.key]


class _StepOperator(BaseOperator):
    """A step of ``source``'s run that works on detect's result (``detected``)."""

    template_fields: Sequence[str] = ("detected",)

    def __init__(self, *, source: str, detected: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.source = source
        self.detected = detected

    def run_context(self) -> Any:
        return CdcHook().context(self.source)  # the hook loads CDC_CONFIG's config, as detect's does


class CoalesceOperator(_StepOperator):
    """After the barrier: group the map outputs' partitions into SHUFFLE_READ tasks (their arguments)."""

    ui_color = "#e8f0fe"

    def execute(self, context: Any) -> list[list[str]]:
        from iceberg_cdc.run import steps
        from iceberg_cdc.run.lease import kept_alive

        ctx = self.run_context()
        with final_errors(), kept_alive(ctx, self.detected):
            return steps.coalesce(ctx, self.detected)


def asset_extra(source: str, detected: dict[str, Any], committed: dict[str, Any]) -> dict[str, Any]:
    """The sink asset event's extra: the snapshot (id as a string: browsers round 19 digits), ordinal, counts."""
    extra: dict[str, Any] = {
        "source": source,
        "snapshot_id": snapshot_ids.as_text(detected.get("snapshot_id")),
        "ordinal": detected.get("ordinal"),
        "operation": detected.get("operation"),
        "reprocess": bool(detected.get("manual")),
    }
    for key in ("inserts", "deletes", "updates", "carryover_rows", "shuffle_bytes", "files"):
        if isinstance(committed.get(key), int):
            extra[key] = committed[key]
    extra["story"] = committed.get("story")
    return extra


def sink_changed(committed: dict[str, Any]) -> bool:
    """Whether commit added rows to the sink (an idle, skipped or all-carryover run did not)."""
    return bool(committed.get("committed"))


class CommitOperator(LineageReporting, _StepOperator):
    """One atomic sink commit of the run's changes, marked with the source snapshot (exactly once).

    detect's result is pulled, not templated: a templated XComArg would make
    commit a direct downstream of the setup task, which Airflow allows only
    with trigger rule ALL_SUCCESS (commit's is NONE_FAILED: one path's mapped
    tasks are skipped). The sink asset's event goes through the ``alias``
    outlet only when rows were committed, so an idle run wakes no consumer.
    Reports the source and the changelog at their snapshots to OpenLineage.
    """

    template_fields: Sequence[str] = ()
    ui_color = "#d4edda"

    def __init__(self, *, source: str, alias: Any, asset: Any, **kwargs: Any) -> None:
        super().__init__(source=source, detected=None, outlets=[alias], **kwargs)
        self.alias = alias
        self.asset = asset

    def execute(self, context: Any) -> dict[str, Any]:
        from iceberg_cdc.run import steps
        from iceberg_cdc.run.lease import kept_alive
        from iceberg_cdc.run.story import story

        detected = context["ti"].xcom_pull(task_ids="detect")
        ctx = self.run_context()
        with final_errors(), kept_alive(ctx, detected):
            committed = steps.commit(ctx, detected)
        committed["story"] = story(detected, committed)
        log.info("this run: %s", committed["story"])
        emit_safely(emit_commit, self.source, committed)
        outlet_events = context.get("outlet_events")
        if outlet_events is not None and sink_changed(committed):
            outlet_events[self.alias].add(self.asset, extra=asset_extra(self.source, detected, committed))
        committed["snapshot_id"] = snapshot_ids.as_text(committed.get("snapshot_id"))
        # Kept for the OpenLineage listener, which asks after the task in a forked process.
        self._lineage_detected, self._lineage_committed = detected, committed
        return committed

    def lineage_datasets(self, task_instance: Any) -> tuple[list, list]:
        detected = getattr(self, "_lineage_detected", None) or {}
        if detected.get("snapshot_id") is None:  # caught up: no datasets
            return [], []
        committed = getattr(self, "_lineage_committed", None)
        return changelog_datasets(detected, committed if isinstance(committed, dict) else None)


class WatermarkOperator(_StepOperator):
    """Confirm the run's progress; decide whether the next run starts at once (else skip its trigger).

    Its result names the chained run (id and note) for ``trigger_next_run``'s
    templates. The chain rule is :mod:`iceberg_cdc.airflow.chain`'s.
    """

    template_fields: Sequence[str] = ("detected", "committed")
    ui_color = "#fff3cd"

    def __init__(self, *, source: str, detected: Any, committed: Any, **kwargs: Any) -> None:
        super().__init__(source=source, detected=detected, **kwargs)
        self.committed = committed

    def execute(self, context: Any) -> dict[str, Any]:
        from iceberg_cdc.run import steps
        from iceberg_cdc.run.story import chained_note, chained_run_id

        mark = steps.watermark(self.run_context(), self.detected)
        emit_safely(emit_lag, self.source, int(mark.get("remaining") or 0))
        # When the chained run is started, not this run's logical date (a backfill's or a past tick's).
        stamp = f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}_{time.time_ns() % 10**6:06d}"
        if mark.get("next_conf"):
            mark["chained_run_id"] = chained_run_id(mark["next_conf"]["snapshot_id"], stamp, "reprocess")
        else:
            mark["chained_run_id"] = chained_run_id(mark.get("next_snapshot_id"), stamp)
        mark["chained_note"] = chained_note(mark)
        # Whether to chain: decided here, where it is known (airflow/chain.py says why).
        dag_run, ti = context.get("dag_run"), context.get("ti")
        reason = no_chain_reason(mark, context.get("params"), getattr(dag_run, "run_type", None))
        if reason is not None and ti is not None:
            skip_trigger(ti, mark, reason)
        return mark


class CleanupOperator(_StepOperator):
    """The run's teardown (after failures too): give the table's lease back, delete the run's shuffle files."""

    ui_color = "#f5f5f5"

    def execute(self, context: Any) -> dict[str, Any]:
        from iceberg_cdc.run import steps

        return steps.cleanup(self.run_context(), self.detected, context.get("run_id") or "manual")

"""Small phase groups run in the Airflow task's own process: the same unit functions, no Spark job.

A one-row snapshot's write or read group is milliseconds of Arrow work, but a
Spark job around it costs a JVM start (``spark-submit``) or a Connect job's
scheduling, serialization and a Python worker (``connect``) -- most of a small
run's time. A group whose input is below ``spark.in_process_below`` runs its
units here, one after another, through :func:`~iceberg_cdc.pipeline.phase_driver.run_phase_group`
like a Spark driver's: the same lease check and heartbeat, the same failure
markers, error line and figures, so the barrier, coalesce and commit cannot
tell the difference -- except the group's record says ``runner: in_process``,
which the run's story shows.

The size is what the plan knows before anything runs: a write or insert
group's input files (their bytes in the manifests), a read group's shuffle
ranges (the map outputs' indexes). Anything else (a mirror's registered phase)
runs on Spark. So a big snapshot never takes this path by accident.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from iceberg_cdc.pipeline.groups import PHASE_FUNCTIONS, load_phase_plan, units_of
from iceberg_cdc.pipeline.phase_driver import GroupRun, run_phase_group
from iceberg_cdc.pipeline.plan import SnapshotPlan
from iceberg_cdc.pipeline.runtime import Runtime
from iceberg_cdc.storage import ObjectStore
from iceberg_cdc.units import format_bytes

log = logging.getLogger("iceberg_cdc")

IN_PROCESS = "in_process"  # a group record's ``runner`` when its units ran in the task's process
SNAPSHOT_PHASES = ("write", "read", "insert")


def group_input_bytes(phase: str, plan: Any, group: int, store: ObjectStore) -> int | None:
    """Bytes one group reads, as the plan knows them before it runs; None when unknown (never in process)."""
    if phase in ("write", "insert") and isinstance(plan, SnapshotPlan):
        return int(plan.groups[group].bytes)
    if phase == "read" and isinstance(plan, SnapshotPlan):
        return sum(int(r["size"]) for r in units_of(phase, plan, group, store))
    return None


def in_process_reason(phase: str, input_bytes: int | None, below: int) -> str | None:
    """Why this group runs in process (the log line), or None when it runs on Spark."""
    if phase not in SNAPSHOT_PHASES or input_bytes is None or below <= 0 or input_bytes >= below:
        return None
    return f"{format_bytes(input_bytes)} of input, below spark.in_process_below ({format_bytes(below)})"


class InProcessUnitRunner:
    """The group's units one after another in this process (a :class:`~.phase_driver.UnitRunner`).

    ``cancel`` (the heartbeat lost the lease) stops before the next unit; the
    one running finishes its own writes, which live in the lost epoch's
    namespace and are never committed.
    """

    def __init__(self) -> None:
        self._cancelled = threading.Event()

    def map_units(self, phase: str, plan: SnapshotPlan, runtime: Runtime, units: list[Any]) -> list[Any]:
        function = PHASE_FUNCTIONS[phase]
        results = []
        for unit in units:
            if self._cancelled.is_set():
                raise InterruptedError(f"{phase} group cancelled: the run lost the table's lease")
            results.append(function(plan, runtime, unit))
        return results

    def cancel(self) -> None:
        self._cancelled.set()


def run_if_small(
    runtime: Runtime, plan_key: str, phase: str, group: int, below: int, *, label: str = ""
) -> GroupRun | None:
    """Run the group here when its input is below ``below`` bytes; None (nothing done) when it needs Spark."""
    if phase not in SNAPSHOT_PHASES or below <= 0:
        return None
    store = runtime.store()
    plan = load_phase_plan(phase, store, plan_key)
    reason = in_process_reason(phase, group_input_bytes(phase, plan, group, store), below)
    if reason is None:
        return None
    log.info("%s runs in this process, no Spark job: %s", label or f"{phase} group {group + 1}", reason)
    return run_phase_group(
        runtime, plan_key, phase, group, lambda _plan: InProcessUnitRunner(), label=label, where=IN_PROCESS
    )


def in_process_phases(records: list[dict[str, Any]]) -> tuple[str, ...]:
    """Phases of one attempt whose every group ran in process (from the group records), in run order."""
    runners: dict[str, set[str]] = {}
    for record in records:
        if record.get("phase") in SNAPSHOT_PHASES and "group" in record:
            runners.setdefault(record["phase"], set()).add(str(record.get("runner", "spark")))
    return tuple(p for p in SNAPSHOT_PHASES if runners.get(p) == {IN_PROCESS})


__all__ = [
    "IN_PROCESS",
    "InProcessUnitRunner",
    "group_input_bytes",
    "in_process_phases",
    "in_process_reason",
    "run_if_small",
]

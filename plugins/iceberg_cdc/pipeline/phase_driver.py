"""What every Spark driver of one phase group does, whatever runs its units.

A phase group (a mapped Airflow task) runs its units -- write tasks, read
ranges or insert tasks, exactly :func:`~iceberg_cdc.pipeline.groups.units_of` --
on Spark. Two drivers do so: a ``spark-submit`` application
(:mod:`iceberg_cdc.pipeline.spark_app`, units as an RDD) and a Spark Connect
client (:mod:`iceberg_cdc.pipeline.connect_app`, units through ``mapInArrow``).
Both share the steps around the job, here:

1. prove the run still holds the table's lease (the plan's epoch), before
   any Spark resource is taken;
2. run the units while a :class:`~iceberg_cdc.coordination.heartbeat.LeaseHeartbeat`
   renews the lease; a lost lease cancels the job (``UnitRunner.cancel``);
3. on failure of a write group, leave a failure marker for each of its
   unfinished tasks (``paths.failed(task)`` where ``paths.written(task)`` is
   absent), so the barrier fails fast and names them;
4. on success, record the group's figures (:func:`~iceberg_cdc.pipeline.groups.record_group`);
   on failure, the error's one line (:func:`iceberg_cdc.error_lines.line_in_text`,
   secrets removed) under
   ``paths.group_error``, so the Airflow task can raise it before the
   spark-submit noise.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from iceberg_cdc.coordination.heartbeat import LeaseHeartbeat
from iceberg_cdc.coordination.lease import TableLease
from iceberg_cdc.error_lines import line_in_text
from iceberg_cdc.errors import CdcError, ObjectNotFoundError
from iceberg_cdc.pipeline.groups import load_phase_plan, record_group, units_of
from iceberg_cdc.pipeline.plan import SnapshotPlan
from iceberg_cdc.pipeline.runtime import Runtime
from iceberg_cdc.redaction import redact, secret_values
from iceberg_cdc.storage import ObjectStore

log = logging.getLogger("iceberg_cdc.spark")


class UnitRunner(Protocol):
    """Runs one group's units on Spark, one Spark task per unit, and returns their results in unit order."""

    def map_units(self, phase: str, plan: SnapshotPlan, runtime: Runtime, units: list[Any]) -> list[Any]: ...

    def cancel(self) -> None:
        """Cancel the running job (called from the heartbeat's thread when the lease is lost)."""


@dataclass(frozen=True)
class GroupRun:
    """What one group did: its units, their results (figures) and the job's wall time."""

    phase: str
    group: int
    units: list[Any]
    results: list[Any]
    seconds: float


def error_line(exc: BaseException, runtime: Runtime | None = None) -> str:
    """The pipeline's own error in one line (even inside a JVM traceback), without the runtime's secrets."""
    secrets = secret_values({**runtime.shuffle_properties, **runtime.io_properties}) if runtime else ()
    return line_in_text(exc, secrets=secrets)


def record_group_error(
    store: ObjectStore,
    plan: Any,
    phase: str,
    group: int,
    exc: BaseException,
    runtime: Runtime | None = None,
) -> str:
    """Leave the group's error line where the Airflow task finds it (:func:`read_group_error`); returns it.

    ``plan`` is the plan the phase's group runs from (``load_phase_plan``): a
    snapshot plan, or a registered phase's own (a mirror's apply plan).
    """
    line = error_line(exc, runtime)
    store.put(plan.paths.group_error(phase, group), json.dumps({"error": line}).encode())
    return line


def read_group_error(store: ObjectStore, plan_key: str, phase: str, group: int) -> str | None:
    """The error line :func:`record_group_error` left for ``phase`` group ``group``, or None.

    The plan is loaded as the group's driver loaded it (``load_phase_plan``),
    so a mirror phase's group is found in its apply plan's namespace, not
    looked for (and missed) as a snapshot plan's.
    """
    plan = load_phase_plan(phase, store, plan_key)
    try:
        recorded = store.get(plan.paths.group_error(phase, group))
    except ObjectNotFoundError:
        return None
    return str(json.loads(recorded)["error"])


def mark_failed_writes(
    store: ObjectStore, plan: SnapshotPlan, task_ids: list[str], exc: BaseException
) -> None:
    """A failure marker for each write task of the group that left no map output."""
    paths = plan.paths
    reason = redact("".join(traceback.format_exception_only(type(exc), exc)).strip()[-4000:])
    for task_id in task_ids:
        if not store.list(paths.written(task_id)):
            store.put(paths.failed(task_id), json.dumps({"task_id": task_id, "error": reason}).encode())


def run_phase_group(
    runtime: Runtime,
    plan_key: str,
    phase: str,
    group: int,
    start_runner: Callable[[SnapshotPlan], UnitRunner],
    *,
    label: str = "",
    where: str = "spark",
) -> GroupRun:
    """Lease check, the group's units through ``start_runner(plan)``'s runner under a heartbeat, figures.

    ``start_runner`` is called only once the lease is proven (it may start a
    JVM or open a session); ``where`` names where the units ran in the group's
    record (``spark``, or ``in_process``: :mod:`.in_process`). Raises what the units raised (after the failure
    markers), or :class:`~iceberg_cdc.errors.LeaseLostError`.
    """
    store = runtime.store()
    plan = load_phase_plan(phase, store, plan_key)
    lease = TableLease(store, plan.lease_name)
    lease.renew(plan.run_id, plan.epoch, plan.lease_ttl_seconds)
    units = units_of(phase, plan, group, store)
    runners: list[UnitRunner] = []
    # The heartbeat starts before the runner: a session or JVM that is slow to start is a live task,
    # and a task that stops renewing is one its successor may take the table from (coordination.lease).
    heartbeat = LeaseHeartbeat(
        lease,
        plan.run_id,
        plan.epoch,
        plan.lease_ttl_seconds,
        on_lost=lambda _: [runner.cancel() for runner in runners],
    )
    with contextlib.ExitStack() as beating:
        beating.enter_context(heartbeat)
        runner = start_runner(plan)
        runners.append(runner)
        beating.pop_all()  # from here the block below stops the heartbeat
    log.info(
        "%s: %s (%d units) for %s snapshot %s",
        phase,
        label or f"group {group + 1}",
        len(units),
        plan.source,
        plan.snapshot_id,
    )
    started = time.perf_counter()
    try:
        try:
            heartbeat.check()  # lost while the runner started
            results = runner.map_units(phase, plan, runtime, units)
        finally:
            heartbeat.stop()
        heartbeat.check()
    except Exception as exc:
        if phase == "write":
            try:
                mark_failed_writes(store, plan, list(units), heartbeat.lost or exc)
            except CdcError:  # a store error: the unit's own error (raised below) matters more
                log.exception("could not leave failure markers for the write group")
        try:
            log.error("%s", record_group_error(store, plan, phase, group, heartbeat.lost or exc, runtime))
        except CdcError:  # a store error: the error itself (raised below) matters more than its record
            log.exception("could not record the group's error")
        if heartbeat.lost is not None and exc is not heartbeat.lost:
            # The job failed because the heartbeat cancelled it: the lost lease is the reason.
            raise heartbeat.lost from exc
        raise
    seconds = round(time.perf_counter() - started, 3)
    record_group(store, plan, phase, group, seconds, results, runner=where)
    for result in results:
        log.info("%s done: %s", phase, json.dumps(result, sort_keys=True)[:500])
    log.info("%s group %d: %d units in %.1f s", phase, group, len(units), seconds)
    return GroupRun(phase, group, units, results, seconds)

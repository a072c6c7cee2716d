"""One DAG run's steps in this process, in DAG order, without Airflow or Spark.

detect → write tasks → barrier check → coalesce → read tasks (or insert
tasks) → commit → watermark, with cleanup always last, as the DAG's teardown.
The units run through the same functions the Spark driver maps over its
executors (:mod:`iceberg_cdc.pipeline.groups`), so what is tested and
benchmarked here is the pipeline's own code; only the scheduling differs.

Used by the randomized correctness tests (hundreds of snapshot histories in
seconds), the benchmarks (phase by phase) and ``make demo-engine``; tooling,
so it lives here, outside the ``iceberg_cdc`` the wheel ships.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from iceberg_cdc.config import CdcConfig
from iceberg_cdc.errors import CdcError
from iceberg_cdc.pipeline.groups import read_group_count, record_group, units_of
from iceberg_cdc.pipeline.in_process import IN_PROCESS, InProcessUnitRunner
from iceberg_cdc.pipeline.phase_driver import UnitRunner
from iceberg_cdc.pipeline.plan import SnapshotPlan
from iceberg_cdc.run import steps
from iceberg_cdc.run.state import Detected


@dataclass
class InlineRun:
    """What one in-process run did: detect's answer, each step's result, and seconds per step."""

    detected: Detected
    committed: dict[str, Any] = field(default_factory=dict)
    watermark: dict[str, Any] = field(default_factory=dict)
    cleanup: dict[str, Any] = field(default_factory=dict)
    units: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def action(self) -> str:
        return self.detected.action

    @property
    def snapshot_id(self) -> int | None:
        return self.detected.snapshot_id


RunnerFactory = Callable[[int], UnitRunner]
"""A group's :class:`~iceberg_cdc.pipeline.phase_driver.UnitRunner`, by group index (default: in process)."""


def run_phase(
    ctx: steps.Context, plan: SnapshotPlan, phase: str, groups: int, runner: RunnerFactory | None = None
) -> list[dict[str, Any]]:
    """Every group of ``phase`` in turn, recorded as the Spark driver records them; the units' results.

    The units run through ``runner`` (the product's in-process runner unless a
    test hands a Spark one), so both paths can be run on one history.
    """
    store = ctx.runtime.store()
    results: list[dict[str, Any]] = []
    for group in range(groups):
        started = time.perf_counter()
        unit_runner = runner(group) if runner is not None else InProcessUnitRunner()
        done = unit_runner.map_units(phase, plan, ctx.runtime, units_of(phase, plan, group, store))
        where = IN_PROCESS if isinstance(unit_runner, InProcessUnitRunner) else "spark"
        record_group(store, plan, phase, group, time.perf_counter() - started, done, runner=where)
        results.extend(done)
    return results


def run_snapshot(
    config: CdcConfig,
    source: str,
    *,
    snapshot_id: int | None = None,
    run_id: str | None = None,
    runner: RunnerFactory | None = None,
) -> InlineRun:
    """Process the next pending snapshot of ``source`` (or ``snapshot_id``) as one DAG run would.

    ``runner``: what runs each phase group's units (default: in this process, as
    :mod:`iceberg_cdc.pipeline.in_process` does for small groups).
    """
    ctx = steps.Context.of(config, source)
    run_id = run_id or f"inline__{uuid.uuid4().hex[:12]}"
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        run.seconds[name] = round(now - clock, 4)
        clock = now

    detected = steps.detect(ctx, run_id, snapshot_id)
    run = InlineRun(detected)
    lap("detect")
    try:
        if run.action in ("shuffle", "insert"):
            store = ctx.runtime.store()
            plan = SnapshotPlan.load(store, detected.plan)
            if run.action == "insert":
                run.units["insert"] = run_phase(ctx, plan, "insert", len(plan.groups), runner)
                lap("insert")
            else:
                run.units["write"] = run_phase(ctx, plan, "write", len(plan.groups), runner)
                lap("write")
                missing, failed = steps.missing_map_outputs(ctx, detected)
                if missing or failed:
                    raise CdcError(f"map outputs missing after the write phase: {missing}; failed: {failed}")
                lap("barrier")
                steps.coalesce(ctx, detected)
                lap("coalesce")
                run.units["read"] = run_phase(ctx, plan, "read", read_group_count(plan, store), runner)
                lap("read")
        run.committed = steps.commit(ctx, detected)
        lap("commit")
        run.watermark = steps.watermark(ctx, detected)
        lap("watermark")
    finally:
        run.cleanup = steps.cleanup(ctx, detected, run_id)
        lap("cleanup")
    return run


def run_until_caught_up(
    config: CdcConfig, source: str, *, limit: int = 10_000, runner: RunnerFactory | None = None
) -> list[InlineRun]:
    """Run snapshots of ``source`` one after another until nothing is pending; returns the runs that did work.

    A snapshot run twice in a row means the watermark did not move: that fails at once, not
    after ``limit`` runs (an hour of a test that looks hung).
    """
    runs: list[InlineRun] = []
    for _ in range(limit):
        run = run_snapshot(config, source, runner=runner)
        if run.action == "caught_up":
            return runs
        if runs and run.snapshot_id == runs[-1].snapshot_id:
            raise CdcError(
                f"{source}: snapshot {run.snapshot_id} ran again right after its own run "
                f"({runs[-1].action}, then {run.action}): the watermark did not move"
            )
        runs.append(run)
    raise CdcError(f"{source}: still not caught up after {limit} runs")

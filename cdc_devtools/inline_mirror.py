"""One mirror DAG run's steps in this process, in DAG order, without Airflow.

detect -> plan_apply -> (the Iceberg target's join tasks) -> apply, with cleanup
always last as the DAG's teardown. Used by the property tests, the fault
tests and the benchmark: the same step functions the DAG's tasks call;
tooling, so outside the ``iceberg_cdc`` the wheel ships.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from iceberg_cdc.config import CdcConfig
from iceberg_cdc.mirror import steps
from iceberg_cdc.mirror.postgres.target import Hook
from iceberg_cdc.mirror.targets import iceberg_steps
from iceberg_cdc.run.context import Context


@dataclass
class MirrorRun:
    detected: dict[str, Any]
    planned: dict[str, Any] = field(default_factory=dict)
    applied: dict[str, Any] = field(default_factory=dict)
    cleanup: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def action(self) -> str:
        return self.detected["action"]


def run_mirror(
    config: CdcConfig,
    source: str,
    mirror_name: str,
    *,
    run_id: str | None = None,
    hook: Hook | None = None,
) -> MirrorRun:
    """One run of the mirror's DAG: apply everything pending at once."""
    ctx = Context.of(config, source)
    mirror = ctx.table.mirror(mirror_name)
    run_id = run_id or f"inline__{uuid.uuid4().hex[:12]}"
    clock = time.perf_counter()
    detected = steps.detect(ctx, mirror, run_id)
    run = MirrorRun(detected)

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        run.seconds[name] = round(now - clock, 4)
        clock = now

    lap("detect")
    try:
        run.planned = steps.plan_apply(ctx, mirror, detected)
        lap("plan_apply")
        if run.planned.get("join_args"):  # the Iceberg target's Spark tasks, as plain functions
            iceberg_steps(mirror).run_units_inline(ctx.runtime, run.planned)
            lap("mirror_join")
        run.applied = steps.apply(ctx, mirror, detected, run.planned, hook=hook)
        lap("apply")
    finally:
        run.cleanup = steps.cleanup(ctx, mirror, detected, run_id, run.planned)
        lap("cleanup")
    return run

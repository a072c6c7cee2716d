"""DAG runs taken apart for fault tests: every step boundary is a place to fail, stall or meddle.

:func:`run_steps` runs one DAG run's steps in the DAG's order, in process
(the same step and unit functions Airflow and Spark run), and calls
``hook(point, state)`` at each named point; a hook may raise to make the run
fail there (cleanup then runs as the teardown would, unless the point is a
crash), or change storage to play another run or an operator.

:class:`Verdict` is the suite's judgement of a table after a case: every
snapshot of the source's history is in the sink exactly once, the replay
invariant holds per snapshot, and the sink folded from empty equals the
source's current rows -- counted as rows lost and rows duplicated.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc_devtools.inline_pipeline import SOURCE
from cdc_devtools.replay import ADDED, REMOVED, assert_replay, multiset
from iceberg_cdc.pipeline.groups import PHASE_FUNCTIONS, read_group_count, record_group, units_of
from iceberg_cdc.pipeline.plan import SnapshotPlan
from iceberg_cdc.run import steps
from iceberg_cdc.run.shuffle_steps import attempt_paths
from iceberg_cdc.sink.staging import list_staged
from iceberg_cdc.sink.table import SOURCE_SNAPSHOT_ID_KEY, summary_properties
from iceberg_cdc.source.history import current_ancestry

POINTS = (
    "after_detect",
    "after_write",
    "after_barrier",
    "after_coalesce",
    "after_read",
    "before_commit",
    "after_commit",
    "after_watermark",
)


class Crash(BaseException):
    """The worker died here: no teardown runs (a BaseException, so nothing swallows it)."""


@dataclass
class RunState:
    ctx: steps.Context
    run_id: str
    detected: Any = None
    plan: SnapshotPlan | None = None


Hook = Callable[[str, RunState], None]


def _phase(state: RunState, phase: str, groups: int) -> None:
    store = state.ctx.runtime.store()
    assert state.plan is not None
    for group in range(groups):
        done = [
            PHASE_FUNCTIONS[phase](state.plan, state.ctx.runtime, unit)
            for unit in units_of(phase, state.plan, group, store)
        ]
        record_group(store, state.plan, phase, group, 0.0, done)


def run_steps(
    ctx: steps.Context,
    run_id: str,
    *,
    hook: Hook | None = None,
    snapshot_id: int | None = None,
) -> RunState:
    """One DAG run, step by step; ``hook`` is called at each of :data:`POINTS`."""
    state = RunState(ctx, run_id)
    call = hook or (lambda point, state: None)
    state.detected = steps.detect(ctx, run_id, snapshot_id)
    crashed = False
    try:
        call("after_detect", state)
        action = state.detected.action
        if action in ("shuffle", "insert"):
            state.plan = SnapshotPlan.load(ctx.runtime.store(), state.detected.plan)
            if action == "insert":
                _phase(state, "insert", len(state.plan.groups))
                call("after_write", state)
                call("after_read", state)
            else:
                _phase(state, "write", len(state.plan.groups))
                call("after_write", state)
                steps.confirm_lease(ctx, state.detected)  # as the barrier sensor's poke does
                missing, failed = steps.missing_map_outputs(ctx, state.detected)
                assert not missing and not failed, (missing, failed)
                call("after_barrier", state)
                steps.coalesce(ctx, state.detected)
                call("after_coalesce", state)
                _phase(state, "read", read_group_count(state.plan, ctx.runtime.store()))
                call("after_read", state)
        call("before_commit", state)
        steps.commit(ctx, state.detected)
        call("after_commit", state)
        steps.watermark(ctx, state.detected)
        call("after_watermark", state)
    except Crash:
        crashed = True
        raise
    finally:
        if not crashed:
            steps.cleanup(ctx, state.detected, run_id)
    return state


def sink_commits(sink) -> Counter:
    """Source snapshot id -> how many sink snapshots carry its commit marker (appends only)."""
    counts: Counter = Counter()
    for snapshot in sink.snapshots():
        summary = summary_properties(snapshot)
        marker = summary.get(SOURCE_SNAPSHOT_ID_KEY)
        if marker is not None and summary.get("cdc.replace") != "true":
            counts[int(marker)] += 1
    return counts


@dataclass
class Verdict:
    """Rows lost and duplicated over the whole history, and per-snapshot commit counts."""

    lost: int
    duplicated: int
    commits: Counter
    snapshots: list[int]

    @property
    def exact(self) -> bool:
        return self.lost == 0 and self.duplicated == 0 and all(n <= 1 for n in self.commits.values())


def verdict(pipeline, identifier_columns=("id",)) -> Verdict:
    """Judge the pipeline's sink against its source: replay per snapshot, whole-history fold, commits."""
    source, sink = pipeline.source, pipeline.sink
    names = [f.name for f in source.schema().fields]
    ancestry = [s.snapshot_id for s in current_ancestry(source)]
    for snapshot_id in ancestry:
        assert_replay(source, sink, snapshot_id, list(identifier_columns) if identifier_columns else None)
    changes = sink.scan().to_arrow()
    kind = changes.column("_change_type")
    folded = multiset(changes.filter(pc.is_in(kind, pa.array(ADDED))), names)
    folded.subtract(multiset(changes.filter(pc.is_in(kind, pa.array(REMOVED))), names))
    expected = multiset(source.scan().to_arrow(), names)
    folded = +folded
    return Verdict(
        lost=sum((expected - folded).values()),
        duplicated=sum((folded - expected).values()),
        commits=sink_commits(sink),
        snapshots=ancestry,
    )


def attempt_staged(pipeline: Any, state: RunState) -> list[str]:
    """The staged files of ``state``'s attempt, committed or not."""
    attempt = attempt_paths(state.detected).attempt
    return sorted(
        f.path for f in list_staged(pipeline.sink.location(), state.detected.snapshot_id, attempt=attempt)
    )


def dead_attempt_with_its_commit_in_flight(pipeline: Any, monkeypatch: Any) -> tuple[steps.Context, RunState]:
    """A run whose process died inside the catalog call: marker up, staged files not yet committed.

    Returns once the dead run's lease has expired (the caller sets a short
    ``CDC_LEASE_TTL_SECONDS``), so the next run sweeps its namespace.
    """
    from iceberg_cdc.run import commit_step

    ctx = steps.Context.of(pipeline.config, SOURCE)
    captured: dict[str, RunState] = {}

    def died_in_the_call(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionResetError("the task died while the catalog call was on its way")

    with monkeypatch.context() as patched:
        patched.setattr(commit_step, "commit_changes", died_in_the_call)
        try:
            run_steps(ctx, "in-flight", hook=lambda at, state: captured.setdefault("state", state))
        except ConnectionResetError:
            pass
        else:
            raise AssertionError("the commit was meant to die in the catalog call")
    state = captured["state"]
    assert attempt_staged(pipeline, state), "the dead attempt staged files its commit would reference"
    lease = ctx.lease()
    deadline = time.monotonic() + 30
    while lease.held() is not None:
        assert time.monotonic() < deadline, "the dead run's lease did not expire"
        time.sleep(0.05)
    return ctx, state

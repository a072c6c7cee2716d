"""Random source histories keep an Iceberg mirror exactly equal to the source after every apply.

hypothesis drives a state machine over a real source table (SQLite catalog,
local files) with a random schema, key (``id`` or ``id, region``: then a
partition move changes the key) and partitioning, and one Iceberg mirror of
random format (v2: position delete files; v3: deletion vectors) and mode
(merge-on-read or copy-on-write). Its rules write snapshots as engines do
(copy-on-write MERGEs with value updates, partition moves, no-op updates,
deletes, new rows and re-inserts of deleted keys; appends) and apply the
net changes since the last apply at random points -- several snapshots at
once, or one -- through the mirror's own steps. Some applies are killed
after a step (plan, some or all join units, commit), crash without cleanup,
or have a join unit run twice (a Spark retry), and are then retried.

After every apply (and its retry): the mirror's rows, read by pyiceberg,
are exactly the source's rows at the apply's snapshot; no key is held twice;
every apply is committed at most once (its marker is in one snapshot); the
watermark is the last apply's. Rows deleted earlier are never deleted again:
the commit's conservation check refuses a delete that does not hold exactly
the old plus the new positions.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from cdc_devtools.inline_pipeline import SOURCE, InlinePipeline
from iceberg_cdc.mirror.iceberg import join, steps
from iceberg_cdc.mirror.iceberg.plan import ApplyPlan
from iceberg_cdc.mirror.iceberg.table import read_mirror_watermark, snapshot_marker
from tests.support.history import COLUMN_KINDS, HistoryShape, HistoryTable
from tests.support.mirror_harness import MirrorHarness, MirrorTarget

shapes = st.builds(
    HistoryShape,
    columns=st.lists(st.sampled_from(sorted(COLUMN_KINDS)), min_size=0, max_size=3).map(tuple),
    identifier=st.sampled_from([("id",), ("id",), ("id", "region")]),
    partitioning=st.sampled_from(["region", "bucket", "none"]),
)
seeds = st.integers(0, 2**32 - 1)
fractions = st.sampled_from([0.0, 0.1, 0.3, 1.0])
FAULTS = ("plan", "join", "join-partial", "commit", "crash-after-join", "unit-twice")


class MirrorHistory(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="cdc-mirror-"))
        self.applies = 0

    @initialize(
        shape=shapes,
        seed=seeds,
        n=st.integers(0, 40),
        format_version=st.sampled_from([2, 3]),
        mode=st.sampled_from(["merge-on-read", "merge-on-read", "copy-on-write"]),
    )
    def create(self, shape: HistoryShape, seed: int, n: int, format_version: int, mode: str) -> None:
        self.pipeline = InlinePipeline(self.tmp, shuffle={"write_task_size": "4KB"})
        self.history = HistoryTable(
            self.pipeline.create_source(shape.schema(), partition_spec=shape.spec()), shape
        )
        target = MirrorTarget("mirror.orders", mode=mode, format_version=format_version)
        self.harness = MirrorHarness(self.pipeline.config, SOURCE, target, shape.identifier)
        if n:
            self.history.append(random.Random(seed), n)

    @rule(seed=seeds, n=st.integers(1, 15))
    def append(self, seed: int, n: int) -> None:
        self.history.append(random.Random(seed), n)

    @rule(
        seed=seeds,
        update=fractions,
        move=fractions,
        noop=fractions,
        delete=fractions,
        inserts=st.integers(0, 6),
    )
    def merge(self, seed: int, update: float, move: float, noop: float, delete: float, inserts: int) -> None:
        rng = random.Random(seed)
        self.history.merge(
            rng,
            update=update,
            move=move,
            noop=noop,
            delete=delete,
            inserts=inserts,
            reinserts=rng.randint(0, 3),
        )

    def _apply(self, seed: int, fault: str | None) -> None:
        rng = random.Random(seed)
        state = self.history.state()
        head = self.history.table.current_snapshot()
        net = self.harness.net_changes(rng, state, head.snapshot_id if head else 0)
        if fault is None:
            self.harness.apply(net, state)
        else:
            self._apply_with_fault(net, fault)
            self.harness.apply(net, state)  # the retry: a new run, a new epoch
        self.applies += 1
        self.harness.assert_equal(state)
        mirror = self.harness.mirror()
        assert read_mirror_watermark(mirror) is not None
        assert read_mirror_watermark(mirror).ordinal == net.through.ordinal
        marked = [s for s in mirror.snapshots() if snapshot_marker(s) == read_mirror_watermark(mirror)]
        assert len(marked) <= 1, "an apply was committed twice"

    def _apply_with_fault(self, net, fault: str) -> None:
        harness = self.harness
        lease = harness.lease()
        run_id = f"faulty__{self.applies}__{fault}"
        info = lease.acquire(run_id, 300.0)
        staged = harness.stage(net, run_id, info.epoch)
        planned = steps.plan(harness.ctx, harness.target, staged)
        try:
            if fault == "plan":
                return
            if fault == "join-partial" and planned.get("action") == "apply":
                plan = ApplyPlan.load(harness.ctx.runtime.store(), planned["plan"])
                if plan.units:
                    join.run_mirror_join_task(plan, harness.ctx.runtime, plan.units[0].unit_id)
                return
            steps.run_units_inline(harness.ctx.runtime, planned)
            if fault == "unit-twice":
                steps.run_units_inline(
                    harness.ctx.runtime, planned
                )  # every unit again: new files, new records
                steps.commit(harness.ctx, harness.target, planned)
                return
            if fault in ("join", "crash-after-join"):
                return
            steps.commit(harness.ctx, harness.target, planned)  # fault == "commit": dies after it
        finally:
            if fault != "crash-after-join":
                steps.cleanup(harness.ctx, harness.target, planned)
                lease.release(run_id, info.epoch)
            else:  # the worker died: no cleanup, the lease expires (taken over here at once)
                lease.release(run_id, info.epoch)

    @rule(seed=seeds)
    def apply(self, seed: int) -> None:
        self._apply(seed, None)

    @rule(seed=seeds, fault=st.sampled_from(FAULTS))
    def apply_with_fault(self, seed: int, fault: str) -> None:
        self._apply(seed, fault)

    @invariant()
    def mirror_never_ahead(self) -> None:
        if self.applies:
            assert read_mirror_watermark(self.harness.mirror()).ordinal == self.harness.ordinal

    def teardown(self) -> None:
        try:
            if getattr(self, "harness", None) is not None:
                self._apply(0, None)
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)


MirrorHistory.TestCase.settings = settings(
    max_examples=int(os.environ.get("CDC_MIRROR_HISTORIES", "40")),
    stateful_step_count=10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestMirrorHistories = MirrorHistory.TestCase

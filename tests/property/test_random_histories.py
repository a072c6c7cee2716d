"""Random copy-on-write histories, each snapshot checked by the replay invariant.

hypothesis drives a state machine over a real Iceberg table (SQLite catalog,
local files) with a random schema, identifier mode and partitioning. Its
rules write snapshots the way engines do (see :mod:`tests.support.history`)
and, at random points, run the pipeline in process until it has caught up.
After every run:

* each processed snapshot satisfies the replay invariant against the real
  table states (and UPDATE pairs per key, no key both deleted and inserted);
* ``replace`` snapshots add no rows; rolled-back snapshots are never processed;
* whichever way carryover is cancelled before the shuffle (in memory,
  spilled to hash buckets, one task per partition, file by file, or not at
  all: :data:`CANCEL_CONFIG`), the changes are the same;
* the watermark is the current snapshot, and every snapshot of the current
  ancestry was committed at most once;

and at the end of each history the whole sink, folded from empty, equals the
table's current state.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from cdc_devtools.inline_pipeline import CANCEL_CONFIG, CANCEL_MODES, InlinePipeline
from cdc_devtools.replay import ADDED, REMOVED, assert_replay, changes_of, multiset
from iceberg_cdc.source.history import current_ancestry
from tests.support.history import COLUMN_KINDS, HistoryShape, HistoryTable

shapes = st.builds(
    HistoryShape,
    columns=st.lists(st.sampled_from(sorted(COLUMN_KINDS)), min_size=0, max_size=4).map(tuple),
    identifier=st.sampled_from([("id",), ("id",), ("id", "region"), ()]),
    partitioning=st.sampled_from(["region", "bucket", "none"]),
)
seeds = st.integers(0, 2**32 - 1)
RUN_ACTIONS: Counter = Counter()  # what the processed snapshots were, over the whole test (for -s output)
fractions = st.sampled_from([0.0, 0.05, 0.2, 0.5, 1.0])


class RandomHistory(RuleBasedStateMachine):
    """One random table history; the pipeline catches up at random points and at the end."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="cdc-history-"))
        self.history: HistoryTable | None = None
        self.rolled_back: set[int] = set()
        self.processed: list[int] = []

    @initialize(
        shape=shapes,
        seed=seeds,
        n=st.integers(0, 40),
        partitions=st.sampled_from([1, 3, 8]),
        cancel=st.sampled_from(CANCEL_MODES),
    )
    def create(self, shape: HistoryShape, seed: int, n: int, partitions: int, cancel: str) -> None:
        self.pipeline = InlinePipeline(
            self.tmp,
            shuffle={"partitions": partitions, "target_partition_size": "2KB", **CANCEL_CONFIG[cancel]},
        )
        table = self.pipeline.create_source(shape.schema(), partition_spec=shape.spec())
        self.history = HistoryTable(table, shape)
        if n:
            self.history.append(random.Random(seed), n)
            # Whole-row tables start with copies of some rows (a rewrite then removes and adds a row
            # several times: carryover by multiplicity, before and after the shuffle).
            self.history.append(random.Random(seed + 1), 0, duplicates=3)

    # -- snapshots ---------------------------------------------------------------------------------

    @rule(seed=seeds, n=st.integers(1, 20), duplicates=st.integers(0, 3))
    def append(self, seed: int, n: int, duplicates: int) -> None:
        self.history.append(random.Random(seed), n, duplicates)

    @rule(
        seed=seeds,
        update=fractions,
        move=fractions,
        noop=fractions,
        delete=fractions,
        inserts=st.integers(0, 5),
        reinserts=st.integers(0, 3),
    )
    def merge(self, seed, update, move, noop, delete, inserts, reinserts) -> None:
        delete = min(delete, 1.0 - update)
        self.history.merge(
            random.Random(seed),
            update=update,
            move=move,
            noop=noop,
            delete=delete,
            inserts=inserts,
            reinserts=reinserts,
        )

    @rule(seed=seeds)
    def noop_rewrite(self, seed: int) -> None:
        self.history.noop_rewrite(random.Random(seed))

    @rule(seed=seeds)
    def dedupe(self, seed: int) -> None:
        self.history.dedupe(random.Random(seed))

    @rule(seed=seeds, updates=st.integers(0, 5), inserts=st.integers(0, 3))
    def upsert(self, seed: int, updates: int, inserts: int) -> None:
        self.history.upsert(random.Random(seed), updates, inserts)

    @rule(seed=seeds, count=st.integers(1, 5), inserts=st.integers(0, 3))
    def overwrite_where(self, seed: int, count: int, inserts: int) -> None:
        self.history.overwrite_where(random.Random(seed), count, inserts)

    @rule(seed=seeds, count=st.integers(1, 5))
    def delete_where(self, seed: int, count: int) -> None:
        self.history.delete_where(random.Random(seed), count)

    @rule()
    def compact(self) -> None:
        self.history.compact()

    @rule(seed=seeds)
    def rollback(self, seed: int) -> None:
        rolled = self.history.rollback(random.Random(seed))
        if rolled is not None:
            self.rolled_back.add(rolled)

    # -- the pipeline -------------------------------------------------------------------------------

    @rule()
    def process(self) -> None:
        source = self.history.table
        identifier = list(self.history.shape.identifier) or None
        for run in self.pipeline.catch_up():
            snapshot_id = run.snapshot_id
            assert snapshot_id not in self.rolled_back, f"rolled-back snapshot {snapshot_id} processed"
            assert snapshot_id not in self.processed, f"snapshot {snapshot_id} processed twice"
            self.processed.append(snapshot_id)
            RUN_ACTIONS[run.action] += 1
            RUN_ACTIONS["rows cancelled before the shuffle"] += run.committed.get("cancelled_rows", 0)
            RUN_ACTIONS["rows cancelled by row lineage"] += sum(
                u.get("cancelled_by_lineage", 0) for u in run.units.get("write", [])
            )
            RUN_ACTIONS["cancel groups spilled"] += sum(
                u.get("cancel_spilled_groups", 0) for u in run.units.get("write", [])
            )
            sink = self.pipeline.sink
            if run.action == "skip":
                assert changes_of(sink, snapshot_id).num_rows == 0
                continue
            assert_replay(source, sink, snapshot_id, identifier)
        source.refresh()
        current = source.current_snapshot()
        mark = self.pipeline.watermark()
        if current is not None:
            assert mark is not None and mark.snapshot_id == current.snapshot_id
            ancestry = {s.snapshot_id for s in current_ancestry(source)}
            assert set(self.processed) == ancestry, "every snapshot of the current ancestry, once"

    @invariant()
    def commits_are_unique(self) -> None:
        if self.history is None or not self.pipeline.catalog.table_exists("shop.orders_changes"):
            return
        markers = Counter(
            s.summary.additional_properties.get("cdc.source-snapshot-id")
            for s in self.pipeline.sink.snapshots()
        )
        markers.pop(None, None)
        assert all(n == 1 for n in markers.values()), f"a source snapshot committed twice: {markers}"

    def teardown(self) -> None:
        try:
            if self.history is not None:
                self.process()
                self._check_whole_sink()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _check_whole_sink(self) -> None:
        """All changes ever committed, applied to an empty table, give the current state."""
        state = self.history.state()
        names = state.schema.names
        if not self.pipeline.catalog.table_exists("shop.orders_changes"):
            assert state.num_rows == 0
            return
        changes = self.pipeline.sink.scan().to_arrow()
        kind = changes.column("_change_type")
        folded = multiset(changes.filter(pc.is_in(kind, pa.array(ADDED))), names)
        folded.subtract(multiset(changes.filter(pc.is_in(kind, pa.array(REMOVED))), names))
        assert +folded == multiset(state, names)
        assert not -folded, "more rows removed than ever added"


# 200 histories of up to 6 steps in make test (a few minutes beside the end-to-end tests);
# CDC_HISTORIES=2000 for a deeper search before a release.
RandomHistory.TestCase.settings = settings(
    max_examples=int(os.environ.get("CDC_HISTORIES", "200")),
    stateful_step_count=6,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestRandomHistories = RandomHistory.TestCase


# Whole-row tables with duplicate rows, through every cancel mode: copies appended, a dedup rewrite
# (k DELETEs + 1 or 2 INSERTs of one row), rewrites and MERGEs; the multiset rule decides every snapshot.
@settings(max_examples=max(1, int(os.environ.get("CDC_HISTORIES", "200")) // 5), deadline=None)
@given(
    seed=seeds,
    n=st.integers(1, 30),
    copies=st.integers(1, 6),
    cancel=st.sampled_from(CANCEL_MODES),
    partitioning=st.sampled_from(["region", "none"]),
    steps=st.lists(
        st.sampled_from(["dedupe", "merge", "noop_rewrite", "append copies"]), min_size=1, max_size=4
    ),
)
def test_whole_row_tables_with_duplicate_rows(seed, n, copies, cancel, partitioning, steps):
    tmp = Path(tempfile.mkdtemp(prefix="cdc-duplicates-"))
    try:
        rng = random.Random(seed)
        pipeline = InlinePipeline(
            tmp, shuffle={"partitions": 3, "target_partition_size": "2KB", **CANCEL_CONFIG[cancel]}
        )
        shape = HistoryShape(columns=("string", "double"), identifier=(), partitioning=partitioning)
        history = HistoryTable(pipeline.create_source(shape.schema(), partition_spec=shape.spec()), shape)
        history.append(rng, n)
        history.append(rng, 0, duplicates=copies)
        for step in ["dedupe", *steps]:
            if step == "dedupe":
                history.dedupe(rng)
            elif step == "merge":
                history.merge(rng, update=0.3, move=0.3, noop=0.3, delete=0.1, inserts=1, reinserts=0)
            elif step == "noop_rewrite":
                history.noop_rewrite(rng)
            else:
                history.append(rng, 1, duplicates=copies)
        for run in pipeline.catch_up():
            RUN_ACTIONS[f"duplicates: {run.action}"] += 1
            if run.action != "skip":
                assert_replay(history.table, pipeline.sink, run.snapshot_id, None)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

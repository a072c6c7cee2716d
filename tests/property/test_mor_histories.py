"""Random merge-on-read histories, each snapshot checked by the replay invariant.

Like :mod:`tests.property.test_random_histories`, but the source's row-level
changes are merge-on-read: Spark's position deletes (deletes, updates that may
move a row to another partition, a delete of an already-deleted row), Flink's
equality-delete upserts (keys absent from the table, a row inserted and
deleted within one commit), copy-on-write rewrites of files with live
deletes, compactions that drop every delete file, re-inserts of deleted
keys, and an upgrade to format v3 part-way, after which position deletes are
deletion vectors (merging the file's earlier deletes, replacing its earlier
DV, dangling or removed when a rewrite drops their file) and row lineage
(rewritten rows keep ``_row_id`` and sequence number: carryover cancels by
lineage before the shuffle; rows from before the upgrade fall back to values),
whichever way carryover is cancelled before the shuffle. The states the
replay checks against come from the tests' own merge-on-read reader
(:mod:`cdc_devtools.mor_state`, with its own manifest reading and delete
application), not the pipeline's; the histories pick live rows with it too.
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
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from cdc_devtools.inline_pipeline import CANCEL_CONFIG, CANCEL_MODES, InlinePipeline
from cdc_devtools.replay import ADDED, REMOVED, assert_replay, changes_of, multiset
from iceberg_cdc.source.history import current_ancestry
from tests.support.history import COLUMN_KINDS, HistoryShape
from tests.support.mor_history import MorHistory

shapes = st.builds(
    HistoryShape,
    columns=st.lists(st.sampled_from(sorted(COLUMN_KINDS)), min_size=0, max_size=3).map(tuple),
    identifier=st.sampled_from([("id",), ("id", "region")]),
    partitioning=st.sampled_from(["region", "bucket", "none"]),
)
seeds = st.integers(0, 2**32 - 1)
fractions = st.sampled_from([0.0, 0.1, 0.3, 1.0])
RUN_ACTIONS: Counter = Counter()


class MorRandomHistory(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="cdc-mor-history-"))
        self.history: MorHistory | None = None
        self.formats = "v2"
        self.processed: list[int] = []

    @initialize(
        shape=shapes,
        seed=seeds,
        n=st.integers(1, 30),
        partitions=st.sampled_from([1, 3]),
        formats=st.sampled_from(["v2", "v3", "v2 then v3"]),
        cancel=st.sampled_from(CANCEL_MODES),
    )
    def create(
        self, shape: HistoryShape, seed: int, n: int, partitions: int, formats: str, cancel: str
    ) -> None:
        self.formats = formats
        self.pipeline = InlinePipeline(
            self.tmp,
            shuffle={"partitions": partitions, "target_partition_size": "2KB", **CANCEL_CONFIG[cancel]},
        )
        table = self.pipeline.create_source(
            shape.schema(), partition_spec=shape.spec(), properties={"format-version": "2"}
        )
        self.history = MorHistory(table, shape)
        self.history.append(random.Random(seed), n)
        if formats == "v3":
            self.history.upgrade_to_v3()

    @rule(seed=seeds, n=st.integers(1, 10))
    def append(self, seed: int, n: int) -> None:
        self.history.append(random.Random(seed), n)

    @rule(seed=seeds, fraction=fractions, again=st.booleans())
    def spark_delete(self, seed: int, fraction: float, again: bool) -> None:
        self.history.spark_delete(random.Random(seed), fraction, again)

    @rule(seed=seeds, fraction=fractions, move=fractions)
    def spark_update(self, seed: int, fraction: float, move: float) -> None:
        self.history.spark_update(random.Random(seed), fraction, move)

    @rule(
        seed=seeds,
        updates=st.integers(0, 5),
        absent=st.integers(0, 2),
        inserts=st.integers(0, 3),
        transient=st.booleans(),
    )
    def flink_upsert(self, seed: int, updates: int, absent: int, inserts: int, transient: bool) -> None:
        self.history.flink_upsert(random.Random(seed), updates, absent, inserts, transient)

    @rule(seed=seeds, fraction=fractions, drop_dvs=st.booleans())
    def cow_merge(self, seed: int, fraction: float, drop_dvs: bool) -> None:
        self.history.cow_merge(random.Random(seed), fraction, drop_dvs)

    @precondition(lambda self: self.formats == "v2 then v3" and not self.history.v3)
    @rule()
    def upgrade_to_v3(self) -> None:
        self.history.upgrade_to_v3()

    @rule()
    def compact(self) -> None:
        self.history.compact()

    @rule(seed=seeds, count=st.integers(1, 3))
    def reinsert(self, seed: int, count: int) -> None:
        self.history.reinsert(random.Random(seed), count)

    @rule()
    def process(self) -> None:
        source = self.history.table
        identifier = list(self.history.shape.identifier)
        for run in self.pipeline.catch_up():
            assert run.snapshot_id not in self.processed, f"snapshot {run.snapshot_id} processed twice"
            self.processed.append(run.snapshot_id)
            RUN_ACTIONS[run.action] += 1
            RUN_ACTIONS["rows cancelled before the shuffle"] += run.committed.get("cancelled_rows", 0)
            RUN_ACTIONS["rows cancelled by row lineage"] += sum(
                u.get("cancelled_by_lineage", 0) for u in run.units.get("write", [])
            )
            RUN_ACTIONS["cancel groups spilled"] += sum(
                u.get("cancel_spilled_groups", 0) for u in run.units.get("write", [])
            )
            RUN_ACTIONS[f"format v{source.metadata.format_version}"] += 1
            if run.action == "skip":
                assert changes_of(self.pipeline.sink, run.snapshot_id).num_rows == 0
                continue
            assert_replay(source, self.pipeline.sink, run.snapshot_id, identifier)
        source.refresh()
        current = source.current_snapshot()
        assert self.pipeline.watermark().snapshot_id == current.snapshot_id
        assert set(self.processed) == {s.snapshot_id for s in current_ancestry(source)}

    def teardown(self) -> None:
        try:
            if self.history is not None:
                self.process()
                RUN_ACTIONS["deletion vectors"] += self.history.deletion_vectors
                state = self.history.state()
                names = state.schema.names
                changes = self.pipeline.sink.scan().to_arrow()
                kind = changes.column("_change_type")
                folded = multiset(changes.filter(pc.is_in(kind, pa.array(ADDED))), names)
                folded.subtract(multiset(changes.filter(pc.is_in(kind, pa.array(REMOVED))), names))
                assert +folded == multiset(state, names), "the whole sink does not fold to the table"
                assert not -folded, "more rows removed than ever added"
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)


# 60 histories of up to 6 steps in make test; CDC_HISTORIES=600 for a deeper search.
MorRandomHistory.TestCase.settings = settings(
    max_examples=max(1, int(os.environ.get("CDC_HISTORIES", "200")) * 3 // 10),
    stateful_step_count=6,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestMorRandomHistories = MorRandomHistory.TestCase


def test_rows_deleted_before_their_manifest_was_rewritten_are_not_removed_again(tmp_path):
    """A kept file's entry carried into a rewritten manifest keeps its old sequence number.

    Deterministic, as the random histories reach it only rarely: a position
    delete of row 2, then a rewrite of the *other* file of the same manifest
    (the kept file's entry becomes EXISTING in a new manifest), then a delete
    naming rows 2 (again, as Spark may) and 3. Only row 3 is a change: a
    reader that gave the EXISTING entry the new manifest's sequence number
    would find the old delete no longer applying and remove row 2 twice.
    """
    from pyiceberg.table.snapshots import Operation

    from cdc_devtools.cow import cow_merge
    from cdc_devtools.mor import commit_row_delta, mor_merge, position_delete_file
    from cdc_devtools.mor_state import live_files
    from cdc_devtools.orders import BY_REGION, SCHEMA, rows

    pipeline = InlinePipeline(tmp_path)
    source = pipeline.create_source(SCHEMA, partition_spec=BY_REGION, properties={"format-version": "2"})
    source.append(pa.concat_tables([rows(range(10), "us"), rows(range(10, 20), "eu")]))
    mor_merge(source, delete_keys=[2], deletes="position")
    cow_merge(source, upserts=rows([10], "eu", status="changed"))  # rewrites the eu file only
    (us,) = [
        (e, r)
        for e, r, _ in live_files(source, source.current_snapshot().snapshot_id)
        if 0 in r["id"].to_pylist()
    ]
    entry, file_rows = us
    assert entry.status == 0, "the us file is an EXISTING entry of the rewritten manifest"
    ids = file_rows.column("id").to_pylist()
    again = commit_row_delta(
        source,
        add=[position_delete_file(source, entry.data_file, [ids.index(2), ids.index(3)])],
        operation=Operation.DELETE,
    )
    for run in pipeline.catch_up():
        assert_replay(source, pipeline.sink, run.snapshot_id, ["id"])
    assert assert_replay(source, pipeline.sink, again, ["id"]) == Counter({"DELETE": 1})

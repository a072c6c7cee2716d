"""Random histories with a PostgreSQL mirror: equal to the source after every mirror run.

The changelog's own random-history machines (copy-on-write:
:mod:`tests.property.test_random_histories`; merge-on-read, v2 and v3:
:mod:`tests.property.test_mor_histories`) gain a PostgreSQL mirror on a real
server and a rule that runs it (after catching the changelog up, or without:
then the mirror applies whatever the changelog holds). The copy-on-write
machine also changes the source's schema: columns added, widened
(``int -> long``) and dropped. After every mirror run, and at the end of each
history, the mirror must hold exactly the source's rows at the mirror's
watermark (:mod:`cdc_devtools.mirror_check`), and its watermark must be the
changelog's. Every changelog check of the parent machines still runs.
"""

from __future__ import annotations

import os
import random
import uuid

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule
from pyiceberg.types import LongType

from cdc_devtools.mirror_check import assert_mirror_exact
from tests.property.test_mor_histories import MorRandomHistory
from tests.property.test_random_histories import RandomHistory
from tests.support.history import COLUMN_KINDS, HistoryShape, HistoryTable, _longs
from tests.support.mirror_pipeline import MirrorPipeline
from tests.support.mor_history import MorHistory

SERVER: dict[str, str] = {}
seeds = st.integers(0, 2**32 - 1)
keyed_shapes = st.builds(
    HistoryShape,
    columns=st.lists(st.sampled_from(sorted(COLUMN_KINDS)), min_size=0, max_size=4).map(tuple),
    identifier=st.sampled_from([("id",), ("id",), ("id", "region")]),
    partitioning=st.sampled_from(["region", "bucket", "none"]),
)


@pytest.fixture(scope="module", autouse=True)
def _postgres(postgres_server):
    SERVER["dsn"] = postgres_server.dsn
    yield
    SERVER.clear()


class EvolvingHistory(HistoryTable):
    """A history whose table also changes schema: added, widened and dropped columns."""

    added = 0
    evolved = False

    def rows(self, rng: random.Random, ids: list[int], regions: list[str] | None = None) -> pa.Table:
        n = len(ids)
        columns: dict[str, list] = {}
        for name in self.arrow_schema.names:
            if name == "id":
                columns[name] = ids
            elif name == "region":
                columns[name] = (
                    regions if regions is not None else [rng.choice(["us", "eu", "ap"]) for _ in range(n)]
                )
            elif name.startswith("x"):
                columns[name] = _longs(rng, n)
            else:
                columns[name] = COLUMN_KINDS[name.split("_", 1)[1]].values(rng, n)
        return pa.Table.from_pydict(columns, schema=self.arrow_schema)

    def state(self) -> pa.Table:
        """The current rows in the current schema (a scan reads in its snapshot's schema)."""
        state = super().state()
        columns = [
            state.column(f.name).cast(f.type)
            if f.name in state.column_names
            else pa.nulls(state.num_rows, f.type)
            for f in self.arrow_schema
        ]
        return pa.Table.from_arrays(columns, schema=self.arrow_schema)

    def evolve(self, rng: random.Random, change: str) -> None:
        schema = self.table.schema()
        data = [f for f in schema.fields if f.name not in ("id", "region")]
        ints = [f for f in data if isinstance(f.field_type, type(COLUMN_KINDS["int"].iceberg(lambda: 0)))]
        with self.table.update_schema() as update:
            if change == "widen" and ints:
                update.update_column(rng.choice(ints).name, LongType())
            elif change == "drop" and data:
                update.delete_column(rng.choice(data).name)
            else:
                update.add_column(f"x{self.added}", LongType())
                self.added += 1
        self.table.refresh()
        self.arrow_schema = self.table.schema().as_arrow()
        self.evolved = True
        # A snapshot in the new schema right away: pyiceberg scans (and its upsert) read in the
        # current snapshot's schema.
        self.append(rng, 1)


class _MirrorRules:
    """The mirror rule and the final check, shared by both machines."""

    pipeline: MirrorPipeline

    def _new_pipeline(self, partitions: int) -> MirrorPipeline:
        return MirrorPipeline(
            self.tmp,
            SERVER["dsn"],
            f"h_{uuid.uuid4().hex[:12]}",
            shuffle={"partitions": partitions, "target_partition_size": "2KB"},
        )

    def _mirror_and_check(self) -> None:
        run = self.pipeline.mirror()
        verdict = assert_mirror_exact(self.history.table, self.pipeline.target)
        mark = self.pipeline.watermark()
        if mark is not None:
            assert verdict.mark is not None and verdict.mark.source_snapshot_id == mark.snapshot_id, (
                f"mirror at {verdict.mark} after its run ({run.action}), the changelog at {mark}"
            )

    def _final(self) -> None:
        if self.history is not None:
            self.process()
            self._mirror_and_check()


class MirroredCowHistory(_MirrorRules, RandomHistory):
    @initialize(shape=keyed_shapes, seed=seeds, n=st.integers(0, 40), partitions=st.sampled_from([1, 3, 8]))
    def create(self, shape: HistoryShape, seed: int, n: int, partitions: int) -> None:
        self.pipeline = self._new_pipeline(partitions)
        table = self.pipeline.create_source(shape.schema(), partition_spec=shape.spec())
        self.history = EvolvingHistory(table, shape)
        if n:
            self.history.append(random.Random(seed), n)

    @rule(seed=seeds, change=st.sampled_from(["add", "widen", "drop"]))
    def evolve(self, seed: int, change: str) -> None:
        self.history.evolve(random.Random(seed), change)

    @rule()
    def process(self) -> None:
        """The parent's checks while the schema is the first one; after a change, catch up only.

        The replay checker compares snapshots in the current schema; the changelog's schema
        evolution has its own tests (tests/integration/test_types_and_evolution.py).
        """
        if not self.history.evolved:
            super().process()
            return
        for run in self.pipeline.catch_up():
            assert run.snapshot_id not in self.processed, f"snapshot {run.snapshot_id} processed twice"
            self.processed.append(run.snapshot_id)

    @rule(catch_up=st.booleans())
    def mirror(self, catch_up: bool) -> None:
        if catch_up:
            self.process()
        self._mirror_and_check()

    def teardown(self) -> None:
        try:
            self._final()
        finally:
            super().teardown()


class MirroredMorHistory(_MirrorRules, MorRandomHistory):
    @initialize(
        shape=keyed_shapes,
        seed=seeds,
        n=st.integers(1, 30),
        partitions=st.sampled_from([1, 3]),
        formats=st.sampled_from(["v2", "v3", "v2 then v3"]),
    )
    def create(self, shape: HistoryShape, seed: int, n: int, partitions: int, formats: str) -> None:
        self.formats = formats
        self.pipeline = self._new_pipeline(partitions)
        table = self.pipeline.create_source(
            shape.schema(), partition_spec=shape.spec(), properties={"format-version": "2"}
        )
        self.history = MorHistory(table, shape)
        self.history.append(random.Random(seed), n)
        if formats == "v3":
            self.history.upgrade_to_v3()

    @precondition(lambda self: self.history is not None)
    @rule(catch_up=st.booleans())
    def mirror(self, catch_up: bool) -> None:
        if catch_up:
            self.process()
        self._mirror_and_check()

    def teardown(self) -> None:
        try:
            self._final()
        finally:
            super().teardown()


_SETTINGS = dict(
    stateful_step_count=7,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# 10 copy-on-write and 6 merge-on-read histories in make test (each runs PostgreSQL applies);
# CDC_HISTORIES scales them (default 200; CDC_HISTORIES=2000: 100 and 62).
_SCALE = int(os.environ.get("CDC_HISTORIES", "200"))
MirroredCowHistory.TestCase.settings = settings(max_examples=max(1, _SCALE // 20), **_SETTINGS)
MirroredMorHistory.TestCase.settings = settings(max_examples=max(1, _SCALE // 32), **_SETTINGS)
TestMirroredCowHistories = MirroredCowHistory.TestCase
TestMirroredMorHistories = MirroredMorHistory.TestCase

"""An apply whose mirror changed after planning commits nothing, and the next run applies exactly.

In process (the mirror's steps, SQLite catalog, local files). Between plan
and commit someone else commits to the mirror: the delete positions the join
found may be stale, so the commit refuses (``MirrorStateError``) and leaves
mirror and watermark as they were; the next run plans on the new state. A
run that lost its lease after planning (another run took the mirror over)
cannot commit either.
"""

from __future__ import annotations

import random
import time

import pytest
from pyiceberg.table.snapshots import Operation

from cdc_devtools.inline_pipeline import SOURCE, InlinePipeline
from iceberg_cdc.errors import LeaseLostError, MirrorStateError
from iceberg_cdc.mirror.iceberg import steps
from iceberg_cdc.mirror.iceberg.table import read_mirror_watermark
from iceberg_cdc.pyiceberg_internals.data_writer import write_data_files
from iceberg_cdc.pyiceberg_internals.format_v3 import writing_v3_metadata
from iceberg_cdc.pyiceberg_internals.row_delta import RowDelta
from tests.support.history import HistoryShape, HistoryTable
from tests.support.mirror_harness import MirrorHarness, MirrorTarget

SHAPE = HistoryShape(columns=("string",), identifier=("id",), partitioning="region")


def _setup(tmp_path, version: int):
    pipeline = InlinePipeline(tmp_path)
    history = HistoryTable(pipeline.create_source(SHAPE.schema(), partition_spec=SHAPE.spec()), SHAPE)
    harness = MirrorHarness(
        pipeline.config, SOURCE, MirrorTarget("mirror.orders", format_version=version), ("id",)
    )
    rng = random.Random(version)
    history.append(rng, 30)
    state = history.state()
    harness.apply(harness.net_changes(rng, state, history.table.current_snapshot().snapshot_id), state)
    history.merge(rng, update=0.5, move=0.3, noop=0.0, delete=0.2, inserts=3, reinserts=0)
    return history, harness, rng


def _foreign_append(table, rows) -> None:
    """A commit the applies did not make (pyiceberg's append cannot write v3: the door's writer can)."""
    files = write_data_files(
        table.io, table.metadata, rows.cast(table.schema().as_arrow()), table.location() + "/data/x"
    )
    with writing_v3_metadata():
        tx = table.transaction()
        head = table.current_snapshot().snapshot_id
        RowDelta(
            tx, base_snapshot_id=head, add=files, remove={}, operation=Operation.APPEND, properties={}
        ).commit()
        tx.commit_transaction()


@pytest.mark.parametrize("version", [2, 3])
def test_a_commit_on_a_moved_mirror_is_refused_then_redone(tmp_path, version):
    history, harness, rng = _setup(tmp_path, version)
    state = history.state()
    net = harness.net_changes(rng, state, history.table.current_snapshot().snapshot_id)
    lease = harness.lease()
    held = lease.acquire("planned-run", 300.0)
    planned = steps.plan(harness.ctx, harness.target, harness.stage(net, "planned-run", held.epoch))
    steps.run_units_inline(harness.ctx.runtime, planned)
    mirror = harness.mirror()
    before = mirror.current_snapshot().snapshot_id
    _foreign_append(mirror, mirror.scan().to_arrow().slice(0, 1))  # another writer moves main
    moved = harness.mirror().current_snapshot().snapshot_id
    with pytest.raises(MirrorStateError, match="planned on"):
        steps.commit(harness.ctx, harness.target, planned)
    assert harness.mirror().current_snapshot().snapshot_id == moved != before
    assert read_mirror_watermark(harness.mirror()).ordinal == net.through.ordinal - 1
    steps.cleanup(harness.ctx, harness.target, planned)
    lease.release("planned-run", held.epoch)
    # undo the foreign row the way an operator would (the mirror is the apply's alone), then rerun
    with writing_v3_metadata():
        harness.mirror().manage_snapshots().rollback_to_snapshot(before).commit()
    harness.apply(net, state)
    harness.assert_equal(state)


def test_a_run_that_lost_its_lease_cannot_commit(tmp_path):
    history, harness, rng = _setup(tmp_path, 2)
    state = history.state()
    net = harness.net_changes(rng, state, history.table.current_snapshot().snapshot_id)
    lease = harness.lease()
    held = lease.acquire("slow-run", 0.5)
    planned = steps.plan(
        harness.ctx, harness.target, {**harness.stage(net, "slow-run", held.epoch), "lease_ttl": 0.5}
    )
    steps.run_units_inline(harness.ctx.runtime, planned)
    time.sleep(1.0)
    taker = harness.lease().acquire("taker", 300.0)  # the expired lease is taken over
    with pytest.raises(LeaseLostError):
        steps.commit(harness.ctx, harness.target, planned)
    assert read_mirror_watermark(harness.mirror()).ordinal == net.through.ordinal - 1
    harness.lease().release("taker", taker.epoch)
    harness.apply(net, state)
    harness.assert_equal(state)

"""Row lineage on format-v3 tables: the planner's ids agree with the spec, carryover cancels by lineage.

The tables are written by the tests' v3 writers (:mod:`cdc_devtools.row_lineage`:
copied rows keep ``_row_id`` and sequence number as columns, updated rows
their ``_row_id``), and read back by the devtools' own row-by-row reader, apart
from the pipeline's (:mod:`iceberg_cdc.source.lineage`).
"""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pytest

from cdc_devtools.inline_pipeline import InlinePipeline
from cdc_devtools.replay import assert_replay
from cdc_devtools.row_lineage import inherited_first_row_ids, row_lineage
from iceberg_cdc.source.changes import snapshot_changes
from iceberg_cdc.source.lineage import LineageFiller, with_lineage
from iceberg_cdc.source.reading import read_data_file
from tests.support.history import HistoryShape
from tests.support.mor_history import MorHistory


def v3_history(
    tmp_path: Path, identifier: tuple[str, ...] = ("id",), *, upgrade_first: bool = True, **shuffle
):
    shape = HistoryShape(columns=("string", "double"), identifier=identifier, partitioning="region")
    pipeline = InlinePipeline(tmp_path, shuffle={"partitions": 4, "target_partition_size": "2KB", **shuffle})
    table = pipeline.create_source(
        shape.schema(), partition_spec=shape.spec(), properties={"format-version": "2"}
    )
    history = MorHistory(table, shape)
    if upgrade_first:
        history.upgrade_to_v3()
    history.append(random.Random(1), 60)
    return pipeline, history


def test_the_planner_inherits_first_row_ids_as_the_spec_says(tmp_path: Path):
    _, history = v3_history(tmp_path)
    history.append(random.Random(2), 30)
    [snapshot] = history.cow_merge(random.Random(3), 0.3)
    table = history.table
    parent = table.snapshot_by_id(snapshot).parent_snapshot_id
    changes = snapshot_changes(table, snapshot)
    before, after = inherited_first_row_ids(table, parent), inherited_first_row_ids(table, snapshot)
    assert changes.deleted and changes.added
    for ref in changes.deleted:
        assert ref.first_row_id == before[ref.path] is not None
    for ref in changes.added:
        assert ref.first_row_id == after[ref.path] is not None
        assert ref.sequence_number == table.snapshot_by_id(snapshot).sequence_number
    # Every row of the snapshot's files, as the write task reads it, carries the devtools' lineage.
    expected = {**row_lineage(table, parent), **row_lineage(table, snapshot)}
    for ref in (*changes.deleted, *changes.added):
        filler = LineageFiller(ref.first_row_id, ref.sequence_number)
        rows = pa.Table.from_batches(
            filler.batches(read_data_file(table.io, ref.path, with_lineage(table.schema())))
        )
        got = list(zip(rows.column(-2).to_pylist(), rows.column(-1).to_pylist(), strict=True))
        assert got == expected[ref.path], ref.path


@pytest.mark.parametrize("identifier", [("id",), ()], ids=["with-ids", "whole-row"])
def test_copied_rows_cancel_by_lineage_and_the_changes_are_exact(tmp_path: Path, identifier):
    pipeline, history = v3_history(tmp_path, identifier)
    pipeline.catch_up()
    history.cow_merge(random.Random(4), 0.3)
    history.spark_update(random.Random(5), 0.2, 0.5)
    history.cow_merge(random.Random(6), 0.5)
    history.compact()
    history.cow_merge(random.Random(7), 1.0)
    by_lineage = 0
    for run in pipeline.catch_up():
        if run.action == "skip":
            continue
        assert_replay(history.table, pipeline.sink, run.snapshot_id, list(identifier) or None)
        by_lineage += sum(u.get("cancelled_by_lineage", 0) for u in run.units.get("write", []))
    assert by_lineage > 0


def test_rows_from_before_the_upgrade_fall_back_to_values(tmp_path: Path):
    pipeline, history = v3_history(tmp_path, upgrade_first=False)
    pipeline.catch_up()
    history.upgrade_to_v3()
    [snapshot] = history.cow_merge(random.Random(8), 0.2)  # rewrites files written as v2
    [run] = pipeline.catch_up()
    assert run.snapshot_id == snapshot
    assert_replay(history.table, pipeline.sink, snapshot, ["id"])
    units = run.units["write"]
    assert sum(u["cancelled_rows"] for u in units) > 0
    assert sum(u["cancelled_by_lineage"] for u in units) == 0  # no removed file had a row id


def test_lineage_can_be_turned_off(tmp_path: Path):
    pipeline, history = v3_history(tmp_path, row_lineage=False)
    pipeline.catch_up()
    history.cow_merge(random.Random(9), 0.3)
    [run] = pipeline.catch_up()
    assert_replay(history.table, pipeline.sink, run.snapshot_id, ["id"])
    assert sum(u["cancelled_by_lineage"] for u in run.units["write"]) == 0
    assert run.committed["cancelled_rows"] > 0

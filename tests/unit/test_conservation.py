"""Row conservation, judged directly: each way the rows can fail to add up is refused by name.

:mod:`iceberg_cdc.pipeline.conservation` is pure: a plan and the small records
the tasks leave. One consistent snapshot is built here (two write tasks, one
masking rows by delete files, two read ranges), then each record is damaged in
one way, as a task marked "success" by hand, a swapped object or a reader
that drops rows would damage it, and the check must raise
``ConservationError`` naming the snapshot, the stage and both counts.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest

from iceberg_cdc.changelog.merge import MergeStats
from iceberg_cdc.errors import ConservationError
from iceberg_cdc.pipeline.conservation import (
    Conservation,
    check_merge,
    check_snapshot,
    check_written,
    expected_parts,
)
from iceberg_cdc.pipeline.plan import SnapshotPlan
from iceberg_cdc.sink.summary import CommitSummary
from iceberg_cdc.source.planning import InputFile, WriteTask, task_id_of

WHERE = r"snapshot 77 of shop\.orders \(run 'run-1', epoch 3\)"


def _task(*files: InputFile) -> WriteTask:
    return WriteTask(task_id_of(files), tuple(files))


T1 = _task(
    InputFile("s3://wh/d/removed.parquet", 1000, 10, "DELETE"),
    InputFile("s3://wh/d/added.parquet", 1200, 12, "INSERT"),
)
T2 = _task(InputFile("s3://wh/d/added-2.parquet", 800, 8, "INSERT"))


def _plan(kind: str = "with_deletes", tasks: tuple[WriteTask, ...] = (T1, T2)) -> SnapshotPlan:
    return SnapshotPlan(
        source="shop.orders",
        sink="shop.orders_changes",
        source_uuid="uuid",
        snapshot_id=77,
        parent_id=76,
        ordinal=5,
        operation="overwrite",
        kind=kind,  # type: ignore[arg-type]
        schema_json="{}",
        sink_schema_json="{}",
        identifier_columns=["id"],
        partitions=4,
        duplicate_keys="fail",
        sink_location="s3://wh/sink",
        write_tasks=list(tasks),
        groups=[],
        run_id="run-1",
        epoch=3,
    )


def _records() -> dict[str, Any]:
    """A snapshot whose rows add up: 30 input rows = 28 shuffled + 2 masked = 18 carryover + 10 changes + 2."""
    return {
        "written": {
            T1.task_id: {"rows": {"DELETE": 10, "INSERT": 10}, "masked": {"INSERT": 2}},
            T2.task_id: {"rows": {"INSERT": 8}},
        },
        "ranges": [{"index": 0, "rows": 20}, {"index": 1, "rows": 8}],
        "staged": [
            {
                "part": "range-00000",
                "epoch": 3,
                "stats": {"rows_read": 20, "carryover_rows": 14},
                "files": [{"path": "s3://wh/sink/a.parquet", "record_count": 6}],
            },
            {
                "part": "range-00001",
                "epoch": 3,
                "stats": {"rows_read": 8, "carryover_rows": 4},
                "files": [{"path": "s3://wh/sink/b.parquet", "record_count": 4}],
            },
        ],
        "footer_rows": {"s3://wh/sink/a.parquet": 6, "s3://wh/sink/b.parquet": 4},
    }


def _check(plan: SnapshotPlan | None = None, **records: Any) -> Conservation:
    return check_snapshot(plan or _plan(), **records)


def test_a_snapshot_whose_rows_add_up_gives_its_figures():
    figures = _check(**_records())
    assert figures == Conservation(
        input_rows=30, masked_rows=2, shuffled_rows=28, read_rows=28, carryover_rows=18, change_rows=10
    )
    assert figures.rows() == {
        "input": 30,
        "masked": 2,
        "cancelled": 0,
        "shuffled": 28,
        "read": 28,
        "carryover": 18,
        "changes": 10,
    }
    assert CommitSummary(rows=figures.rows()).to_summary() == {
        "cdc.rows.input": "30",
        "cdc.rows.masked": "2",
        "cdc.rows.cancelled": "0",
        "cdc.rows.shuffled": "28",
        "cdc.rows.read": "28",
        "cdc.rows.carryover": "18",
        "cdc.rows.changes": "10",
    }


def test_a_missing_staged_record_is_refused():
    """A read task marked success by hand: its range has no staged record."""
    records = _records()
    records["staged"] = records["staged"][:1]
    with pytest.raises(
        ConservationError, match=WHERE + r".*do not match the plan: missing \['range-00001'\]"
    ):
        _check(**records)


def test_an_unexpected_staged_record_is_refused():
    records = _records()
    extra = copy.deepcopy(records["staged"][1])
    extra["part"] = "range-00002"
    records["staged"].append(extra)
    with pytest.raises(ConservationError, match=r"unexpected \['range-00002'\] \(1\)"):
        _check(**records)


def test_a_staged_record_of_another_epoch_is_refused():
    """Another run's (fenced-out) record under this run's name."""
    records = _records()
    records["staged"][1]["epoch"] = 2
    with pytest.raises(
        ConservationError, match=WHERE + r": staged records \['range-00001'\] belong to another"
    ):
        _check(**records)


def test_a_map_output_without_its_row_record_is_refused():
    records = _records()
    del records["written"][T2.task_id]
    with pytest.raises(ConservationError, match=rf"no row record for map output\(s\) \['{T2.task_id}'\]"):
        _check(**records)


def test_write_tasks_that_wrote_fewer_rows_than_the_manifests_hold_are_refused():
    records = _records()
    records["written"][T2.task_id]["rows"]["INSERT"] = 7
    with pytest.raises(
        ConservationError,
        match=r"wrote 27 rows to the shuffle \(delete files masked 2, 0 cancelled as carryover.*hold 30 rows",
    ):
        _check(**records)


def test_rows_masked_by_deletes_count_toward_the_input_and_nowhere_else():
    records = _records()
    del records["written"][T1.task_id]["masked"]  # the two rows are then unaccounted for
    with pytest.raises(ConservationError, match=r"wrote 28 rows to the shuffle .*masked 0.*hold 30 rows"):
        _check(**records)


def test_read_ranges_that_leave_partitions_out_are_refused():
    records = _records()
    records["ranges"] = [{"index": 0, "rows": 20}]
    records["staged"] = records["staged"][:1]
    with pytest.raises(ConservationError, match=r"read ranges cover 20 rows of the 28 .*coalesce left"):
        _check(**records)


def test_a_staged_file_replaced_after_its_task_is_refused():
    records = _records()
    records["footer_rows"]["s3://wh/sink/b.parquet"] = 3
    with pytest.raises(
        ConservationError, match=r"staged file s3://wh/sink/b\.parquet of range-00001 holds 3 rows"
    ):
        _check(**records)


def test_a_missing_staged_file_is_refused():
    records = _records()
    del records["footer_rows"]["s3://wh/sink/a.parquet"]
    with pytest.raises(ConservationError, match=r"a\.parquet of range-00000 holds None rows.*staged 6"):
        _check(**records)


def test_a_reader_that_dropped_rows_is_refused():
    """The map outputs hold 28 rows, the read tasks say they read 27."""
    records = _records()
    records["staged"][1]["stats"]["rows_read"] = 7
    with pytest.raises(ConservationError, match=r"rows do not add up: input files 30 .*read back 27"):
        _check(**records)


def test_changes_and_carryover_that_do_not_make_the_rows_read_are_refused():
    records = _records()
    records["staged"][0]["stats"]["carryover_rows"] = 13
    with pytest.raises(ConservationError, match=r"carryover 17 \+ changes staged 10 = 27"):
        _check(**records)


def test_insert_only_snapshots_are_checked_against_their_insert_tasks():
    plan = _plan("insert_only", (T2,))
    assert expected_parts(plan, None) == {f"insert-{T2.task_id}"}
    staged = [
        {
            "part": f"insert-{T2.task_id}",
            "epoch": 3,
            "stats": {"rows_read": 7, "masked_rows": 1},
            "files": [{"path": "s3://wh/sink/i.parquet", "record_count": 7}],
        }
    ]
    figures = _check(plan, written={}, ranges=None, staged=staged, footer_rows={"s3://wh/sink/i.parquet": 7})
    assert figures == Conservation(8, 1, 0, 7, 0, 7)
    staged[0]["stats"]["masked_rows"] = 0  # one input row neither staged nor masked
    with pytest.raises(
        ConservationError, match=r"rows do not add up: input files 8 .*masked by delete files 0"
    ):
        _check(plan, written={}, ranges=None, staged=staged, footer_rows={"s3://wh/sink/i.parquet": 7})
    with pytest.raises(ConservationError, match=r"missing \['insert-"):
        _check(plan, written={}, ranges=None, staged=[], footer_rows={})


# --------------------------------------------------------------------------- per task


def test_a_write_task_must_read_what_its_files_hold_per_operation():
    plan = _plan()
    check_written(plan, T1, {"DELETE": 10, "INSERT": 10}, {"INSERT": 2})
    check_written(plan, T1, {"DELETE": 10, "INSERT": 12})
    with pytest.raises(
        ConservationError, match=rf"write task {T1.task_id} read 9 DELETE rows from its 1 file"
    ):
        check_written(plan, T1, {"DELETE": 9, "INSERT": 12})
    with pytest.raises(
        ConservationError, match=r"read 10 INSERT rows \(\+ 1 rows not live by delete files\)"
    ):
        check_written(plan, T1, {"DELETE": 10, "INSERT": 10}, {"INSERT": 1})
    # rows of one operation never make up for the other's
    with pytest.raises(ConservationError, match="DELETE rows"):
        check_written(plan, T1, {"DELETE": 11, "INSERT": 11})


def test_a_read_range_must_be_all_carryover_or_changes():
    plan = _plan()
    stats = MergeStats(input_rows=20, deletes=2, inserts=1, updates=3, carryover_rows=11)
    check_merge(plan, 0, stats, change_rows=9)
    with pytest.raises(
        ConservationError, match=r"read range 0 fetched 20 rows but accounts for 10 carryover \+ 9"
    ):
        check_merge(plan, 0, replace(stats, carryover_rows=10), change_rows=9)
    with pytest.raises(ConservationError, match="and 8 change rows were produced"):
        check_merge(plan, 0, stats, change_rows=8)

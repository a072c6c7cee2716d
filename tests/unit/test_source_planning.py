"""Bin-packing changed files into write tasks: deterministic, complete, near the target size."""

from __future__ import annotations

import hashlib
import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iceberg_cdc.source.change_files import DataFileRef, SnapshotChanges
from iceberg_cdc.source.planning import (
    InputFile,
    WriteTask,
    cancel_groups,
    pack_items,
    plan_from_dict,
    plan_to_dict,
    plan_write_tasks,
    task_id_of,
)

MB = 1 << 20


def pack_files(files: list[InputFile], target_bytes: int, max_files_per_task: int = 1000) -> list[WriteTask]:
    """Files packed as plan_write_tasks packs them without carryover cancelling (each file alone)."""
    return pack_items(cancel_groups(files, None, max_files_per_task), target_bytes, max_files_per_task)


def changes_of(deleted: list[tuple[str, int]], added: list[tuple[str, int]]) -> SnapshotChanges:
    return SnapshotChanges(
        snapshot_id=1,
        parent_id=0,
        operation="overwrite",
        sequence_number=2,
        timestamp_ms=0,
        schema_id=0,
        added=tuple(DataFileRef(p, s, s // 100, 0) for p, s in added),
        deleted=tuple(DataFileRef(p, s, s // 100, 0) for p, s in deleted),
    )


def test_files_are_tagged_with_their_operation():
    tasks = plan_write_tasks(changes_of([("s3://w/old.parquet", 10)], [("s3://w/new.parquet", 20)]), 100)
    (task,) = tasks
    assert {(f.path, f.op) for f in task.files} == {
        ("s3://w/old.parquet", "DELETE"),
        ("s3://w/new.parquet", "INSERT"),
    }
    assert task.bytes == 30 and task.record_count == 0


def test_task_id_is_the_sha256_of_sorted_op_paths():
    files = (InputFile("s3://w/b", 1, 1, "INSERT"), InputFile("s3://w/a", 1, 1, "DELETE"))
    expected = hashlib.sha256(b"DELETE:s3://w/a\nINSERT:s3://w/b").hexdigest()[:16]
    assert task_id_of(files) == expected == task_id_of(tuple(reversed(files)))


def test_same_changes_give_same_tasks_whatever_the_listing_order():
    rng = random.Random(7)
    deleted = [(f"s3://w/d{i}.parquet", rng.choice([1, 5, 5, 40, 130]) * MB) for i in range(60)]
    added = [(f"s3://w/a{i}.parquet", rng.choice([1, 5, 5, 40, 130]) * MB) for i in range(60)]
    reference = plan_write_tasks(changes_of(deleted, added), 128 * MB)
    for _ in range(5):
        rng.shuffle(deleted)
        rng.shuffle(added)
        assert plan_write_tasks(changes_of(deleted, added), 128 * MB) == reference
    assert len({t.task_id for t in reference}) == len(reference)


def test_plan_json_round_trip_and_tampering_is_detected():
    tasks = plan_write_tasks(
        changes_of([("s3://w/d", 3 * MB)], [("s3://w/a", 2 * MB), ("s3://w/b", 9 * MB)]), 8 * MB
    )
    text = json.dumps(plan_to_dict(tasks))
    assert plan_from_dict(json.loads(text)) == tasks
    data = tasks[0].to_dict()
    assert WriteTask.from_dict(data) == tasks[0]
    data["files"][0]["path"] = "s3://w/other"
    with pytest.raises(ValueError, match="does not match"):
        WriteTask.from_dict(data)


def test_many_tiny_files_make_few_tasks():
    files = [InputFile(f"s3://w/f{i:05d}", 10_000, 10, "INSERT") for i in range(5000)]
    tasks = pack_files(files, target_bytes=10 * MB)
    total = 5000 * 10_000
    assert len(tasks) == math.ceil(total / (10 * MB))
    assert all(len(t.files) <= 1000 for t in tasks)


def test_file_count_limit_closes_tasks():
    files = [InputFile(f"s3://w/f{i}", 1, 1, "DELETE") for i in range(25)]
    tasks = pack_files(files, target_bytes=MB, max_files_per_task=10)
    assert [len(t.files) for t in tasks] == [10, 10, 5]


def test_invalid_arguments():
    one = [InputFile("s3://w/f", 1, 1, "INSERT")]
    with pytest.raises(ValueError):
        pack_files(one, 0)
    with pytest.raises(ValueError):
        pack_files(one, 10, max_files_per_task=0)
    with pytest.raises(ValueError, match="twice"):
        pack_files(one + one, 10)
    with pytest.raises(ValueError):
        InputFile("s3://w/f", 1, 1, "UPDATE")  # type: ignore[arg-type]
    assert pack_files([], 10) == []


sizes = st.lists(st.integers(min_value=0, max_value=3000), min_size=0, max_size=120)


def _files(file_sizes: list[int]) -> list[InputFile]:
    return [
        InputFile(f"s3://w/{i:04d}", s, 1, "DELETE" if i % 3 == 0 else "INSERT")
        for i, s in enumerate(file_sizes)
    ]


@settings(max_examples=150, deadline=None)
@given(sizes, st.integers(min_value=1, max_value=2000), st.integers(min_value=1, max_value=50), st.randoms())
def test_packing_properties(file_sizes, target, max_files, rng):
    files = _files(file_sizes)
    tasks = pack_files(files, target, max_files)

    # every file in exactly one task
    placed = [(f.op, f.path) for t in tasks for f in t.files]
    assert sorted(placed) == sorted((f.op, f.path) for f in files)

    for task in tasks:
        assert 1 <= len(task.files) <= max_files
        assert task.task_id == task_id_of(task.files)
        if any(f.size >= target for f in task.files):
            assert len(task.files) == 1  # a file at or above the target is alone
        else:
            assert task.bytes <= target

    # near the target: no two tasks of small files could be merged, unless the file limit stops it
    small = [t for t in tasks if t.bytes < target and len(t.files) < max_files]
    half_full = [t for t in small if 2 * t.bytes <= target]
    assert len(half_full) <= 1
    small_bytes = sum(f.size for f in files if f.size < target)
    large = sum(1 for f in files if f.size >= target)
    count_bound = math.ceil(sum(1 for f in files if f.size < target) / max_files)
    assert len(tasks) <= large + 2 * math.ceil(small_bytes / target) + 1 + count_bound

    # deterministic whatever the input order
    shuffled = list(files)
    rng.shuffle(shuffled)
    assert pack_files(shuffled, target, max_files) == tasks


def test_partition_values_travel_with_their_file_and_leave_task_ids_alone():
    values = {4: "US", 5: 19723}
    changes = SnapshotChanges(
        snapshot_id=1,
        parent_id=0,
        operation="overwrite",
        sequence_number=2,
        timestamp_ms=0,
        schema_id=0,
        added=(DataFileRef("s3://w/new.parquet", 20, 1, 0),),
        deleted=(DataFileRef("s3://w/old.parquet", 10, 1, 0, values),),
    )
    (task,) = plan_write_tasks(changes, 100)
    by_op = {f.op: f for f in task.files}
    assert by_op["DELETE"].partition_values == values
    assert by_op["INSERT"].partition_values is None
    plain = plan_write_tasks(changes_of([("s3://w/old.parquet", 10)], [("s3://w/new.parquet", 20)]), 100)
    assert task.task_id == plain[0].task_id
    (restored,) = plan_from_dict(json.loads(json.dumps(plan_to_dict([task]))))
    assert restored == task

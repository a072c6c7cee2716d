"""Key ranges from manifest statistics split a partition only where no carryover can cross."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyiceberg.conversions import to_bytes
from pyiceberg.manifest import DataFile
from pyiceberg.types import DoubleType, IntegerType, LongType, NestedField, StringType

from iceberg_cdc.source.key_ranges import key_range, split_by_key_range
from iceberg_cdc.source.planning import CancelPlanning, InputFile, cancel_groups

ID = NestedField(1, "id", LongType(), required=True)


def data_file(low, high, nulls=0, field=ID) -> DataFile:
    bounds = {} if low is None else {field.field_id: to_bytes(field.field_type, low)}
    upper = {} if high is None else {field.field_id: to_bytes(field.field_type, high)}
    return DataFile.from_args(
        file_path="f.parquet",
        lower_bounds=bounds,
        upper_bounds=upper,
        null_value_counts={} if nulls is None else {field.field_id: nulls},
    )


def test_key_range_is_read_only_where_it_can_be_trusted():
    assert key_range(data_file(3, 9), ID) == (3, 9)
    name = NestedField(2, "name", StringType(), required=False)
    assert key_range(data_file("ab", "zz", field=name), name) == ("ab", "zz")
    assert key_range(data_file(3, 9, nulls=1), ID) is None  # nulls: not in the bounds
    assert key_range(data_file(3, 9, nulls=None), ID) is None  # no null count recorded
    assert key_range(data_file(None, 9), ID) is None
    assert key_range(data_file(3, 9), None) is None
    price = NestedField(3, "price", DoubleType(), required=False)
    assert key_range(data_file(1.5, 2.5, field=price), price) is None  # floats: NaN, -0.0
    # An int bound (4 bytes) read after the column was promoted to long gives the same values.
    small = NestedField(1, "id", IntegerType(), required=True)
    assert key_range(data_file(3, 9, field=small), ID) == (3, 9)


def test_overlapping_ranges_chain_into_one_component():
    ranges = {"a": (0, 10), "b": (5, 20), "c": (20, 25), "d": (26, 30), "e": (100, 100), "f": (90, 100)}
    components = split_by_key_range(list(ranges), ranges.get)
    assert [sorted(c) for c in components] == [["a", "b", "c"], ["d"], ["e", "f"]]
    ranges["x"] = None
    assert [sorted(c) for c in split_by_key_range(list(ranges), ranges.get)] == [sorted(ranges)]
    mixed = {"a": (1, 2), "b": ("a", "b")}
    assert len(split_by_key_range(list(mixed), mixed.get)) == 1
    assert split_by_key_range([], mixed.get) == []


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(st.tuples(st.integers(0, 6), st.integers(-20, 20)), min_size=1, max_size=40),
    seed=st.integers(0, 2**32 - 1),
)
def test_rows_with_equal_keys_always_share_a_component(rows, seed):
    """Files are random sets of keys; any two files holding one key end up in one component."""
    files: dict[int, list[int]] = {}
    for file, key in rows:
        files.setdefault(file, []).append(key)
    names = list(files)
    random.Random(seed).shuffle(names)
    components = split_by_key_range(names, lambda f: (min(files[f]), max(files[f])))
    where = {f: i for i, c in enumerate(components) for f in c}
    assert sorted(where) == sorted(files)
    for a in files:
        for b in files:
            if set(files[a]) & set(files[b]):
                assert where[a] == where[b]


def _file(path: str, op: str, size: int = 10) -> InputFile:
    return InputFile(path, size, 1, op, cancel_group="p1")  # type: ignore[arg-type]


def test_planning_splits_a_partition_into_key_range_groups():
    files = [
        _file("old-1", "DELETE"),
        _file("new-1", "INSERT"),
        _file("old-2", "DELETE"),
        _file("new-2", "INSERT"),
        _file("old-3", "DELETE"),  # its range meets no added file: nothing to cancel it against
    ]
    ranges = {
        "old-1": (0, 99),
        "new-1": (0, 99),
        "old-2": (100, 199),
        "new-2": (150, 199),
        "old-3": (500, 600),
    }
    items = cancel_groups(files, CancelPlanning(1 << 30, ranges), max_files=100)
    grouped = sorted((sorted(f.path for f in item), {f.cancel_group for f in item}) for item in items)
    assert grouped == [
        (["new-1", "old-1"], {"p1#0"}),
        (["new-2", "old-2"], {"p1#1"}),
        (["old-3"], {None}),
    ]
    # Without ranges the partition stays whole; a group above the cap is packed file by file.
    whole = cancel_groups(files, CancelPlanning(1 << 30), max_files=100)
    assert [sorted(f.path for f in item) for item in whole] == [sorted(f.path for f in files)]
    assert {f.cancel_group for item in whole for f in item} == {"p1"}
    capped = cancel_groups(files, CancelPlanning(15), max_files=100)
    assert all(len(item) == 1 and item[0].cancel_group is None for item in capped)
    assert all(f.cancel_group is None for item in cancel_groups(files, None, 100) for f in item)


def test_bad_cap():
    with pytest.raises(ValueError, match="positive"):
        CancelPlanning(0)

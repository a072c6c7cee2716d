"""A read range on local disk, decoded a few partitions at a time.

Whatever the grouping, the rows are those of the range (each once), the rows
per map output are counted for conservation, the GETs are one per non-empty
map output, damage is a CorruptShuffleError naming the object, and the local
file is gone afterwards.
"""

from __future__ import annotations

import itertools
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from iceberg_cdc.errors import CorruptShuffleError, ObjectNotFoundError
from iceberg_cdc.shuffle.fetch import MapOutputSpan, fetch_range
from iceberg_cdc.shuffle.layout import data_key
from iceberg_cdc.shuffle.partitioner import HashPartitioner
from iceberg_cdc.shuffle.range_reader import FetchedRange
from iceberg_cdc.shuffle.reader import read_index
from iceberg_cdc.shuffle.rows import OP_COLUMN, Op, shuffle_schema
from iceberg_cdc.shuffle.writer import MapOutputWriter
from iceberg_cdc.storage import LocalObjectStore

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.large_string())])
P = 16


def rows(lo: int, hi: int) -> pa.Table:
    ids = np.arange(lo, hi, dtype=np.int64)
    return pa.table({"id": ids, "v": pa.array([f"v{i}" for i in ids], pa.large_string())}, schema=SCHEMA)


@pytest.fixture
def outputs(tmp_path: Path):
    store = LocalObjectStore(tmp_path / "shuffle")
    partitioner = HashPartitioner(P, ["id"])
    names = []
    for m, (lo, hi) in enumerate([(0, 4000), (3000, 9000), (0, 0)]):  # the last one is empty
        name = f"snap/map-{m}"
        with MapOutputWriter(
            store, name, SCHEMA, partitioner, block_bytes=2048, spill_dir=str(tmp_path)
        ) as w:
            w.write(rows(lo, hi), Op.DELETE if m == 0 else Op.INSERT)
            w.commit()
        names.append(name)
    return store, [read_index(store, name, P) for name in names]


def ids_of(table: pa.Table) -> Counter:
    return Counter(zip(table.column("id").to_pylist(), table.column(OP_COLUMN).to_pylist(), strict=True))


@pytest.mark.parametrize("merge_bytes", [1, 3000, 1 << 30])
def test_groups_cover_the_range_once_and_count_rows_per_map_output(outputs, tmp_path, merge_bytes):
    store, indexes = outputs
    schema = shuffle_schema(SCHEMA)
    for start, end in [(0, P), (3, 11), (7, 8)]:
        spans = [MapOutputSpan.of(ix, start, end) for ix in indexes]
        spill = tmp_path / f"spill-{start}-{merge_bytes}"
        spill.mkdir()
        before = store.requests.copy()
        with FetchedRange(store, spans, schema, spill_dir=str(spill)) as fetched:
            fetched.fetch()
            assert store.requests - before == Counter({"GET_RANGE": 2})  # the empty output costs nothing
            groups = fetched.groups(merge_bytes)
            assert groups and groups[0][0] == 0 and groups[-1][1] <= end - start
            assert all(a[1] == b[0] for a, b in itertools.pairwise(groups)), "consecutive"
            got: Counter = Counter()
            for lo, hi in groups:
                part = fetched.read(lo, hi)
                got += ids_of(part)
                if merge_bytes == 1:
                    assert hi - lo == 1 or fetched.partition_sizes()[lo:hi][1:].sum() == 0
            expected = fetch_range(store, indexes, start, end, schema, threads=1)
            assert got == ids_of(expected)
            assert fetched.span_rows == [
                ids_of(fetch_range(store, [ix], start, end, schema, threads=1)).total() for ix in indexes
            ]
            assert fetched.fetched_bytes == sum(s.size for s in spans)
        assert os.listdir(spill) == [], "the local copy is deleted"


def test_a_truncated_or_missing_object_is_named(outputs, tmp_path):
    store, indexes = outputs
    schema = shuffle_schema(SCHEMA)
    spans = [MapOutputSpan.of(ix, 0, P) for ix in indexes]
    path = store.root / data_key(indexes[1].name)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with (
        FetchedRange(store, spans, schema, spill_dir=str(tmp_path)) as fetched,
        pytest.raises(CorruptShuffleError, match=r"map-1\.data.*truncated"),
    ):
        fetched.fetch()
    path.write_bytes(data[:-3] + b"xyz")  # same size, damaged block
    with FetchedRange(store, spans, schema, spill_dir=str(tmp_path)) as fetched:
        fetched.fetch()
        with pytest.raises(CorruptShuffleError, match=str(store.uri)):
            for lo, hi in fetched.groups(1 << 30):
                fetched.read(lo, hi)
    path.unlink()
    with (
        FetchedRange(store, spans, schema, spill_dir=str(tmp_path)) as fetched,
        pytest.raises(ObjectNotFoundError, match="does not exist, though its index does"),
    ):
        fetched.fetch()


def test_spans_of_different_ranges_are_refused(outputs):
    store, indexes = outputs
    with pytest.raises(ValueError, match="same partitions"):
        FetchedRange(store, [MapOutputSpan.of(indexes[0], 0, 4), MapOutputSpan.of(indexes[1], 1, 4)], SCHEMA)

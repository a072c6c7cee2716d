"""The byte layout of a map output, checked against the public contract by hand.

Nothing here goes through the reader: the index and the data object are
parsed with ``struct`` and ``lz4.block`` directly, as a reader written in
another language (Spark, JVM) would.
"""

from __future__ import annotations

import itertools
import struct
from collections import Counter

import lz4.block
import numpy as np
import pyarrow as pa
import pytest
from pyiceberg_core.transform import bucket

from iceberg_cdc.errors import CorruptShuffleError
from iceberg_cdc.shuffle.codec import decode_block
from iceberg_cdc.shuffle.layout import MapOutputIndex, RawBlock, data_key, index_key
from iceberg_cdc.shuffle.partitioner import HashPartitioner
from iceberg_cdc.shuffle.rows import OP_COLUMN, Op, shuffle_schema
from iceberg_cdc.shuffle.writer import MapOutputWriter

P = 4
NAME = "snap-1/map-00000"
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("tags", pa.list_(pa.int32()))])


def _batch(start: int, stop: int) -> pa.RecordBatch:
    ids = list(range(start, stop))
    return pa.record_batch(
        [
            pa.array(ids, pa.int64()),
            pa.array([f"row-{i}" * (i % 5) if i % 7 else None for i in ids]),
            pa.array([[i, None, -i] if i % 3 else None for i in ids], pa.list_(pa.int32())),
        ],
        schema=SCHEMA,
    )


@pytest.fixture
def written(local_store, tmp_path):
    """A map output with several spills and several blocks per partition."""
    partitioner = HashPartitioner(P, ["id"])
    inserts, deletes = _batch(0, 600), _batch(1000, 1150)
    writer = MapOutputWriter(
        local_store,
        NAME,
        SCHEMA,
        partitioner,
        buffer_bytes=4 * 1024,
        sort_bytes=2 * 1024,
        block_bytes=1024,
        spill_dir=tmp_path,
    )
    with writer:
        writer.write(inserts, Op.INSERT)
        writer.write(deletes, Op.DELETE)
        stats = writer.commit()
    assert stats.spills > 1
    return local_store, partitioner, inserts, deletes, stats


def _walk_partition(raw: bytes, start: int, end: int, partition: int) -> list[RawBlock]:
    """The blocks of bytes [start, end), each checked to LZ4-decompress to its stated size."""
    blocks = []
    pos = start
    while pos < end:
        assert end - pos >= 8, f"a block header does not fit in the partition at {pos}"
        usize, csize = struct.unpack(">II", raw[pos : pos + 8])
        pos += 8
        assert pos + csize <= end, "a block crosses its partition's boundary"
        compressed = raw[pos : pos + csize]
        payload = lz4.block.decompress(compressed, uncompressed_size=usize)
        assert len(payload) == usize
        blocks.append(RawBlock(partition, usize, memoryview(compressed)))
        pos += csize
    assert pos == end, "blocks must end exactly on the partition boundary"
    return blocks


def test_index_and_data_match_the_contract(written):
    store, partitioner, inserts, deletes, stats = written
    objects = {info.key: info.size for info in store.list("snap-1/")}
    assert set(objects) == {data_key(NAME), index_key(NAME)}
    assert data_key(NAME) == NAME + ".data"
    assert index_key(NAME) == NAME + ".index"

    raw_index = store.get(index_key(NAME))
    assert len(raw_index) == 8 * (P + 1) == objects[index_key(NAME)]
    offsets = struct.unpack(">5q", raw_index)
    assert offsets[0] == 0
    assert offsets[-1] == objects[data_key(NAME)] == stats.data_bytes
    assert all(a <= b for a, b in itertools.pairwise(offsets))
    assert list(np.diff(offsets)) == stats.partition_sizes

    raw = store.get(data_key(NAME))
    assert len(raw) == offsets[-1]
    schema = shuffle_schema(SCHEMA)
    expected: dict[int, Counter] = {p: Counter() for p in range(P)}
    for batch, op in ((inserts, Op.INSERT), (deletes, Op.DELETE)):
        for row_id, partition in zip(
            batch.column("id").to_pylist(), partitioner.partitions(batch).tolist(), strict=True
        ):
            expected[partition][(row_id, int(op))] += 1

    blocks_seen = 0
    for p in range(P):
        got: Counter = Counter()
        for block in _walk_partition(raw, offsets[p], offsets[p + 1], p):
            blocks_seen += 1
            # What is inside a block is the codec's business (checksummed Arrow IPC).
            batch = decode_block(NAME, block, schema)
            assert batch.schema.equals(schema)
            assert batch.num_rows > 0
            got.update(zip(batch.column("id").to_pylist(), batch.column(OP_COLUMN).to_pylist(), strict=True))
        assert got == expected[p], f"partition {p} holds the wrong rows"
    assert blocks_seen > P, "the fixture should produce several blocks per partition"


def test_single_key_partition_is_the_iceberg_bucket_transform(written):
    _, partitioner, inserts, _, _ = written
    expected = bucket(inserts.column("id"), P).to_numpy()
    assert (partitioner.partitions(inserts) == expected).all()


def test_row_values_survive_the_raw_layout(written):
    store, _, inserts, _, _ = written
    offsets = struct.unpack(">5q", store.get(index_key(NAME)))
    raw = store.get(data_key(NAME))
    schema = shuffle_schema(SCHEMA)
    rows = []
    for p in range(P):
        for block in _walk_partition(raw, offsets[p], offsets[p + 1], p):
            batch = decode_block(NAME, block, schema)
            rows.extend(r for r in batch.to_pylist() if r[OP_COLUMN] == Op.INSERT)
    by_id = {r["id"]: r for r in rows}
    assert len(by_id) == inserts.num_rows
    for row in inserts.to_pylist():
        assert by_id[row["id"]] == {**row, OP_COLUMN: int(Op.INSERT)}


# -- MapOutputIndex.from_bytes validation ----------------------------------------------------


def _raw(*offsets: int) -> bytes:
    return struct.pack(f">{len(offsets)}q", *offsets)


def test_from_bytes_round_trip():
    index = MapOutputIndex.from_bytes("m", _raw(0, 5, 5, 12), num_partitions=3, data_size=12)
    assert index.num_partitions == 3
    assert index.data_size == 12
    assert index.offsets.dtype == np.int64
    assert index.partition_sizes().tolist() == [5, 0, 7]
    assert index.byte_range(1, 3) == (5, 12)
    assert index.to_bytes() == _raw(0, 5, 5, 12)
    assert MapOutputIndex.from_sizes("m", [5, 0, 7]).to_bytes() == _raw(0, 5, 5, 12)


def test_from_bytes_single_partition_and_all_empty():
    assert MapOutputIndex.from_bytes("m", _raw(0, 0), 1, 0).num_partitions == 1
    assert MapOutputIndex.from_bytes("m", bytes(8 * 10_001), 10_000, 0).data_size == 0


@pytest.mark.parametrize(
    ("raw", "kwargs", "fragment"),
    [
        pytest.param(b"", {}, "0 bytes", id="empty"),
        pytest.param(_raw(0), {}, "8 bytes", id="one-offset"),
        pytest.param(_raw(0, 4) + b"\x00\x00\x00", {}, "19 bytes", id="not-multiple-of-8"),
        pytest.param(_raw(0, 4, 8), {"num_partitions": 3}, "has 2 partitions", id="wrong-P"),
        pytest.param(_raw(0, 4, 8), {"num_partitions": 1}, "has 2 partitions", id="wrong-P-fewer"),
        pytest.param(_raw(3, 4, 8), {}, "offset 3", id="first-not-zero"),
        pytest.param(_raw(0, 9, 8), {}, "partition 1 has negative size", id="negative-size"),
        pytest.param(_raw(0, -1, 8), {}, "partition 0 has negative size", id="negative-offset"),
        pytest.param(_raw(0, 4, 8), {"data_size": 7}, "7 bytes", id="last-beyond-data"),
        pytest.param(_raw(0, 4, 8), {"data_size": 9}, "9 bytes", id="last-short-of-data"),
    ],
)
def test_from_bytes_rejects_bad_indexes(raw, kwargs, fragment):
    with pytest.raises(CorruptShuffleError) as info:
        MapOutputIndex.from_bytes("snap-7/map-00042", raw, **kwargs)
    message = str(info.value)
    assert "snap-7/map-00042.index" in message
    assert fragment in message
    if "data_size" in kwargs:
        assert "snap-7/map-00042.data" in message

"""Damaged map outputs are reported as CorruptShuffleError naming the object and the partition.

Never a wrong row, never a stray exception type: whatever happened to the bytes,
the reader either returns exactly what was written or raises CorruptShuffleError
(ObjectNotFoundError when an object is missing altogether).
"""

from __future__ import annotations

import struct
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from iceberg_cdc.errors import CorruptShuffleError, ObjectNotFoundError
from iceberg_cdc.shuffle.layout import BLOCK_HEADER, data_key, index_key
from iceberg_cdc.shuffle.partitioner import HashPartitioner
from iceberg_cdc.shuffle.reader import read_index
from iceberg_cdc.shuffle.rows import Op, shuffle_schema
from iceberg_cdc.shuffle.writer import MapOutputWriter
from tests.support.shuffle_reads import read_span

P = 5
NAME = "snap-9/map-00003"
SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.string()), ("amount", pa.float64())])
FULL_SCHEMA = shuffle_schema(SCHEMA)
PARTITIONER = HashPartitioner(P, ["id"])


def _rows() -> pa.RecordBatch:
    """Rows of every partition but the last, so the last partition is empty."""
    ids = np.arange(600, dtype=np.int64)
    batch = pa.record_batch(
        [
            pa.array(ids),
            pa.array([f"payload {i} " + "abcdefghij"[: i % 11] for i in ids]),
            pa.array(ids * 0.25),
        ],
        schema=SCHEMA,
    )
    keep = PARTITIONER.partitions(batch) != P - 1
    return batch.filter(pa.array(keep))


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def store(request):
    return request.getfixturevalue(f"{request.param}_store")


@pytest.fixture
def written(store, tmp_path):
    """(store, index, rows by partition) of a map output with several blocks per partition."""
    return _write(store, tmp_path)


@pytest.fixture
def written_local(local_store, tmp_path):
    """As ``written``, on the local store only (for checks that do not depend on the store)."""
    return _write(local_store, tmp_path)


def _write(store, tmp_path):
    batch = _rows()
    with MapOutputWriter(store, NAME, SCHEMA, PARTITIONER, block_bytes=1024, spill_dir=str(tmp_path)) as w:
        w.write(batch, Op.INSERT)
        w.commit()
    index = read_index(store, NAME, P, _data_size(store))
    assert index.partition_sizes()[P - 1] == 0
    assert (index.partition_sizes()[: P - 1] > 0).all()
    return store, index, _read_all(store, index)


def _data_size(store) -> int:
    return {info.key: info.size for info in store.list(NAME)}[data_key(NAME)]


def _read_all(store, index, start: int = 0, end: int = P) -> Counter:
    rows: Counter = Counter()
    for batch in read_span(store, index, start, end, FULL_SCHEMA):
        rows.update(tuple(row.values()) for row in batch.to_pylist())
    return rows


def _assert_names(exc: pytest.ExceptionInfo, partition: int | None = None) -> None:
    message = str(exc.value)
    assert data_key(NAME) in message
    assert "partition" in message
    if partition is not None:
        assert f"partition {partition}" in message or f"partitions {partition}" in message, message


def _first_block(raw: bytes, start: int) -> tuple[int, int]:
    """(usize, csize) of the block starting at ``start``."""
    return BLOCK_HEADER.unpack_from(raw, start)


# -- truncated data object -----------------------------------------------------------------------


def test_truncated_data_object_mid_partition(written):
    store, index, _ = written
    raw = store.get(data_key(NAME))
    cut = int(index.offsets[2]) + 37  # inside partition 2
    store.put(data_key(NAME), raw[:cut])

    # coalesce lists the data object and sees the index does not match it
    with pytest.raises(CorruptShuffleError) as info:
        read_index(store, NAME, P, _data_size(store))
    assert index_key(NAME) in str(info.value)
    assert data_key(NAME) in str(info.value)

    # a reader holding the offsets from before the truncation
    with pytest.raises(CorruptShuffleError) as info:
        _read_all(store, index)
    _assert_names(info)
    with pytest.raises(CorruptShuffleError) as info:
        _read_all(store, index, 2, 3)
    _assert_names(info, 2)
    # partitions wholly before the cut are intact and still readable
    assert sum(_read_all(store, index, 0, 2).values()) > 0


def test_truncated_data_object_drops_whole_partitions(written):
    # The data object ends before the requested range even starts.
    store, index, _ = written
    raw = store.get(data_key(NAME))
    store.put(data_key(NAME), raw[: int(index.offsets[3])])
    with pytest.raises(CorruptShuffleError) as info:
        _read_all(store, index, 3, P)
    _assert_names(info, 3)


# -- flipped bytes ---------------------------------------------------------------------------------


def test_flipped_byte_inside_compressed_block(written_local):
    store, index, _ = written_local
    raw = bytearray(store.get(data_key(NAME)))
    start = int(index.offsets[1])
    _, csize = _first_block(raw, start)
    raw[start + BLOCK_HEADER.size + csize // 2] ^= 0xFF
    store.put(data_key(NAME), bytes(raw))
    with pytest.raises(CorruptShuffleError) as info:
        _read_all(store, index)
    _assert_names(info, 1)


@pytest.mark.parametrize("mask", [0x01, 0x80, 0xFF])
@pytest.mark.parametrize("position", range(BLOCK_HEADER.size))
def test_flipped_byte_inside_block_header(written_local, position, mask):
    store, index, _ = written_local
    raw = bytearray(store.get(data_key(NAME)))
    raw[int(index.offsets[1]) + position] ^= mask
    store.put(data_key(NAME), bytes(raw))
    with pytest.raises(CorruptShuffleError) as info:
        _read_all(store, index)
    _assert_names(info, 1)


def test_every_flip_in_a_partition_is_caught_or_harmless(local_store, tmp_path):
    """Sweep every byte of one partition's compressed payloads (headers are tested above)."""
    store = local_store
    with MapOutputWriter(store, NAME, SCHEMA, PARTITIONER, block_bytes=512, spill_dir=str(tmp_path)) as w:
        w.write(_rows().slice(0, 80), Op.DELETE)
        w.commit()
    index = read_index(store, NAME, P)
    original = bytes(store.get(data_key(NAME)))
    expected = _read_all(store, index, 1, 2)
    start, end = int(index.offsets[1]), int(index.offsets[2])
    payload_positions = []
    pos = start
    while pos < end:
        _, csize = _first_block(original, pos)
        payload_positions.extend(range(pos + BLOCK_HEADER.size, pos + BLOCK_HEADER.size + csize))
        pos += BLOCK_HEADER.size + csize
    assert len(payload_positions) > 100
    caught = 0
    for position in payload_positions:
        raw = bytearray(original)
        raw[position] ^= 0x5A
        store.put(data_key(NAME), bytes(raw))
        try:
            got = _read_all(store, index, 1, 2)
        except CorruptShuffleError as exc:
            assert data_key(NAME) in str(exc) and "partition 1" in str(exc)
            caught += 1
        else:
            assert got == expected, f"flipping byte {position} returned wrong rows without an error"
    assert caught > len(payload_positions) * 0.9


# -- index and data disagree -----------------------------------------------------------------------


def test_index_claims_more_bytes_than_the_data_has(written):
    store, index, _ = written
    size = _data_size(store)
    offsets = index.offsets.copy()
    offsets[-1] += 64  # the (empty) last partition now claims 64 bytes past the end
    store.put(index_key(NAME), struct.pack(f">{P + 1}q", *offsets.tolist()))

    with pytest.raises(CorruptShuffleError) as info:
        read_index(store, NAME, P, size)
    assert index_key(NAME) in str(info.value)
    assert data_key(NAME) in str(info.value)

    unchecked = read_index(store, NAME, P)  # without the LIST size, the reader must still catch it
    with pytest.raises(CorruptShuffleError) as info:
        _read_all(store, unchecked)
    _assert_names(info)
    with pytest.raises(CorruptShuffleError) as info:
        _read_all(store, unchecked, P - 1, P)
    _assert_names(info, P - 1)


def test_index_shorter_than_data_is_caught_by_the_blocks(written_local):
    store, index, _ = written_local
    offsets = index.offsets.copy()
    offsets[2] -= 5  # partition 1 loses its last 5 bytes, partition 2 gains them
    store.put(index_key(NAME), struct.pack(f">{P + 1}q", *offsets.tolist()))
    moved = read_index(store, NAME, P, _data_size(store))
    with pytest.raises(CorruptShuffleError) as info:
        _read_all(store, moved, 1, 2)
    _assert_names(info, 1)


def test_wrong_schema_is_reported_as_corruption(written_local):
    store, index, _ = written_local
    other = shuffle_schema(pa.schema([("id", pa.string()), ("payload", pa.list_(pa.int64()))]))
    with pytest.raises(CorruptShuffleError) as info:
        list(read_span(store, index, 0, P, other))
    _assert_names(info, 0)


# -- missing objects -------------------------------------------------------------------------------


def test_missing_index_is_not_found(written):
    store, _, _ = written
    with pytest.raises(ObjectNotFoundError) as info:
        read_index(store, "snap-9/map-99999", P)
    assert index_key("snap-9/map-99999") in str(info.value)


def test_missing_data_object_is_not_found(written):
    store, index, _ = written
    store.delete_prefix(data_key(NAME))
    assert [info.key for info in store.list(NAME)] == [index_key(NAME)]
    with pytest.raises(ObjectNotFoundError) as info:
        _read_all(store, index)
    assert data_key(NAME) in str(info.value)


def test_intact_output_reads_back(written):
    store, index, rows = written
    assert sum(rows.values()) == _rows().num_rows
    assert _read_all(store, index) == rows

"""Map output round trips: whatever goes into MapOutputWriter comes back from the reader.

The property test draws random schemas (every primitive width, floats with
NaN and -0.0, unicode and empty strings, binary, decimal, date, timestamptz,
bool, struct, list, map, with nulls at every level), random rows of both
operations, a random number of partitions and tiny buffer/block sizes so that
spills and multi-block partitions happen, and checks that every partition
holds exactly the rows the partitioner sends it.
"""

from __future__ import annotations

import datetime as dt
import decimal
import os
import struct
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from iceberg_cdc.errors import SinkSchemaError
from iceberg_cdc.shuffle.layout import data_key, index_key
from iceberg_cdc.shuffle.partitioner import HashPartitioner
from iceberg_cdc.shuffle.reader import read_index, read_partitions
from iceberg_cdc.shuffle.rows import OP_COLUMN, Op, shuffle_schema
from iceberg_cdc.shuffle.writer import MapOutputWriter
from iceberg_cdc.storage import LocalObjectStore
from tests.support.shuffle_reads import read_span

# -- strategies ---------------------------------------------------------------------------------

_INT_TYPES = [
    pa.int8(),
    pa.int16(),
    pa.int32(),
    pa.int64(),
    pa.uint8(),
    pa.uint16(),
    pa.uint32(),
    pa.uint64(),
]
_PRIMITIVE_TYPES = [
    *_INT_TYPES,
    pa.float32(),
    pa.float64(),
    pa.string(),
    pa.large_string(),
    pa.binary(),
    pa.large_binary(),
    pa.binary(16),
    pa.decimal128(9, 2),
    pa.decimal128(38, 10),
    pa.date32(),
    pa.timestamp("us", tz="UTC"),
    pa.bool_(),
]
_MAP_KEY_TYPES = [pa.int32(), pa.int64(), pa.string()]


def _types() -> st.SearchStrategy[pa.DataType]:
    leaves = st.sampled_from(_PRIMITIVE_TYPES)

    def extend(children: st.SearchStrategy[pa.DataType]) -> st.SearchStrategy[pa.DataType]:
        structs = st.lists(children, min_size=1, max_size=3).map(
            lambda types: pa.struct([pa.field(f"f{i}", t) for i, t in enumerate(types)])
        )
        lists = st.builds(pa.list_, children)
        large_lists = st.builds(pa.large_list, children)
        maps = st.builds(pa.map_, st.sampled_from(_MAP_KEY_TYPES), children)
        return structs | lists | large_lists | maps

    return st.recursive(leaves, extend, max_leaves=5)


def _non_null_values(typ: pa.DataType) -> st.SearchStrategy:
    if pa.types.is_integer(typ):
        bits = typ.bit_width
        if pa.types.is_signed_integer(typ):
            return st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        return st.integers(0, 2**bits - 1)
    if pa.types.is_float32(typ):
        return st.floats(width=32) | st.sampled_from([float("nan"), -0.0, 0.0])
    if pa.types.is_float64(typ):
        return st.floats() | st.sampled_from([float("nan"), -0.0, 0.0, float("-inf")])
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return st.text(max_size=6) | st.sampled_from(["", "é", "日本語", "\U0001f600", "a\x00b"])
    if pa.types.is_fixed_size_binary(typ):
        return st.binary(min_size=typ.byte_width, max_size=typ.byte_width)
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
        return st.binary(max_size=6)
    if pa.types.is_decimal(typ):
        bound = decimal.Decimal(10) ** (typ.precision - typ.scale) - 1
        return st.decimals(
            min_value=-bound, max_value=bound, places=typ.scale, allow_nan=False, allow_infinity=False
        )
    if pa.types.is_date32(typ):
        return st.dates()
    if pa.types.is_timestamp(typ):
        return st.datetimes(
            min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30), timezones=st.just(dt.UTC)
        )
    if pa.types.is_boolean(typ):
        return st.booleans()
    if pa.types.is_struct(typ):
        return st.fixed_dictionaries({f.name: _values(f.type) for f in typ})
    if pa.types.is_map(typ):
        return st.lists(st.tuples(_non_null_values(typ.key_type), _values(typ.item_type)), max_size=3)
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        return st.lists(_values(typ.value_type), max_size=3)
    raise AssertionError(f"no strategy for {typ}")


def _values(typ: pa.DataType) -> st.SearchStrategy:
    return st.none() | _non_null_values(typ)


@st.composite
def _map_outputs(draw):
    """(data schema, key columns, [(batch, op)], P, buffer_bytes, block_bytes)."""
    column_type = st.sampled_from(_PRIMITIVE_TYPES) | _types()  # half the columns are nested
    types = draw(st.lists(column_type, min_size=1, max_size=4))
    schema = pa.schema([pa.field(f"c{i}", t) for i, t in enumerate(types)])
    num_partitions = draw(st.sampled_from([7, 1, 2, 3, 16, 64, 10_000]))
    max_rows = 12 if num_partitions == 10_000 else 40
    row = st.fixed_dictionaries({f.name: _values(f.type) for f in schema})
    batches = []
    for _ in range(draw(st.integers(1, 3))):
        # Mostly non-empty batches; test_zero_rows_gives_an_index_of_zeros covers no rows at all.
        rows = draw(st.lists(row, min_size=draw(st.sampled_from([1, 0])), max_size=max_rows))
        batch = pa.RecordBatch.from_pylist(rows, schema=schema)
        batches.append((batch, draw(st.sampled_from([Op.DELETE, Op.INSERT]))))
    keys = draw(st.none() | st.lists(st.sampled_from(schema.names), min_size=1, max_size=2, unique=True))
    # Tiny buffers force a spill per piece; tiny blocks split partitions into many blocks.
    buffer_bytes = draw(st.sampled_from([256, 1, 64, 1024, 4096, 1 << 20]))
    block_bytes = draw(st.sampled_from([64, 1, 256, 2048, 1 << 20]))
    return schema, keys, batches, num_partitions, buffer_bytes, block_bytes


# -- helpers ------------------------------------------------------------------------------------


def freeze(value):
    """A hashable, exact form of a ``to_pylist`` value (floats by their bits, so NaN == NaN)."""
    if isinstance(value, float):
        return ("float", struct.pack(">d", value))
    if isinstance(value, dict):
        return tuple((k, freeze(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    return value


def row_keys(batch: pa.RecordBatch | pa.Table) -> list:
    return [freeze(row) for row in batch.to_pylist()]


def expected_by_partition(batches, partitioner) -> dict[int, Counter]:
    expected: dict[int, Counter] = {}
    for batch, op in batches:
        if batch.num_rows == 0:
            continue
        partitions = partitioner.partitions(batch)
        for key, partition in zip(row_keys(batch), partitions.tolist(), strict=True):
            expected.setdefault(partition, Counter())[(key, int(op))] += 1
    return expected


def read_rows(store, index, start, end, schema) -> tuple[Counter, list[pa.RecordBatch]]:
    batches = list(read_span(store, index, start, end, schema))
    rows: Counter = Counter()
    for batch in batches:
        assert batch.schema.equals(schema)
        ops = batch.column(OP_COLUMN).to_pylist()
        data = batch.drop_columns([OP_COLUMN])
        rows.update(zip(row_keys(data), ops, strict=True))
    return rows, batches


def write_output(store, name, schema, partitioner, batches, **kwargs):
    with MapOutputWriter(store, name, schema, partitioner, **kwargs) as writer:
        for batch, op in batches:
            writer.write(batch, op)
        return writer.commit()


def check_output(store, name, schema, partitioner, batches):
    """Every partition, and a few ranges, hold exactly the expected rows."""
    num_partitions = partitioner.num_partitions
    full_schema = shuffle_schema(schema)
    sizes = {info.key: info.size for info in store.list(name)}
    index = read_index(store, name, num_partitions, sizes[data_key(name)])
    expected = expected_by_partition(batches, partitioner)
    sizes = index.partition_sizes()
    for p in range(num_partitions):
        got, _ = read_rows(store, index, p, p + 1, full_schema)
        assert got == expected.get(p, Counter()), f"partition {p}"
        assert (sizes[p] == 0) == (p not in expected), f"partition {p} is empty iff no row maps to it"
    everything, _ = read_rows(store, index, 0, num_partitions, full_schema)
    assert everything == sum(expected.values(), Counter())
    return index, expected


# -- the property -------------------------------------------------------------------------------


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(output=_map_outputs(), data=st.data())
def test_round_trip_random_schemas_and_partitions(output, data):
    schema, keys, batches, num_partitions, buffer_bytes, block_bytes = output
    partitioner = HashPartitioner(num_partitions, keys)
    with tempfile.TemporaryDirectory() as root:
        store = LocalObjectStore(Path(root) / "store")
        spill_dir = Path(root) / "spill"
        spill_dir.mkdir()
        stats = write_output(
            store,
            "m",
            schema,
            partitioner,
            batches,
            buffer_bytes=buffer_bytes,
            block_bytes=block_bytes,
            spill_dir=str(spill_dir),
        )
        assert os.listdir(spill_dir) == []
        index, expected = check_output(store, "m", schema, partitioner, batches)
        assert stats.data_bytes == index.data_size
        assert stats.partition_sizes == index.partition_sizes().tolist()
        assert stats.rows == {
            op.name: sum(b.num_rows for b, o in batches if o == op) for op in (Op.DELETE, Op.INSERT)
        }
        full_schema = shuffle_schema(schema)
        most_blocks = max(
            (len(list(read_span(store, index, int(p), int(p) + 1, full_schema))) for p in expected),
            default=0,
        )
        event(f"P={num_partitions}")
        event(
            "no rows" if not expected else f"{min(stats.spills, 2)}+ spills, {min(stats.sort_runs, 2)}+ runs"
        )
        event("a partition has several blocks" if most_blocks > 1 else "one block per partition at most")
        event("whole-row key" if keys is None else f"{len(keys)} key column(s)")
        for _ in range(3):
            start = data.draw(st.integers(0, num_partitions), label="start")
            end = data.draw(st.integers(start, num_partitions), label="end")
            got, _ = read_rows(store, index, start, end, full_schema)
            want = sum((expected.get(p, Counter()) for p in expected if start <= p < end), Counter())
            assert got == want, f"range [{start}, {end})"


# -- examples -----------------------------------------------------------------------------------

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("name", pa.string()),
        ("score", pa.float64()),
        ("attrs", pa.map_(pa.string(), pa.list_(pa.int32()))),
    ]
)


def make_batch(start: int, stop: int) -> pa.RecordBatch:
    ids = np.arange(start, stop)
    return pa.record_batch(
        [
            pa.array(ids, pa.int64()),
            pa.array([f"name-{i}-" + "x" * (i % 17) for i in ids]),
            pa.array(np.where(ids % 11 == 0, np.nan, ids * 0.5)),
            pa.array(
                [[("k", [int(i), None]), ("j", None)] if i % 4 else None for i in ids],
                SCHEMA.field("attrs").type,
            ),
        ],
        schema=SCHEMA,
    )


@pytest.mark.parametrize("num_partitions", [1, 5, 10_000])
def test_zero_rows_gives_an_index_of_zeros(local_store, tmp_path, num_partitions):
    partitioner = HashPartitioner(num_partitions, ["id"])
    stats = write_output(
        local_store,
        "empty",
        SCHEMA,
        partitioner,
        [(make_batch(0, 0), Op.INSERT), (pa.Table.from_batches([], SCHEMA), Op.DELETE)],
        spill_dir=str(tmp_path),
    )
    assert local_store.get(index_key("empty")) == bytes(8 * (num_partitions + 1))
    assert local_store.get(data_key("empty")) == b""
    assert stats.data_bytes == 0
    assert stats.rows == {"DELETE": 0, "INSERT": 0}
    index = read_index(local_store, "empty", num_partitions, 0)
    before = local_store.requests["GET_RANGE"]
    assert list(read_span(local_store, index, 0, num_partitions, shuffle_schema(SCHEMA))) == []
    assert local_store.requests["GET_RANGE"] == before, "empty ranges need no request"


def test_empty_partitions_between_full_ones(local_store, tmp_path):
    # 3 rows over 64 partitions: most partitions are empty.
    batches = [(make_batch(0, 3), Op.INSERT)]
    partitioner = HashPartitioner(64, ["id"])
    write_output(local_store, "sparse", SCHEMA, partitioner, batches, spill_dir=str(tmp_path))
    index, expected = check_output(local_store, "sparse", SCHEMA, partitioner, batches)
    assert (index.partition_sizes() == 0).sum() >= 61
    assert sum(sum(c.values()) for c in expected.values()) == 3


def test_exception_inside_with_leaves_nothing_behind(local_store, tmp_path):
    spill_dir = tmp_path / "spills"
    spill_dir.mkdir()
    writer = MapOutputWriter(
        local_store,
        "failed",
        SCHEMA,
        HashPartitioner(8, ["id"]),
        buffer_bytes=4096,
        block_bytes=512,
        spill_dir=str(spill_dir),
    )
    with pytest.raises(RuntimeError, match="boom"), writer:
        for start in range(0, 2000, 100):
            writer.write(make_batch(start, start + 100), Op.INSERT)
        assert writer.stats.spills > 2
        assert os.listdir(spill_dir), "earlier spills should be on disk by now"
        raise RuntimeError("boom")
    assert os.listdir(spill_dir) == []
    assert local_store.list("") == []
    assert not local_store.root.exists() or list(local_store.root.rglob("*")) == []
    with pytest.raises(RuntimeError, match="closed"):
        writer.write(make_batch(0, 1), Op.INSERT)


def test_spill_files_removed_after_commit(local_store, tmp_path):
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    stats = write_output(
        local_store,
        "m",
        SCHEMA,
        HashPartitioner(8, ["id"]),
        [(make_batch(0, 3000), Op.INSERT)],
        buffer_bytes=8192,
        block_bytes=1024,
        spill_dir=str(spill_dir),
    )
    assert stats.spills > 2
    assert os.listdir(spill_dir) == []


def test_retried_writer_overwrites_cleanly(local_store, tmp_path):
    partitioner = HashPartitioner(16, ["id"])
    first = [(make_batch(0, 2000), Op.INSERT), (make_batch(5000, 5100), Op.DELETE)]
    second = [(make_batch(100, 400), Op.DELETE)]
    write_output(local_store, "retry/map-1", SCHEMA, partitioner, first, spill_dir=str(tmp_path))
    first_size = local_store.list("retry/")[0].size
    stats = write_output(
        local_store, "retry/map-1", SCHEMA, partitioner, second, buffer_bytes=4096, spill_dir=str(tmp_path)
    )
    objects = local_store.list("retry/")
    assert [o.key for o in objects] == [data_key("retry/map-1"), index_key("retry/map-1")]
    assert objects[0].size == stats.data_bytes < first_size
    check_output(local_store, "retry/map-1", SCHEMA, partitioner, second)
    # No temporary files of either attempt are left next to the objects.
    assert sorted(p.name for p in (local_store.root / "retry").iterdir()) == ["map-1.data", "map-1.index"]


def test_small_buffer_spills_and_matches_large_buffer(local_store, tmp_path):
    partitioner = HashPartitioner(32, ["id", "name"])
    batches = [
        (make_batch(i, i + 1000), Op.INSERT if i % 2000 else Op.DELETE) for i in range(0, 10_000, 1000)
    ]
    total_input = sum(b.nbytes for b, _ in batches)
    small = write_output(
        local_store,
        "small",
        SCHEMA,
        partitioner,
        batches,
        buffer_bytes=total_input // 20,
        block_bytes=2048,
        spill_dir=str(tmp_path),
    )
    large = write_output(
        local_store, "large", SCHEMA, partitioner, batches, block_bytes=2048, spill_dir=str(tmp_path)
    )
    assert large.spills == 0, "a task whose blocks fit the buffer never touches the disk"
    assert small.spills > 5, "the buffer must have been spilled many times, keeping memory bounded"
    assert small.rows == large.rows == {"DELETE": 5000, "INSERT": 5000}
    index_small, expected = check_output(local_store, "small", SCHEMA, partitioner, batches)
    index_large, _ = check_output(local_store, "large", SCHEMA, partitioner, batches)
    full_schema = shuffle_schema(SCHEMA)
    for p in range(partitioner.num_partitions):
        a, blocks_small = read_rows(local_store, index_small, p, p + 1, full_schema)
        b, blocks_large = read_rows(local_store, index_large, p, p + 1, full_schema)
        assert a == b == expected[p]
        assert len(blocks_small) > 1
        assert len(blocks_large) > 1, "block_bytes splits a partition even without spills"


def test_read_partitions_with_explicit_offsets(local_store, tmp_path):
    partitioner = HashPartitioner(6, ["id"])
    batches = [(make_batch(0, 500), Op.INSERT)]
    write_output(local_store, "m", SCHEMA, partitioner, batches, block_bytes=1024, spill_dir=str(tmp_path))
    index = read_index(local_store, "m", 6)
    expected = expected_by_partition(batches, partitioner)
    before = local_store.requests["GET_RANGE"]
    batches_read = list(read_partitions(local_store, "m", index.offsets[2:6], 2, shuffle_schema(SCHEMA)))
    assert local_store.requests["GET_RANGE"] == before + 1, "one ranged GET for the whole range"
    got = Counter()
    for batch in batches_read:
        got.update(
            zip(row_keys(batch.drop_columns([OP_COLUMN])), batch.column(OP_COLUMN).to_pylist(), strict=True)
        )
    assert got == expected[2] + expected[3] + expected[4]


def test_index_is_written_after_the_data_object(tmp_path):
    events: list[str] = []

    class RecordingStore(LocalObjectStore):
        def open_writer(self, key):
            inner = super().open_writer(key)
            events.append(f"open {key}")
            close = inner.close

            def recording_close():
                size = close()
                events.append(f"visible {key}")
                return size

            inner.close = recording_close
            return inner

    store = RecordingStore(tmp_path / "store")
    write_output(store, "m", SCHEMA, HashPartitioner(4, ["id"]), [(make_batch(0, 100), Op.INSERT)])
    assert events == ["open m.data", "visible m.data", "open m.index", "visible m.index"]


def test_writer_accepts_tables_and_reordered_columns(local_store, tmp_path):
    partitioner = HashPartitioner(5, ["id"])
    batch = make_batch(0, 300)
    table = pa.Table.from_batches([batch.slice(0, 100), batch.slice(100, 100)])
    reordered = batch.slice(200).select(["attrs", "score", "name", "id"])
    with MapOutputWriter(local_store, "m", SCHEMA, partitioner, spill_dir=str(tmp_path)) as writer:
        writer.write(table, Op.INSERT)
        writer.write(reordered, Op.DELETE)
        writer.commit()
    check_output(
        local_store,
        "m",
        SCHEMA,
        partitioner,
        [(batch.slice(0, 200), Op.INSERT), (batch.slice(200), Op.DELETE)],
    )


def test_op_column_name_is_reserved():
    with pytest.raises(SinkSchemaError, match=r"reserves.*rename the source column"):
        shuffle_schema(pa.schema([(OP_COLUMN, pa.int8())]))


# -- batches read back are ordinary Arrow data ----------------------------------------------------

WIDE_SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("amount", pa.decimal128(18, 2)),
        ("at", pa.timestamp("us", tz="UTC")),
        ("ratio", pa.float64()),
        ("small", pa.int32()),
    ]
)


def make_wide_batch(n: int) -> pa.RecordBatch:
    ids = np.arange(n, dtype=np.int64)
    return pa.record_batch(
        [
            pa.array(ids),
            pa.array([decimal.Decimal(int(i) * 7) / 100 for i in ids], pa.decimal128(18, 2)),
            pa.array(ids * 1_000_003, pa.timestamp("us", tz="UTC")),
            pa.array(ids / 3),
            pa.array(ids.astype(np.int32)),
        ],
        schema=WIDE_SCHEMA,
    )


@pytest.fixture
def wide_output(local_store, tmp_path):
    batch = make_wide_batch(200)
    partitioner = HashPartitioner(4, ["id"])
    write_output(local_store, "wide", WIDE_SCHEMA, partitioner, [(batch, Op.INSERT)], spill_dir=str(tmp_path))
    index = read_index(local_store, "wide", 4)
    batches = list(read_span(local_store, index, 0, 4, shuffle_schema(WIDE_SCHEMA)))
    assert sum(b.num_rows for b in batches) == 200
    return batch, batches


def test_read_back_buffers_are_8_byte_aligned(wide_output):
    # The Arrow format requires every buffer to start on an 8-byte boundary; consumers
    # that import through the C data interface (arrow-rs, hence pyiceberg-core) rely on it.
    _, batches = wide_output
    misaligned = {
        (field.name, i, buf.address % 8)
        for batch in batches
        for field, column in zip(batch.schema, batch.columns, strict=True)
        for i, buf in enumerate(column.buffers())
        if buf is not None and buf.address % 8
    }
    assert misaligned == set(), "buffers (column, buffer number, address mod 8) not 8-byte aligned"


@pytest.mark.parametrize("key", ["id", "amount", "at", "small", "ratio"])
def test_read_back_rows_can_be_hashed_again(local_store, tmp_path, key):
    # A SHUFFLE_READ task may hash (or bucket) the rows it reads; they must hash as written.
    batch = make_wide_batch(300)
    partitioner = HashPartitioner(5, [key])
    write_output(local_store, "m", WIDE_SCHEMA, partitioner, [(batch, Op.INSERT)], spill_dir=str(tmp_path))
    index = read_index(local_store, "m", 5)
    for p in range(5):
        for read in read_span(local_store, index, p, p + 1, shuffle_schema(WIDE_SCHEMA)):
            assert (partitioner.partitions(read.drop_columns([OP_COLUMN])) == p).all()


def test_highly_compressible_blocks_round_trip(local_store, tmp_path):
    # Zeros compress about 255:1, the most LZ4 can do; such blocks must not look corrupt.
    schema = pa.schema([("id", pa.int64()), ("zero", pa.int64())])
    n = 1_000_000
    batch = pa.record_batch(
        [pa.array(np.zeros(n, dtype=np.int64)), pa.array(np.zeros(n, dtype=np.int64))], schema=schema
    )
    partitioner = HashPartitioner(2, ["id"])
    stats = write_output(
        local_store,
        "zeros",
        schema,
        partitioner,
        [(batch, Op.INSERT)],
        block_bytes=64 << 20,
        spill_dir=str(tmp_path),
    )
    assert stats.data_bytes < batch.nbytes / 200
    index = read_index(local_store, "zeros", 2, stats.data_bytes)
    read = list(read_span(local_store, index, 0, 2, shuffle_schema(schema)))
    assert len(read) == 1
    assert read[0].num_rows == n
    assert pc.sum(read[0].column("zero")).as_py() == 0
    assert pc.sum(read[0].column(OP_COLUMN)).as_py() == n

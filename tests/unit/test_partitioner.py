"""HashPartitioner and canonical.encode: pinned values and properties.

The partition of a row must be the same on every machine, process, library
version and batch layout, or the two halves of an update pair land on
different reducers. The pinned lists below were computed once and must never
change; if one does, every existing shuffle layout (and any plan mixing old and
new workers) breaks.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import struct
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg_core.transform import bucket

from iceberg_cdc import canonical
from iceberg_cdc.changelog.merge import group_ids, merge_changes
from iceberg_cdc.errors import ConfigError
from iceberg_cdc.shuffle.partitioner import NULL_HASH, HashPartitioner, column_hash, combined_hash
from iceberg_cdc.shuffle.rows import OP_COLUMN

# -- the Iceberg spec's hash values (Appendix B) ---------------------------------------------------

MAX_INT = 0x7FFFFFFF


def _spec(h: int) -> int:
    """The spec lists signed 32-bit hashes; column_hash keeps their low 31 bits."""
    return h & MAX_INT


@pytest.mark.parametrize(
    ("array", "spec_hash"),
    [
        pytest.param(pa.array([34], pa.int32()), 2017239379, id="int"),
        pytest.param(pa.array([34], pa.int64()), 2017239379, id="long"),
        pytest.param(pa.array([decimal.Decimal("14.20")], pa.decimal128(9, 2)), -500754589, id="decimal"),
        pytest.param(pa.array([dt.date(2017, 11, 16)]), -653330422, id="date"),
        pytest.param(pa.array([dt.time(22, 31, 8)], pa.time64("us")), -662762989, id="time"),
        pytest.param(
            pa.array([dt.datetime(2017, 11, 16, 22, 31, 8)], pa.timestamp("us")), -2047944441, id="ts"
        ),
        pytest.param(
            pa.array(
                [dt.datetime(2017, 11, 16, 14, 31, 8, tzinfo=dt.timezone(dt.timedelta(hours=-8)))],
                pa.timestamp("us", tz="UTC"),
            ),
            -2047944441,
            id="timestamptz",
        ),
        pytest.param(pa.array(["iceberg"]), 1210000089, id="string"),
        pytest.param(pa.array(["iceberg"], pa.large_string()), 1210000089, id="large_string"),
        pytest.param(
            pa.array([uuid.UUID("f79c3e09-677c-4bbd-a479-3f349cb785e7").bytes], pa.binary(16)),
            1488055340,
            id="uuid-fixed16",
        ),
        pytest.param(
            pa.array([uuid.UUID("f79c3e09-677c-4bbd-a479-3f349cb785e7")], pa.uuid()), 1488055340, id="uuid"
        ),
        pytest.param(pa.array([b"\x00\x01\x02\x03"], pa.binary(4)), -188683207, id="fixed"),
        pytest.param(pa.array([b"\x00\x01\x02\x03"]), -188683207, id="binary"),
    ],
)
def test_column_hash_matches_the_iceberg_spec(array, spec_hash):
    assert column_hash(array).tolist() == [_spec(spec_hash)]


def test_pinned_spec_values():
    assert column_hash(pa.array([34], pa.int64())).tolist() == [2017239379]
    assert column_hash(pa.array([34], pa.int32())).tolist() == [2017239379]
    assert column_hash(pa.array(["iceberg"])).tolist() == [1210000089]
    assert column_hash(pa.array([None, None], pa.int64())).tolist() == [int(NULL_HASH)] * 2
    assert int(NULL_HASH) == 0x2F3A5B71


# -- one key column: the Iceberg bucket transform ---------------------------------------------------

IDENTIFIER_ARRAYS = {
    "int": pa.array([0, 1, -1, 34, None, 2**31 - 1, -(2**31)], pa.int32()),
    "long": pa.array([0, 1, -1, 34, None, 2**63 - 1, -(2**63)], pa.int64()),
    "string": pa.array(["", "iceberg", None, "é", "日本語", "\U0001f600", "a" * 300]),
    "date": pa.array(
        [dt.date(1970, 1, 1), dt.date(2017, 11, 16), None, dt.date(1, 1, 1), dt.date(9999, 12, 31)]
    ),
    "time": pa.array([dt.time(0), dt.time(22, 31, 8), None, dt.time(23, 59, 59, 999999)], pa.time64("us")),
    "timestamp": pa.array(
        [dt.datetime(2017, 11, 16, 22, 31, 8), None, dt.datetime(1900, 1, 1, 0, 0, 0, 1)], pa.timestamp("us")
    ),
    "timestamptz": pa.array(
        [dt.datetime(2017, 11, 16, 22, 31, 8, tzinfo=dt.UTC), None, dt.datetime(1969, 12, 31, tzinfo=dt.UTC)],
        pa.timestamp("us", tz="UTC"),
    ),
    "decimal": pa.array(
        [
            decimal.Decimal("14.20"),
            decimal.Decimal("-0.01"),
            None,
            decimal.Decimal("0.00"),
            decimal.Decimal("1e15"),
        ],
        pa.decimal128(20, 2),
    ),
    "uuid-fixed16": pa.array([uuid.UUID(int=i).bytes for i in (0, 1, 2**128 - 1)] + [None], pa.binary(16)),
    "uuid": pa.array([uuid.UUID(int=i) for i in (0, 1, 2**128 - 1)] + [None], pa.uuid()),
    "fixed": pa.array([b"\x00\x01\x02\x03", b"abcd", None], pa.binary(4)),
    "binary": pa.array([b"", b"\x00", b"\x00\x01\x02\x03", None, bytes(range(256))]),
    "bool": pa.array([True, False, None]),
}


def _storage(array: pa.Array) -> pa.Array:
    return array.storage if isinstance(array.type, pa.ExtensionType) else array


@pytest.mark.parametrize("num_partitions", [1, 2, 7, 64, 10_000])
@pytest.mark.parametrize("name", list(IDENTIFIER_ARRAYS))
def test_single_key_is_the_bucket_transform(name, num_partitions):
    array = IDENTIFIER_ARRAYS[name]
    batch = pa.record_batch([array], names=["k"])
    partitions = HashPartitioner(num_partitions, ["k"]).partitions(batch)
    assert partitions.dtype == np.int32
    assert ((partitions >= 0) & (partitions < num_partitions)).all()
    valid = np.asarray(array.is_valid())
    # Booleans are not an Iceberg bucket type: they hash as the equal int.
    hashable = pc.cast(array, pa.int32()) if name == "bool" else _storage(array)
    expected = bucket(hashable, num_partitions).to_numpy(zero_copy_only=False)
    assert partitions[valid].tolist() == expected[valid].astype(np.int64).tolist()
    assert (partitions[~valid] == int(NULL_HASH) % num_partitions).all()
    # and the same again, sliced and chunked
    for start in range(len(array)):
        sliced = HashPartitioner(num_partitions, ["k"]).partitions(batch.slice(start))
        assert sliced.tolist() == partitions[start:].tolist()
    table = pa.Table.from_batches([batch.slice(0, 2), batch.slice(2)])
    assert HashPartitioner(num_partitions, ["k"]).partitions(table).tolist() == partitions.tolist()


@pytest.mark.parametrize("name", list(IDENTIFIER_ARRAYS))
def test_every_identifier_type_works_among_several_keys(name):
    array = IDENTIFIER_ARRAYS[name]
    other = pa.array(range(len(array)), pa.int64())
    batch = pa.record_batch([other, array], names=["o", "k"])
    partitions = HashPartitioner(13, ["o", "k"]).partitions(batch)
    assert ((partitions >= 0) & (partitions < 13)).all()
    assert HashPartitioner(13, ["o", "k"]).partitions(batch.slice(1)).tolist() == partitions[1:].tolist()


def test_equal_values_of_other_widths_hash_alike():
    # "an int hashes like the equal long"; narrower types map onto the spec's.
    values = [0, 1, -1, 34, 127, None]
    base = column_hash(pa.array(values, pa.int64()))
    for typ in (pa.int8(), pa.int16(), pa.int32()):
        assert (column_hash(pa.array(values, typ)) == base).all(), typ
    unsigned = [0, 1, 34, 255, None]
    base = column_hash(pa.array(unsigned, pa.int64()))
    for typ in (pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()):
        assert (column_hash(pa.array(unsigned, typ)) == base).all(), typ
    assert (
        column_hash(pa.array([True, False, None])) == column_hash(pa.array([1, 0, None], pa.int32()))
    ).all()
    moments = [dt.datetime(2017, 11, 16, 22, 31, 8), None]
    base = column_hash(pa.array(moments, pa.timestamp("us")))
    for unit in ("s", "ms"):
        assert (column_hash(pa.array(moments, pa.timestamp(unit))) == base).all(), unit
    times = [dt.time(22, 31, 8), None]
    assert (
        column_hash(pa.array(times, pa.time32("s"))) == column_hash(pa.array(times, pa.time64("us")))
    ).all()
    days = [dt.date(2017, 11, 16), None]
    assert (column_hash(pa.array(days, pa.date64())) == column_hash(pa.array(days, pa.date32()))).all()
    assert (column_hash(pa.array([1.5, None], pa.float32())) == column_hash(pa.array([1.5, None]))).all()


# -- pinned partitions -------------------------------------------------------------------------------


def _multi_column_table() -> pa.Table:
    return pa.table(
        {
            "tenant": pa.array(["acme", "globex", None, "acme", "", "日本"], pa.string()),
            "id": pa.array([1, 2, 3, None, -5, 2**62], pa.int64()),
            "day": pa.array(
                [
                    dt.date(2024, 1, 1),
                    dt.date(1970, 1, 1),
                    None,
                    dt.date(2000, 2, 29),
                    dt.date(1, 1, 1),
                    dt.date(9999, 12, 31),
                ]
            ),
        }
    )


def _nested_table() -> pa.Table:
    return pa.table(
        {
            "k": pa.array([1, 1, 2, None], pa.int32()),
            "s": pa.array(
                [{"a": 1, "b": "x"}, None, {"a": None, "b": ""}, {"a": 3, "b": None}],
                pa.struct([("a", pa.int16()), ("b", pa.string())]),
            ),
            "l": pa.array([[1.5, None], [], None, [float("nan"), -0.0]], pa.list_(pa.float64())),
            "m": pa.array([[("x", 1)], None, [], [("y", None), ("z", 2)]], pa.map_(pa.string(), pa.int64())),
            "f": pa.array([0.5, -0.0, None, float("nan")], pa.float32()),
            "b": pa.array([True, False, None, True]),
        }
    )


def test_pinned_multi_column_partitions():
    table = _multi_column_table()
    assert combined_hash([table["tenant"], table["id"]]).tolist() == [
        3642712286,
        3877843929,
        3532840338,
        2267807312,
        1550440529,
        3027516437,
    ]
    assert HashPartitioner(16, ["tenant", "id"]).partitions(table).tolist() == [14, 9, 2, 0, 1, 5]
    assert HashPartitioner(1000, ["tenant", "id", "day"]).partitions(table).tolist() == [
        166,
        369,
        671,
        162,
        386,
        349,
    ]


def test_pinned_whole_row_partitions_with_nested_columns():
    table = _nested_table()
    assert combined_hash([table[c] for c in table.column_names]).tolist() == [
        2805274972,
        2287757463,
        4074549433,
        1791531240,
    ]
    assert HashPartitioner(16).partitions(table).tolist() == [12, 7, 9, 8]
    assert HashPartitioner(10_000, []).partitions(table).tolist() == [4972, 7463, 9433, 1240]
    assert HashPartitioner(16, None).partitions(table.to_batches()[0]).tolist() == [12, 7, 9, 8]


def test_key_column_order_matters_and_missing_keys_are_named():
    table = _multi_column_table()
    ab = HashPartitioner(1000, ["tenant", "id"]).partitions(table)
    ba = HashPartitioner(1000, ["id", "tenant"]).partitions(table)
    assert ab.tolist() != ba.tolist()
    with pytest.raises(ConfigError, match=r"\['nope'\] are not in the data.*tables\[\]\.identifier_columns"):
        HashPartitioner(4, ["id", "nope"]).partitions(table)


@pytest.mark.parametrize("bad", [0, -1, 2**31])
def test_number_of_partitions_is_validated(bad):
    with pytest.raises(ConfigError, match=r"number of shuffle partitions.*shuffle\.partitions"):
        HashPartitioner(bad)


def test_empty_batch():
    assert HashPartitioner(8, ["id"]).partitions(_multi_column_table().slice(0, 0)).tolist() == []


# -- floats -----------------------------------------------------------------------------------------------


def _nan(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


# NaNs that differ bit for bit (quiet, negative, with a payload): equal values for the merge.
_NANS = [float("nan"), _nan(0xFFF8000000000000), _nan(0x7FF800000000BEEF)]


@pytest.mark.parametrize("typ", [pa.float32(), pa.float64()])
def test_signed_zeros_and_nans_share_a_partition(typ):
    nans = [float("nan"), -float("nan"), _nan(0x7FF8000000000001), _nan(0xFFF0000000000F00)]
    array = pa.array([0.0, -0.0, *nans, 1.0], typ)
    if typ == pa.float64():
        bits = array.to_numpy().view(np.uint64)
        assert len(set(bits[2:6].tolist())) == 4, "the NaNs really do differ bit for bit"
    ids = pa.array([7] * len(array), pa.int64())
    for partitioner, batch in [
        (HashPartitioner(10_000, ["x"]), pa.record_batch([array], names=["x"])),
        (HashPartitioner(10_000, ["id", "x"]), pa.record_batch([ids, array], names=["id", "x"])),
    ]:
        partitions = partitioner.partitions(batch).tolist()
        assert partitions[0] == partitions[1], "-0.0 and 0.0"
        assert len(set(partitions[2:6])) == 1, "all NaNs"
    assert column_hash(array)[0] != column_hash(array)[2]


_NAN_BITS = {
    pa.float32(): (np.uint32, [0x7FC00000, 0xFFC00000, 0x7FC00123, 0x7F800001]),
    pa.float64(): (
        np.uint64,
        [0x7FF8000000000000, 0xFFF8000000000000, 0x7FF800000000BEEF, 0x7FF0000000000001],
    ),
}


def _nan_column(typ: pa.DataType) -> pa.Array:
    """NaNs that differ bit for bit, built from their bits (a Python float would quiet a signalling NaN)."""
    unsigned, bits = _NAN_BITS[typ]
    return pa.array(np.array(bits, dtype=unsigned).view(typ.to_pandas_dtype()), typ)


def _in_form(column: pa.Array, form: str) -> pa.Array:
    n = len(column)
    one_each = pa.array(np.arange(n + 1, dtype=np.int32))
    if form == "struct":
        return pa.StructArray.from_arrays([column, pa.array(["s"] * n)], ["f", "s"])
    if form == "list":
        return pa.ListArray.from_arrays(one_each, column)
    if form == "map":
        return pa.MapArray.from_arrays(one_each, pa.array(["k"] * n), column)
    return column


@pytest.mark.parametrize("typ", [pa.float32(), pa.float64()], ids=str)
@pytest.mark.parametrize("form", ["top", "struct", "list", "map"])
def test_whole_row_mode_sends_rows_with_different_nans_to_one_partition(typ, form):
    # Whole-row mode hashes every column: rows the merge finds equal must meet in one read task,
    # or a NaN row rewritten by another engine (other payload) would never cancel as carryover.
    nans = _nan_column(typ)
    n = len(nans)
    rows = pa.table({"id": pa.array([3] * n, pa.int64()), "v": _in_form(nans, form)})
    for partitioner in (HashPartitioner(10_000), HashPartitioner(10_000, ["id", "v"])):
        assert len(set(partitioner.partitions(rows).tolist())) == 1, partitioner.key_columns

    # End to end: each NaN row deleted and re-inserted with another payload, partitioned, merged per
    # partition: everything is carryover.
    deleted, inserted = rows, rows.take(pa.array(np.roll(np.arange(n), 1)))
    both = pa.concat_tables([deleted, inserted]).append_column(
        OP_COLUMN, pa.array([0] * n + [1] * n, pa.int8())
    )
    partitions = HashPartitioner(16).partitions(both.drop_columns([OP_COLUMN]))
    for partition in np.unique(partitions):
        out, _ = merge_changes(both.filter(pa.array(partitions == partition)))
        assert out.num_rows == 0


# -- distribution -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("keys", [["id"], ["id", "group"]])
def test_sequential_longs_spread_evenly(keys):
    n, num_partitions = 100_000, 64
    ids = np.arange(n, dtype=np.int64)
    batch = pa.record_batch([pa.array(ids), pa.array(ids % 3, pa.int32())], names=["id", "group"])
    counts = np.bincount(HashPartitioner(num_partitions, keys).partitions(batch), minlength=num_partitions)
    mean = n / num_partitions
    assert counts.min() >= 0.8 * mean, counts
    assert counts.max() <= 1.2 * mean, counts


# -- layout independence (property) -----------------------------------------------------------------------

_KEY_TYPES = [
    pa.int8(),
    pa.int32(),
    pa.int64(),
    pa.uint64(),
    pa.float32(),
    pa.float64(),
    pa.string(),
    pa.binary(),
    pa.bool_(),
    pa.date32(),
    pa.decimal128(12, 3),
    pa.timestamp("us", tz="UTC"),
    pa.list_(pa.string()),
    pa.struct([("a", pa.int64()), ("b", pa.string())]),
    pa.map_(pa.string(), pa.int32()),
    pa.list_(pa.float32()),
    pa.struct([("x", pa.float64())]),
]


def _column_values(typ: pa.DataType) -> st.SearchStrategy:
    """Few distinct values, so equal values at different positions are common."""
    small = st.integers(-3, 3)
    if pa.types.is_unsigned_integer(typ):
        base = st.sampled_from([0, 1, 2**63, 2**64 - 1])
    elif pa.types.is_integer(typ):
        base = small
    elif pa.types.is_floating(typ):
        base = st.sampled_from([0.0, -0.0, 1.5, float("inf"), *_NANS])
    elif pa.types.is_string(typ):
        base = st.sampled_from(["", "a", "é", "日本"])
    elif pa.types.is_binary(typ):
        base = st.sampled_from([b"", b"\x00", b"ab"])
    elif pa.types.is_boolean(typ):
        base = st.booleans()
    elif pa.types.is_date(typ):
        base = st.sampled_from([dt.date(1970, 1, 1), dt.date(2024, 2, 29)])
    elif pa.types.is_decimal(typ):
        base = st.sampled_from([decimal.Decimal("0.000"), decimal.Decimal("-1.250")])
    elif pa.types.is_timestamp(typ):
        base = st.sampled_from(
            [dt.datetime(2024, 1, 1, tzinfo=dt.UTC), dt.datetime(1969, 7, 20, tzinfo=dt.UTC)]
        )
    elif pa.types.is_list(typ) and pa.types.is_floating(typ.value_type):
        base = st.lists(st.none() | st.sampled_from([0.0, -0.0, *_NANS]), max_size=2)
    elif pa.types.is_list(typ):
        base = st.lists(st.none() | st.sampled_from(["x", "y"]), max_size=2)
    elif pa.types.is_struct(typ) and typ.names == ["x"]:
        base = st.fixed_dictionaries({"x": st.none() | st.sampled_from([0.0, -0.0, *_NANS])})
    elif pa.types.is_struct(typ):
        base = st.fixed_dictionaries({"a": st.none() | small, "b": st.none() | st.sampled_from(["p", "q"])})
    elif pa.types.is_map(typ):
        base = st.lists(st.tuples(st.sampled_from(["k", "l"]), st.none() | small), max_size=2)
    else:
        raise AssertionError(typ)
    return st.none() | base


@st.composite
def _batches(draw):
    types = draw(st.lists(st.sampled_from(_KEY_TYPES), min_size=1, max_size=4))
    n = draw(st.integers(1, 30))
    columns = [pa.array(draw(st.lists(_column_values(t), min_size=n, max_size=n)), t) for t in types]
    batch = pa.record_batch(columns, names=[f"c{i}" for i in range(len(types))])
    keys = draw(st.none() | st.lists(st.sampled_from(batch.schema.names), min_size=1, unique=True))
    num_partitions = draw(st.sampled_from([1, 2, 7, 10_000]))
    return batch, keys, num_partitions


def _relayout(batch: pa.RecordBatch) -> pa.Table:
    """The same rows with dictionary-encoded strings and large_string/large_binary columns."""
    columns = []
    for column in batch.columns:
        if pa.types.is_string(column.type):
            column = pc.cast(column, pa.large_string()).dictionary_encode()
        elif pa.types.is_binary(column.type):
            column = pc.cast(column, pa.large_binary())
        elif pa.types.is_integer(column.type) or pa.types.is_date(column.type):
            column = column.dictionary_encode()
        columns.append(column)
    return pa.Table.from_arrays(columns, names=batch.schema.names)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_batches(), data=st.data())
def test_partitions_depend_only_on_the_row_values(case, data):
    batch, keys, num_partitions = case
    partitioner = HashPartitioner(num_partitions, keys)
    partitions = partitioner.partitions(batch)
    assert ((partitions >= 0) & (partitions < num_partitions)).all()

    # slicing
    start = data.draw(st.integers(0, batch.num_rows - 1), label="start")
    length = data.draw(st.integers(0, batch.num_rows - start), label="length")
    assert (
        partitioner.partitions(batch.slice(start, length)).tolist()
        == partitions[start : start + length].tolist()
    )

    # chunking
    cut = data.draw(st.integers(0, batch.num_rows), label="cut")
    table = pa.Table.from_batches([batch.slice(0, cut), batch.slice(cut)])
    assert partitioner.partitions(table).tolist() == partitions.tolist()

    # dictionary encoding, string vs large_string, binary vs large_binary
    assert partitioner.partitions(_relayout(batch)).tolist() == partitions.tolist()

    # equal rows at other positions (reversed, then shuffled)
    order = data.draw(st.permutations(range(batch.num_rows)), label="order")
    reordered = batch.take(pa.array(order, pa.int64()))
    assert partitioner.partitions(reordered).tolist() == partitions[order].tolist()

    # rows with equal keys share a partition
    key_names = keys or batch.schema.names
    seen: dict = {}
    for row, partition in zip(batch.select(key_names).to_pylist(), partitions.tolist(), strict=True):
        assert seen.setdefault(_freeze(row), partition) == partition
    # ... equal as the merge sees them: its groups never straddle partitions
    gids, groups = group_ids([batch.column(name) for name in key_names])
    assert (np.bincount(gids, minlength=groups) > 0).all()
    first = np.full(groups, -1)
    first[gids[::-1]] = partitions[::-1]
    assert (first[gids] == partitions).all()


def test_null_keys_are_deterministic():
    n = 50
    nulls = pa.record_batch(
        [pa.nulls(n, pa.int64()), pa.nulls(n, pa.string()), pa.nulls(n, pa.null())], names=["a", "b", "c"]
    )
    for keys in (["a"], ["b"], ["c"], ["a", "b"], None):
        partitions = HashPartitioner(97, keys).partitions(nulls)
        assert len(set(partitions.tolist())) == 1, keys
        assert HashPartitioner(97, keys).partitions(nulls.slice(17, 3)).tolist() == partitions[:3].tolist()
    assert HashPartitioner(97, ["a"]).partitions(nulls)[0] == int(NULL_HASH) % 97
    # a null key and a non-null key that happen to meet do so only by chance, never by design
    mixed = pa.record_batch([pa.array([None, 0, None], pa.int64())], names=["a"])
    first, _, third = HashPartitioner(97, ["a"]).partitions(mixed).tolist()
    assert first == third


# -- canonical.encode ------------------------------------------------------------------------------------


def _freeze(value):
    """Exact, hashable form of a to_pylist value: floats by their bits (-0.0 != 0.0), every NaN one value."""
    if isinstance(value, float):
        return ("float", "NaN") if math.isnan(value) else ("float", struct.pack("<d", value))
    if isinstance(value, dict):
        return tuple((k, _freeze(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


_LEAVES = [
    pa.int8(),
    pa.int64(),
    pa.float64(),
    pa.string(),
    pa.large_binary(),
    pa.bool_(),
    pa.decimal128(5, 2),
]


def _nested_types() -> st.SearchStrategy[pa.DataType]:
    def extend(children):
        return (
            st.lists(children, min_size=1, max_size=3).map(
                lambda ts: pa.struct([pa.field(f"f{i}", t) for i, t in enumerate(ts)])
            )
            | st.builds(pa.list_, children)
            | st.builds(pa.large_list, children)
            | st.builds(lambda t: pa.list_(t, 2), children)
            | st.builds(pa.map_, st.sampled_from([pa.string(), pa.int32()]), children)
        )

    return st.recursive(st.sampled_from(_LEAVES), extend, max_leaves=4).filter(pa.types.is_nested)


def _nested_values(typ: pa.DataType) -> st.SearchStrategy:
    if pa.types.is_struct(typ):
        inner = st.fixed_dictionaries({f.name: _nested_values(f.type) for f in typ})
    elif pa.types.is_map(typ):
        key = st.sampled_from(["", "k"]) if pa.types.is_string(typ.key_type) else st.integers(0, 1)
        inner = st.lists(st.tuples(key, _nested_values(typ.item_type)), max_size=2)
    elif pa.types.is_fixed_size_list(typ):
        inner = st.lists(_nested_values(typ.value_type), min_size=typ.list_size, max_size=typ.list_size)
    elif pa.types.is_list(typ) or pa.types.is_large_list(typ):
        inner = st.lists(_nested_values(typ.value_type), max_size=2)
    elif pa.types.is_integer(typ):
        inner = st.integers(-1, 1)
    elif pa.types.is_floating(typ):
        inner = st.sampled_from([0.0, -0.0, 1.0, *_NANS])
    elif pa.types.is_string(typ):
        inner = st.sampled_from(["", "a", "\x00"])
    elif pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
        inner = st.sampled_from([b"", b"a", b"\x00"])
    elif pa.types.is_boolean(typ):
        inner = st.booleans()
    elif pa.types.is_decimal(typ):
        inner = st.sampled_from([decimal.Decimal("0.00"), decimal.Decimal("-1.01")])
    else:
        raise AssertionError(typ)
    return st.none() | inner


@st.composite
def _nested_arrays(draw):
    typ = draw(_nested_types())
    values = draw(st.lists(_nested_values(typ), min_size=1, max_size=16))
    return pa.array(values, typ)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(array=_nested_arrays(), data=st.data())
def test_encode_is_injective_and_slice_independent(array, data):
    encoded = canonical.encode(array)
    assert encoded.type == pa.large_binary()
    assert len(encoded) == len(array)
    encoded.validate(full=True)
    codes = encoded.to_pylist()
    values = [_freeze(v) for v in array.to_pylist()]
    assert [c is None for c in codes] == [v is None for v in values], "top-level nulls stay null"
    for i in range(len(values)):
        for j in range(len(values)):
            assert (codes[i] == codes[j]) == (values[i] == values[j]), (array[i], array[j])

    start = data.draw(st.integers(0, len(array)), label="start")
    length = data.draw(st.integers(0, len(array) - start), label="length")
    assert canonical.encode(array.slice(start, length)).to_pylist() == codes[start : start + length]
    chunked = pa.chunked_array([array.slice(0, start), array.slice(start)], array.type)
    assert canonical.encode(chunked).to_pylist() == codes


def test_encode_hidden_values_under_nulls_do_not_matter():
    # The same logical values built with different bytes hidden under null slots.
    clean = pa.array([[1, 2], None, [3]], pa.list_(pa.int64()))
    dirty = pa.ListArray.from_arrays(
        pa.array([0, 2, 5, 6], pa.int32()),
        pa.array([1, 2, 9, 9, 9, 3], pa.int64()),
        mask=pa.array([False, True, False]),
    )
    assert dirty.to_pylist() == clean.to_pylist()
    assert canonical.encode(dirty).to_pylist() == canonical.encode(clean).to_pylist()

    struct_type = pa.struct([("a", pa.int64()), ("b", pa.string())])
    clean = pa.array([{"a": 1, "b": "x"}, None], struct_type)
    dirty = pa.StructArray.from_arrays(
        [pa.array([1, 99]), pa.array(["x", "hidden"])], fields=list(struct_type), mask=pa.array([False, True])
    )
    assert dirty.to_pylist() == clean.to_pylist()
    assert canonical.encode(dirty).to_pylist() == canonical.encode(clean).to_pylist()

    map_type = pa.map_(pa.string(), pa.int64())
    clean = pa.array([[("k", 1)], None, [("j", 2)]], map_type)
    dirty = pa.MapArray.from_arrays(
        pa.array([0, 1, 3, 4], pa.int32()),
        pa.array(["k", "h1", "h2", "j"]),
        pa.array([1, 5, 6, 2]),
        type=map_type,
        mask=pa.array([False, True, False]),
    )
    assert dirty.to_pylist() == clean.to_pylist()
    assert canonical.encode(dirty).to_pylist() == canonical.encode(clean).to_pylist()


def test_encode_distinguishes_null_empty_and_nested_nulls():
    typ = pa.list_(pa.string())
    array = pa.array([None, [], [None], [""], ["", ""], [None, None]], typ)
    codes = canonical.encode(array).to_pylist()
    assert codes[0] is None
    assert len(set(codes[1:])) == 5
    struct_type = pa.struct([("a", pa.string()), ("b", pa.string())])
    pair = pa.array(
        [{"a": "ab", "b": ""}, {"a": "a", "b": "b"}, {"a": None, "b": "ab"}, {"a": "", "b": "ab"}],
        struct_type,
    )
    assert len(set(canonical.encode(pair).to_pylist())) == 4


def test_uuid_extension_hashes_like_its_storage():
    # canonical.plain promises "extension columns (uuid) use their storage"; pa.uuid() is a
    # C++-defined extension type (pa.BaseExtensionType, not the Python pa.ExtensionType).
    values = [uuid.UUID(int=i) for i in (0, 1, 12345, 2**128 - 1)]
    ext = pa.array([*values, None], pa.uuid())
    fixed = pa.array([u.bytes for u in values] + [None], pa.binary(16))
    assert canonical.plain(ext).type == pa.binary(16)
    assert column_hash(ext).tolist() == column_hash(fixed).tolist()
    ids = pa.array(range(5), pa.int64())
    as_ext = pa.record_batch([ids, ext], names=["id", "u"])
    as_fixed = pa.record_batch([ids, fixed], names=["id", "u"])
    assert HashPartitioner(64, ["id", "u"]).partitions(as_ext).tolist() == (
        HashPartitioner(64, ["id", "u"]).partitions(as_fixed).tolist()
    )


# -- identifier fields nested in structs ---------------------------------------------------------------


def test_nested_identifier_partitions_like_the_same_values_at_top_level():
    ids = pa.array([1, 2, None, 2**40, -7], pa.int64())
    tenants = pa.array(["a", "b", "c", None, ""], pa.string())
    nested = pa.table(
        {
            "k": pa.StructArray.from_arrays([tenants, ids], ["tenant", "id"]),
            "v": pa.array([0.5] * 5),
        }
    )
    flat = pa.table({"tenant": tenants, "id": ids})
    assert (
        HashPartitioner(97, ["k.id"]).partitions(nested).tolist()
        == HashPartitioner(97, ["id"]).partitions(flat).tolist()
    )
    assert (
        HashPartitioner(97, ["k.tenant", "k.id"]).partitions(nested.to_batches()[0]).tolist()
        == HashPartitioner(97, ["tenant", "id"]).partitions(flat).tolist()
    )
    # a null parent struct gives a null key, which has one fixed partition
    null_parent = pa.table(
        {"k": pa.StructArray.from_arrays([ids], ["id"], mask=pa.array([True, False, False, False, True]))}
    )
    partitions = HashPartitioner(97, ["k.id"]).partitions(null_parent).tolist()
    assert partitions[0] == partitions[4] == int(NULL_HASH) % 97
    with pytest.raises(ConfigError, match=r"k\.nope"):
        HashPartitioner(4, ["k.nope"]).partitions(nested)

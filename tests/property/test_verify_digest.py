"""The verification digest: equal row multisets give equal digests, any changed row is seen.

Random tables with the values that trip hashes up -- NaN (with other payloads),
-0.0 and 0.0, nulls, empty strings, nested lists and structs -- read in any
order and any batch split must digest alike; changing, deleting or adding one
row must change the digest of exactly that row's bucket.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from pyiceberg.types import DoubleType, IntegerType, ListType, LongType, NestedField, StringType, StructType

from iceberg_cdc.mirror.verify.digest import Digests
from iceberg_cdc.mirror.verify.sides import Columns, hash_batch

TYPES = {
    "id": LongType(),
    "x": DoubleType(),
    "s": StringType(),
    "l": ListType(10, IntegerType(), element_required=False),
    "t": StructType(
        NestedField(11, "a", IntegerType(), required=False),
        NestedField(12, "b", StringType(), required=False),
    ),
}
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("x", pa.float64()),
        ("s", pa.string()),
        ("l", pa.list_(pa.int32())),
        ("t", pa.struct([("a", pa.int32()), ("b", pa.string())])),
    ]
)
COLUMNS = Columns(tuple(TYPES), TYPES, ("id",), json_nested=False)
OTHER_NAN = struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_0000_0BAD))[0]

floats = st.one_of(st.none(), st.sampled_from([0.0, -0.0, math.nan, OTHER_NAN, 1.5]), st.floats(width=64))
row = st.fixed_dictionaries(
    {
        "x": floats,
        "s": st.one_of(st.none(), st.text(max_size=4)),
        "l": st.one_of(st.none(), st.lists(st.one_of(st.none(), st.integers(-3, 3)), max_size=3)),
        "t": st.one_of(
            st.none(),
            st.fixed_dictionaries(
                {
                    "a": st.one_of(st.none(), st.integers(-2, 2)),
                    "b": st.one_of(st.none(), st.text(max_size=2)),
                }
            ),
        ),
    }
)


def _table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist([{"id": i, **r} for i, r in enumerate(rows)], schema=SCHEMA)


def _digest(table: pa.Table, buckets: int, chunk: int) -> Digests:
    digests = Digests.empty(buckets)
    for batch in table.to_batches(max_chunksize=chunk):
        hashed = hash_batch(batch, COLUMNS, buckets, from_postgres=False)
        digests.add(hashed.buckets, hashed.row_hashes)
    return digests


def _same_value(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or struct.pack("<d", a) == struct.pack("<d", b)
    return a == b


@settings(max_examples=60, deadline=None)
@given(st.lists(row, min_size=1, max_size=40), st.randoms(use_true_random=False), st.integers(1, 7))
def test_order_and_batching_do_not_change_the_digest(rows, rnd, chunk):
    table = _table(rows)
    order = list(range(table.num_rows))
    rnd.shuffle(order)
    shuffled = table.take(pa.array(order))
    a, b = _digest(table, 16, 64), _digest(shuffled, 16, chunk)
    assert not len(a.differing(b))


@settings(max_examples=60, deadline=None)
@given(st.lists(row, min_size=1, max_size=30), st.data())
def test_one_changed_row_changes_exactly_its_bucket(rows, data):
    table = _table(rows)
    target = data.draw(st.integers(0, len(rows) - 1))
    replacement = data.draw(row)
    original = rows[target]
    if all(_same_value(original[k], replacement[k]) for k in original):
        return  # not a change (NaN payloads are one NaN; -0.0 vs 0.0 is a change)
    changed = _table([*rows[:target], replacement, *rows[target + 1 :]])
    a, b = _digest(table, 16, 64), _digest(changed, 16, 64)
    differing = a.differing(b)
    bucket = hash_batch(table.slice(target, 1).to_batches()[0], COLUMNS, 16, from_postgres=False).buckets[0]
    assert list(differing) == [bucket]


@settings(max_examples=30, deadline=None)
@given(st.lists(row, min_size=2, max_size=30), st.data())
def test_a_missing_or_extra_row_is_seen(rows, data):
    table = _table(rows)
    target = data.draw(st.integers(0, len(rows) - 1))
    fewer = table.filter(pa.array(np.arange(len(rows)) != target))
    assert len(_digest(table, 16, 64).differing(_digest(fewer, 16, 64))) == 1
    more = pa.concat_tables([table, table.slice(target, 1)])  # the key twice
    assert len(_digest(table, 16, 64).differing(_digest(more, 16, 64))) == 1


@settings(max_examples=40, deadline=None)
@given(st.lists(row, min_size=1, max_size=20), st.sampled_from(["x", "s", "l", "t"]), st.data())
def test_a_change_in_any_one_column_is_seen(rows, column, data):
    """Every compared column enters the row's hash: a change to one column alone changes its row's bucket."""
    table = _table(rows)
    target = data.draw(st.integers(0, len(rows) - 1))
    value = data.draw(row)[column]
    if _same_value(rows[target][column], value):
        return
    changed = _table([*rows[:target], {**rows[target], column: value}, *rows[target + 1 :]])
    bucket = hash_batch(table.slice(target, 1).to_batches()[0], COLUMNS, 16, from_postgres=False).buckets[0]
    assert list(_digest(table, 16, 64).differing(_digest(changed, 16, 64))) == [bucket]

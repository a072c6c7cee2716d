"""Changelog merge: Iceberg's TestChangelogIterator cases, then random inputs against an oracle."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc_devtools.oracle import Ambiguous, actual_changes, expected_changes, freeze
from iceberg_cdc.changelog.merge import merge_changes
from iceberg_cdc.errors import AmbiguousUpdateError, ConfigError
from iceberg_cdc.shuffle.rows import OP_COLUMN

D, I = "DELETE", "INSERT"  # noqa: E741 - the names Iceberg's tests use
UB, UA = "UPDATE_BEFORE", "UPDATE_AFTER"
SCHEMA = pa.schema([("id", pa.int32()), ("name", pa.string()), ("data", pa.string())])
IDS = ["id", "name"]


def shuffled(rows: list[tuple]) -> pa.Table:
    """Rows of (id, name, data, op) as the shuffle hands them to a reader."""
    columns = list(zip(*rows, strict=True)) if rows else [[], [], [], []]
    ops = [0 if op == D else 1 for op in columns[3]]
    return pa.Table.from_arrays(
        [pa.array(columns[i], SCHEMA.field(i).type) for i in range(3)] + [pa.array(ops, pa.int8())],
        schema=SCHEMA.append(pa.field(OP_COLUMN, pa.int8())),
    )


def result(rows, ids=IDS, **kwargs) -> Counter:
    table, _ = merge_changes(shuffled(rows), ids, **kwargs)
    return Counter(tuple(r.values()) for r in table.to_pylist())


# --- TestChangelogIterator.testIterator: every order of deleted / inserted / carryover / updated ----

ORIGINAL = {
    "DELETED": lambda i: [(i, "b", "data", D)],
    "INSERTED": lambda i: [(i, "c", "data", I)],
    "CARRY_OVER": lambda i: [(i, "d", "data", D), (i, "d", "data", I)],
    "UPDATED": lambda i: [(i, "a", "data", D), (i, "a", "new_data", I)],
}
EXPECTED = {
    "DELETED": lambda i: [(i, "b", "data", D)],
    "INSERTED": lambda i: [(i, "c", "data", I)],
    "CARRY_OVER": lambda i: [],
    "UPDATED": lambda i: [(i, "a", "data", UB), (i, "a", "new_data", UA)],
}


@pytest.mark.parametrize("order", list(itertools.permutations(ORIGINAL)))
def test_iterator_permutations(order):
    rows = [row for i, kind in enumerate(order) for row in ORIGINAL[kind](i)]
    expected = [row for i, kind in enumerate(order) for row in EXPECTED[kind](i)]
    table, stats = merge_changes(shuffled(rows), IDS)
    out = [tuple(r.values()) for r in table.to_pylist()]
    assert Counter(out) == Counter(expected)
    # UPDATE_BEFORE is immediately followed by its UPDATE_AFTER
    for position, row in enumerate(out):
        if row[3] == UB:
            assert out[position + 1][3] == UA and out[position + 1][:2] == row[:2]
    assert stats.carryover_rows == 2 and stats.updates == 1


def test_rows_with_null_values():
    rows = [
        (2, None, None, D),
        (3, None, None, I),
        (4, None, None, D),
        (4, None, None, I),
        (5, None, None, D),  # null vs value in a data column: an update
        (5, None, "data", I),
        (6, None, None, D),  # null vs value in an identifier column: different keys
        (6, "name", None, I),
    ]
    assert result(rows) == Counter(
        [
            (2, None, None, D),
            (3, None, None, I),
            (5, None, None, UB),
            (5, None, "data", UA),
            (6, None, None, D),
            (6, "name", None, I),
        ]
    )


def test_updated_rows_with_duplication_fail_naming_the_key():
    rows = [(1, "a", "data", D), (1, "a", "data", D), (1, "a", "new_data", I), (1, "a", "new_data", I)]
    with pytest.raises(AmbiguousUpdateError, match=r"id=1, name='a'.*2 DELETE and 2 INSERT"):
        merge_changes(shuffled(rows), IDS)
    assert result(rows, emit_unpaired=True) == Counter(
        [(1, "a", "data", D)] * 2 + [(1, "a", "new_data", I)] * 2
    )


def test_one_delete_two_inserts_is_ambiguous_here():
    # Spark's iterator pairs the DELETE with whichever INSERT sorts first and keeps the other
    # as INSERT. Rows reach a read task in no fixed order, so that pairing would not be
    # reproducible: the design fails the key (or emits it unpaired) instead.
    rows = [(1, "a", "data", D), (1, "a", "new_data1", I), (1, "a", "new_data2", I)]
    with pytest.raises(AmbiguousUpdateError, match="1 DELETE and 2 INSERT"):
        merge_changes(shuffled(rows), IDS)
    assert result(rows, emit_unpaired=True) == Counter(
        [(1, "a", "data", D), (1, "a", "new_data1", I), (1, "a", "new_data2", I)]
    )


CARRYOVER_CASES = {
    "with_duplicates": (
        [(0, "a", "data", D)] * 3
        + [(1, "a", "old_data", D)] * 2
        + [(2, "a", "data", D)] * 2
        + [(2, "a", "data", I)] * 2
        + [(3, "a", "new_data", I)],
        [(0, "a", "data", D)] * 3 + [(1, "a", "old_data", D)] * 2 + [(3, "a", "new_data", I)],
    ),
    "less_inserts": (
        [(1, "d", "data", D), (1, "d", "data", D), (1, "d", "data", I), (2, "d", "data", I)],
        [(1, "d", "data", D), (2, "d", "data", I)],
    ),
    "more_inserts": (
        [(0, "d", "data", D)] + [(1, "d", "data", D)] * 3 + [(1, "d", "data", I)] * 4,
        [(0, "d", "data", D), (1, "d", "data", I)],
    ),
    "no_inserts": ([(1, "d", "data", D)] * 2, [(1, "d", "data", D)] * 2),
}


@pytest.mark.parametrize("case", CARRYOVER_CASES)
def test_carryover_removal_by_multiplicity(case):
    rows, expected = CARRYOVER_CASES[case]
    assert result(rows, ids=None) == Counter(expected)


def test_carryover_then_update_for_one_key():
    # 2 D + 2 I of one key where one pair is carryover: what is left is one update.
    rows = [(1, "a", "x", D), (1, "a", "x", I), (1, "a", "y", D), (1, "a", "z", I)]
    assert result(rows) == Counter([(1, "a", "y", UB), (1, "a", "z", UA)])


def test_update_that_changes_nothing_disappears():
    table, stats = merge_changes(shuffled([(7, "n", "same", D), (7, "n", "same", I)]), IDS)
    assert table.num_rows == 0 and stats.carryover_rows == 2


def test_empty_input_keeps_schema():
    table, _ = merge_changes(shuffled([]), IDS)
    assert table.num_rows == 0
    assert table.schema.names == ["id", "name", "data", "_change_type"]


def test_nested_and_float_columns_compare_by_value():
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("f", pa.float64()),
            ("s", pa.struct([("a", pa.list_(pa.int32())), ("m", pa.map_(pa.string(), pa.int8()))])),
        ]
    )
    nested = {"a": [1, None], "m": [("k", 1)]}
    other = {"a": [1, 2], "m": [("k", 1)]}
    data = pa.table(
        {
            "id": [1, 1, 2, 2, 3, 3],
            "f": [float("nan"), float("nan"), 1.0, 1.0, 0.5, 0.5],
            "s": [nested, nested, nested, other, None, None],
            OP_COLUMN: pa.array([0, 1, 0, 1, 0, 1], pa.int8()),
        },
        schema=schema.append(pa.field(OP_COLUMN, pa.int8())),
    )
    table, stats = merge_changes(data, ["id"])
    assert table.column("id").to_pylist() == [2, 2]
    assert table.column("_change_type").to_pylist() == [UB, UA]
    assert stats.carryover_rows == 4


# --- random inputs against the oracle ------------------------------------------------------------

small_text = st.sampled_from(["a", "b", "", None, "ü"])
row_strategy = st.tuples(st.sampled_from([1, 2, 3, None]), small_text, small_text)
RANDOM_SCHEMA = pa.schema([("k", pa.int64()), ("name", pa.string()), ("data", pa.string())])


def random_table(deleted, inserted, chunks):
    rows = [(*r, 0) for r in deleted] + [(*r, 1) for r in inserted]
    columns = list(zip(*rows, strict=True)) if rows else [[], [], [], []]
    table = pa.Table.from_arrays(
        [pa.array(columns[i], RANDOM_SCHEMA.field(i).type) for i in range(3)]
        + [pa.array(columns[3], pa.int8())],
        schema=RANDOM_SCHEMA.append(pa.field(OP_COLUMN, pa.int8())),
    )
    if chunks > 1 and table.num_rows:  # readers hand over many small batches
        size = max(1, table.num_rows // chunks)
        table = pa.Table.from_batches(table.to_batches(max_chunksize=size))
    return table


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    deleted=st.lists(row_strategy, max_size=12),
    inserted=st.lists(row_strategy, max_size=12),
    ids=st.sampled_from([None, ["k"], ["k", "name"]]),
    chunks=st.integers(1, 4),
)
def test_merge_matches_oracle(deleted, inserted, ids, chunks):
    names = RANDOM_SCHEMA.names
    as_dicts = lambda rows: [dict(zip(names, r, strict=True)) for r in rows]  # noqa: E731
    table = random_table(deleted, inserted, chunks)
    try:
        expected = expected_changes(as_dicts(deleted), as_dicts(inserted), names, ids)
    except Ambiguous:
        with pytest.raises(AmbiguousUpdateError):
            merge_changes(table, ids)
        unpaired, _ = merge_changes(table, ids, emit_unpaired=True)
        check_replay(deleted, inserted, unpaired.to_pylist(), names)
        return
    out, stats = merge_changes(table, ids)
    rows = out.to_pylist()
    assert actual_changes(rows, names) == expected
    check_replay(deleted, inserted, rows, names, ids)
    emitted = stats.deletes + stats.inserts + 2 * stats.updates
    assert emitted == len(rows)
    assert stats.carryover_rows + emitted == len(deleted) + len(inserted)


def check_replay(deleted, inserted, rows, names, ids=None):
    """The replay invariant on the snapshot's own rows, and the identifier-level rules."""
    frozen = lambda r: freeze(tuple(r[n] for n in names))  # noqa: E731
    removed = Counter(frozen(r) for r in rows if r["_change_type"] in (D, UB))
    added = Counter(frozen(r) for r in rows if r["_change_type"] in (I, UA))
    before = Counter(freeze(tuple(r)) for r in deleted)
    after = Counter(freeze(tuple(r)) for r in inserted)
    assert not removed - before, "a removed row was not among the snapshot's deleted rows"
    assert (before - removed) + added == after
    assert not (removed & added), "a row is both removed and added"
    if ids:
        key = lambda r: freeze(tuple(r[n] for n in ids))  # noqa: E731
        deleted_keys = {key(r) for r in rows if r["_change_type"] == D}
        inserted_keys = {key(r) for r in rows if r["_change_type"] == I}
        assert not deleted_keys & inserted_keys, "a key is both DELETEd and INSERTed"
        pairs = [(rows[j], rows[j + 1]) for j, r in enumerate(rows) if r["_change_type"] == UB]
        assert all(b["_change_type"] == UA for _, b in pairs)
        assert all(key(a) == key(b) for a, b in pairs)
        assert len(pairs) == sum(r["_change_type"] == UA for r in rows)


# --- value equality for floats (design notes, semantics rule 7) ------------------------------------

# NaNs that differ bit for bit: quiet, negative, with a payload, signalling.
NAN_BITS = {
    pa.float32(): [0x7FC00000, 0xFFC00000, 0x7FC00123, 0x7F800001],
    pa.float64(): [0x7FF8000000000000, 0xFFF8000000000000, 0x7FF800000000BEEF, 0x7FF0000000000001],
}
_UINT = {pa.float32(): np.uint32, pa.float64(): np.uint64}


def floats(typ: pa.DataType, bits: list[int]) -> pa.Array:
    """A float column with exactly these bit patterns (no round trip through Python floats)."""
    return pa.array(np.array(bits, dtype=_UINT[typ]).view(typ.to_pandas_dtype()), typ)


def float_bits(typ: pa.DataType, value: float) -> int:
    return int(np.array([value], dtype=typ.to_pandas_dtype()).view(_UINT[typ])[0])


def nested_forms(column: pa.Array) -> dict[str, pa.Array]:
    """``column`` (float values) top level and inside a struct, a list and a map, one value per row."""
    n = len(column)
    one_each = pa.array(np.arange(n + 1, dtype=np.int32))
    return {
        "top": column,
        "struct": pa.StructArray.from_arrays([column, pa.array([7] * n, pa.int8())], ["f", "i"]),
        "list": pa.ListArray.from_arrays(one_each, column),
        "map": pa.MapArray.from_arrays(one_each, pa.array(["k"] * n), column),
    }


def float_rows(values: pa.Array, ops: list[int], ids: list[int]) -> pa.Table:
    return pa.table(
        {"id": pa.array(ids, pa.int64()), "v": values, OP_COLUMN: pa.array(ops, pa.int8())},
    )


@pytest.mark.parametrize("typ", [pa.float32(), pa.float64()], ids=str)
@pytest.mark.parametrize("form", ["top", "struct", "list", "map"])
@pytest.mark.parametrize("ids", [None, ["id"]], ids=["whole-row", "with-ids"])
def test_nans_with_different_payloads_cancel_as_carryover(typ, form, ids):
    bits = NAN_BITS[typ]
    nans = floats(typ, bits)
    assert len(set(nans.to_numpy().view(_UINT[typ]).tolist())) == len(bits), "the NaNs differ bit for bit"
    # Each NaN deleted, then re-inserted as a different NaN (as another engine rewrites the file).
    values = pa.concat_arrays([nans, floats(typ, bits[1:] + bits[:1])])
    n = len(bits)
    table = float_rows(nested_forms(values)[form], [0] * n + [1] * n, list(range(n)) * 2)
    out, stats = merge_changes(table, ids)
    assert out.num_rows == 0, out.to_pylist()
    assert stats.carryover_rows == 2 * n


@pytest.mark.parametrize("typ", [pa.float32(), pa.float64()], ids=str)
@pytest.mark.parametrize("form", ["top", "struct", "list", "map"])
def test_negative_zero_differs_from_zero(typ, form):
    values = floats(typ, [float_bits(typ, -0.0), float_bits(typ, 0.0)])
    table = float_rows(nested_forms(values)[form], [0, 1], [1, 1])
    whole_row, _ = merge_changes(table, None)
    assert whole_row.column("_change_type").to_pylist() == [D, I]
    with_ids, stats = merge_changes(table, ["id"])
    assert with_ids.column("_change_type").to_pylist() == [UB, UA]
    assert stats.updates == 1 and stats.carryover_rows == 0


@pytest.mark.parametrize("typ", [pa.float32(), pa.float64()], ids=str)
def test_nans_cancel_by_multiplicity_among_duplicates(typ):
    # 2 D + 3 I of the "same" NaN row (three payloads): one INSERT is left; the multi-row path.
    bits = NAN_BITS[typ]
    values = floats(typ, [bits[0], bits[1], bits[2], bits[3], bits[0]])
    table = float_rows(values, [0, 0, 1, 1, 1], [5] * 5)
    out, stats = merge_changes(table, None)
    assert out.column("_change_type").to_pylist() == [I]
    assert np.isnan(out.column("v").to_pylist()[0])
    assert stats.carryover_rows == 4
    keyed, keyed_stats = merge_changes(table, ["id"])
    assert keyed.column("_change_type").to_pylist() == [I]
    assert keyed_stats.carryover_rows == 4


# --- identifier fields nested in structs, and errors that say where --------------------------------


def struct_keyed(rows: list[tuple]) -> pa.Table:
    """Rows of (tenant, id, data, op) with the identifier ``k.id`` inside the struct column ``k``."""
    tenant, ids, data, ops = (list(c) for c in zip(*rows, strict=True))
    key = pa.StructArray.from_arrays(
        [pa.array(tenant, pa.string()), pa.array(ids, pa.int64())], ["tenant", "id"]
    )
    return pa.table(
        {
            "k": key,
            "data": pa.array(data, pa.string()),
            OP_COLUMN: pa.array([0 if o == D else 1 for o in ops], pa.int8()),
        }
    )


def test_nested_identifier_field_pairs_updates():
    rows = [
        ("acme", 1, "old", D),
        ("acme", 1, "new", I),  # update of k.id = 1 (tenant is not part of the key)
        ("globex", 2, "same", D),
        ("globex", 2, "same", I),  # carryover
        ("acme", 3, "gone", D),
        ("initech", 1, "moved", D),  # another row with k.id = 1: a second DELETE for that key...
    ]
    with pytest.raises(AmbiguousUpdateError, match=r"k\.id=1"):
        merge_changes(struct_keyed(rows), ["k.id"])
    out, stats = merge_changes(struct_keyed(rows[:5]), ["k.id"])
    assert [(r["k"]["id"], r["data"], r["_change_type"]) for r in out.to_pylist()] == [
        (3, "gone", D),
        (1, "old", UB),
        (1, "new", UA),
    ]
    assert stats.carryover_rows == 2
    # two-field key with one nested part
    out, _ = merge_changes(struct_keyed(rows), ["k.tenant", "k.id"])
    assert Counter(r["_change_type"] for r in out.to_pylist()) == Counter({D: 2, UB: 1, UA: 1})


def test_column_named_with_a_dot_wins_over_a_path():
    table = pa.table(
        {
            "k.id": pa.array([1, 1], pa.int64()),  # a top-level column whose name holds a dot
            "k": pa.StructArray.from_arrays([pa.array([5, 6], pa.int64())], ["id"]),
            OP_COLUMN: pa.array([0, 1], pa.int8()),
        }
    )
    out, _ = merge_changes(table, ["k.id"])
    assert out.column("_change_type").to_pylist() == [UB, UA]


def test_missing_nested_identifier_is_named():
    with pytest.raises(ConfigError, match=r"k\.nope"):
        merge_changes(struct_keyed([("a", 1, "x", D)]), ["k.nope"])


def test_ambiguous_update_error_names_table_and_snapshot():
    rows = [(1, "a", "data", D), (1, "a", "data", D), (1, "a", "new", I), (1, "a", "new", I)]
    where = "table shop.orders, snapshot 8744736658442914487"
    with pytest.raises(AmbiguousUpdateError) as raised:
        merge_changes(shuffled(rows), IDS, where=where)
    assert str(raised.value).startswith(where + ": cannot pair updates for identifier (id=1, name='a')")
    with pytest.raises(AmbiguousUpdateError, match=r"^cannot pair updates"):
        merge_changes(shuffled(rows), IDS)


def test_oracle_compares_floats_as_spark():
    payload_nan = float(np.array([0x7FF800000000BEEF], np.uint64).view(np.float64)[0])
    negative_nan = float(np.array([0xFFF8000000000000], np.uint64).view(np.float64)[0])
    assert freeze(payload_nan) == freeze(negative_nan) == freeze(float("nan"))
    assert freeze(-0.0) != freeze(0.0)
    assert freeze({"a": [payload_nan]}) == freeze({"a": [float("nan")]})
    names = ["id", "v"]
    deleted, inserted = [{"id": 1, "v": payload_nan}], [{"id": 1, "v": negative_nan}]
    assert expected_changes(deleted, inserted, names, ["id"]) == Counter()
    zeros = expected_changes([{"id": 1, "v": -0.0}], [{"id": 1, "v": 0.0}], names, ["id"])
    assert sorted(change for _, change in zeros) == [UA, UB]

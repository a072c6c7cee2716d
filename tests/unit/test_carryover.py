"""Carryover cancelled before the shuffle: the multiset rule, exact equality, row lineage.

Every random input is checked three ways: the survivors keep each distinct
row's net count (INSERTs minus DELETEs), the read side's merge of the
survivors gives exactly what the oracle says for all the rows, and without
lineage no identical DELETE/INSERT pair survives (everything cancellable is
cancelled here, not left to the shuffle).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc_devtools.oracle import Ambiguous, actual_changes, expected_changes, row_key
from iceberg_cdc.changelog.carryover import (
    Lineage,
    _grouped_pairs,
    cancel_by_multiplicity,
    cancel_carryover,
    candidate_pairs,
)
from iceberg_cdc.changelog.merge import group_ids, merge_changes
from iceberg_cdc.errors import AmbiguousUpdateError
from iceberg_cdc.shuffle.rows import OP_COLUMN
from tests.unit.test_merge import NAN_BITS, float_bits, floats, nested_forms

SCHEMA = pa.schema([("k", pa.int64()), ("name", pa.string()), ("v", pa.float64())])
NAMES = SCHEMA.names
values = st.tuples(
    st.sampled_from([1, 2, 3, None]),
    st.sampled_from(["a", "b", "", None]),
    st.sampled_from([0.0, -0.0, 1.5, float("nan"), None]),
)


def table_of(rows: list[tuple]) -> pa.Table:
    columns = list(zip(*rows, strict=True)) if rows else [[], [], []]
    return pa.Table.from_arrays([pa.array(columns[i], SCHEMA.field(i).type) for i in range(3)], schema=SCHEMA)


def tagged(data: pa.Table, inserts: np.ndarray) -> pa.Table:
    return data.append_column(OP_COLUMN, pa.array(inserts.astype(np.int8)))


def check(data: pa.Table, inserts: np.ndarray, ids, lineage: Lineage | None = None, *, full: bool = True):
    """Cancel, then check the multiset rule and the merge of the survivors against the oracle."""
    result = cancel_carryover(data, inserts, ids, lineage)
    kept = result.kept
    assert np.all(np.diff(kept) > 0), "kept rows are distinct and ascending"
    assert result.cancelled == data.num_rows - len(kept)
    rows = data.to_pylist()
    survivors = data.take(pa.array(kept))
    survivor_inserts = inserts[kept]
    before: Counter = Counter()
    after: Counter = Counter()
    for row, insert in zip(rows, inserts, strict=True):
        before[row_key(row, NAMES)] += 1 if insert else -1
    for row, insert in zip(survivors.to_pylist(), survivor_inserts, strict=True):
        after[row_key(row, NAMES)] += 1 if insert else -1
    assert {k: v for k, v in before.items() if v} == {k: v for k, v in after.items() if v}, "net counts moved"
    if full:
        deleted = {
            row_key(r, NAMES) for r, i in zip(survivors.to_pylist(), survivor_inserts, strict=True) if not i
        }
        added = {row_key(r, NAMES) for r, i in zip(survivors.to_pylist(), survivor_inserts, strict=True) if i}
        assert not deleted & added, "an identical DELETE/INSERT pair survived"
    deleted_rows = [r for r, i in zip(rows, inserts, strict=True) if not i]
    inserted_rows = [r for r, i in zip(rows, inserts, strict=True) if i]
    try:
        expected = expected_changes(deleted_rows, inserted_rows, NAMES, ids)
    except Ambiguous:
        with pytest.raises(AmbiguousUpdateError):
            merge_changes(tagged(survivors, survivor_inserts), ids)
        return result
    out, stats = merge_changes(tagged(survivors, survivor_inserts), ids)
    assert actual_changes(out.to_pylist(), NAMES) == expected
    assert stats.carryover_rows + result.cancelled + out.num_rows == data.num_rows
    return result


@settings(max_examples=300, deadline=None)
@given(
    keys=st.lists(st.integers(-3, 6) | st.integers(-(2**63), 2**63 - 1), max_size=40),
    seed=st.integers(0, 2**32 - 1),
)
def test_integer_keys_pair_as_grouped_keys_do(keys, seed):
    # The sorted path for one integer key must find exactly the pairs and counted rows that
    # dense group ids and per-group counts find (the path every other key type takes).
    inserts = np.random.default_rng(seed).random(len(keys)) < 0.5
    column = pa.array(keys, pa.int64())
    fast = candidate_pairs([column], inserts)
    slow = _grouped_pairs(*group_ids([column]), inserts)
    assert sorted(zip(fast.delete_rows.tolist(), fast.insert_rows.tolist(), strict=True)) == sorted(
        zip(slow.delete_rows.tolist(), slow.insert_rows.tolist(), strict=True)
    )
    assert fast.several.tolist() == slow.several.tolist()  # ascending: multiplicity cancels first copies
    assert not inserts[fast.delete_rows].any() and inserts[fast.insert_rows].all()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    deleted=st.lists(values, max_size=14),
    inserted=st.lists(values, max_size=14),
    ids=st.sampled_from([None, ["k"], ["k", "name"]]),
    seed=st.integers(0, 2**32 - 1),
)
def test_cancellation_keeps_the_multiset_rule(deleted, inserted, ids, seed):
    rows = deleted + inserted
    inserts = np.array([False] * len(deleted) + [True] * len(inserted), dtype=bool)
    order = np.random.default_rng(seed).permutation(len(rows))  # both sides interleaved, any order
    data = table_of([rows[i] for i in order])
    check(data, inserts[order], ids)


def test_duplicates_cancel_by_multiplicity():
    row = (1, "a", 1.5)
    for deletes, inserts, left in ((2, 2, 0), (2, 1, 1), (3, 4, 1), (1, 3, 2)):
        data = table_of([row] * (deletes + inserts))
        flags = np.array([False] * deletes + [True] * inserts)
        for ids in (None, ["k"]):
            result = check(data, flags, ids)
            assert len(result.kept) == left
            assert result.by_value == 2 * min(deletes, inserts)


def test_multiplicity_cancels_the_first_copies_of_each_side():
    data = table_of([(1, "a", 0.0), (1, "a", 0.0), (1, "a", 0.0), (2, "b", 0.0)])
    cancelled = cancel_by_multiplicity(data, np.arange(4), np.array([False, True, True, True]))
    assert cancelled.tolist() == [True, True, False, False]


@pytest.mark.parametrize("typ", [pa.float32(), pa.float64()], ids=str)
@pytest.mark.parametrize("form", ["top", "struct", "list", "map"])
@pytest.mark.parametrize("ids", [None, ["id"]], ids=["whole-row", "with-ids"])
def test_nans_cancel_whatever_their_payload_and_negative_zero_does_not(typ, form, ids):
    bits = NAN_BITS[typ]
    n = len(bits)
    nans = pa.concat_arrays([floats(typ, bits), floats(typ, bits[1:] + bits[:1])])
    data = pa.table({"id": pa.array(list(range(n)) * 2, pa.int64()), "v": nested_forms(nans)[form]})
    result = cancel_carryover(data, np.array([False] * n + [True] * n), ids)
    assert result.cancelled == 2 * n and len(result.kept) == 0
    zeros = floats(typ, [float_bits(typ, -0.0), float_bits(typ, 0.0)])
    data = pa.table({"id": pa.array([1, 1], pa.int64()), "v": nested_forms(zeros)[form]})
    assert cancel_carryover(data, np.array([False, True]), ids).kept.tolist() == [0, 1]


def test_nested_identifier_keys_compare_the_rest_of_their_struct():
    key = pa.StructArray.from_arrays(
        [pa.array(["acme", "globex"]), pa.array([1, 1], pa.int64())], ["t", "id"]
    )
    data = pa.table({"k": key, "v": pa.array([7, 7], pa.int64())})
    # Same k.id and v, different k.t: not identical rows, nothing cancels.
    assert cancel_carryover(data, np.array([False, True]), ["k.id"]).kept.tolist() == [0, 1]


# -- row lineage --------------------------------------------------------------------------------------


@st.composite
def rewrites(draw):
    """A rewrite of some rows, with lineage as a spec-following writer leaves it.

    Each old row (with a row id and sequence number, or none) is copied
    (same values, same lineage), modified (same row id, new sequence number;
    sometimes the same values: an update that changed nothing), deleted, or
    copied by a writer that keeps no lineage. New rows get fresh ids.
    """
    old = draw(st.lists(values, max_size=10))
    deleted, inserted = [], []
    for position, row in enumerate(old):
        with_lineage = draw(st.booleans()) or position % 3 == 0
        lineage = (100 + position, 5) if with_lineage else (None, None)
        deleted.append((row, lineage))
        fate = draw(st.sampled_from(["copy", "modify", "noop-modify", "delete", "copy-without-lineage"]))
        if fate == "copy":
            inserted.append((row, lineage))
        elif fate in ("modify", "noop-modify"):
            new = row if fate == "noop-modify" else draw(values)
            inserted.append((new, (lineage[0], 9) if with_lineage else (None, None)))
        elif fate == "copy-without-lineage":
            inserted.append((row, (None, None)))
    for extra, row in enumerate(draw(st.lists(values, max_size=4))):
        inserted.append((row, (1000 + extra, 9)))
    return deleted, inserted


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(change=rewrites(), ids=st.sampled_from([None, ["k"]]), seed=st.integers(0, 2**32 - 1))
def test_lineage_cancels_copies_without_comparing_and_the_rest_by_value(change, ids, seed):
    deleted, inserted = change
    everything = deleted + inserted
    order = np.random.default_rng(seed).permutation(len(everything))
    rows = [everything[i] for i in order]
    inserts = np.array([i >= len(deleted) for i in order], dtype=bool)
    data = table_of([row for row, _ in rows])
    lineage = Lineage(
        pa.array([lin[0] for _, lin in rows], pa.int64()), pa.array([lin[1] for _, lin in rows], pa.int64())
    )
    copies = sum(1 for row, lin in inserted if lin[0] is not None and lin[1] == 5)
    result = check(data, inserts, ids, lineage, full=False)
    assert result.by_lineage == 2 * copies


def test_lineage_match_needs_both_fields():
    data = table_of([(1, "a", 0.0), (1, "b", 0.0)])  # values differ: an update
    modified = Lineage(pa.array([7, 7], pa.int64()), pa.array([3, 4], pa.int64()))
    result = cancel_carryover(data, np.array([False, True]), ["k"], modified)
    assert result.kept.tolist() == [0, 1] and result.cancelled == 0
    copied = Lineage(pa.array([7, 7], pa.int64()), pa.array([3, 3], pa.int64()))
    same = table_of([(1, "a", 0.0), (1, "a", 0.0)])
    result = cancel_carryover(same, np.array([False, True]), ["k"], copied)
    assert result.kept.tolist() == [] and result.by_lineage == 2 and result.by_value == 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="operation flags"):
        cancel_carryover(table_of([(1, "a", 0.0)]), np.array([True, False]))

"""Net changes per key: the last version wins, a last change without an after-image removes the key.

The vectorized :func:`net_changes` is checked against a plain-Python fold of
the same rows (apply each changelog snapshot in order to a dict) on random
change sequences, and on the cases that matter by name.
"""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iceberg_cdc.errors import MirrorKeyError
from iceberg_cdc.mirror.net_changes import ChangelogMark, net_changes

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("k2", pa.string()),
        ("v", pa.float64()),
        ("_change_type", pa.string()),
        ("_change_ordinal", pa.int32()),
        ("_commit_snapshot_id", pa.int64()),
    ]
)


def changes(rows: list[tuple]) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(SCHEMA.names, r, strict=True)) for r in rows], schema=SCHEMA)


def as_dict(upserts: pa.Table, keys=("id",)) -> dict:
    return {tuple(r[k] for k in keys): r for r in upserts.to_pylist()}


def test_last_version_wins_and_a_last_delete_removes():
    rows = [
        (1, "a", 1.0, "INSERT", 1, 10),
        (2, "a", 2.0, "INSERT", 1, 10),
        (3, "a", 3.0, "INSERT", 1, 10),
        (1, "a", 1.0, "UPDATE_BEFORE", 2, 11),
        (1, "a", 1.5, "UPDATE_AFTER", 2, 11),
        (2, "a", 2.0, "DELETE", 2, 11),
        (3, "a", 3.0, "DELETE", 3, 12),
        (3, "a", 3.3, "INSERT", 4, 13),  # re-insert after a delete
        (4, "a", 4.0, "INSERT", 3, 12),
        (4, "a", 4.0, "DELETE", 5, 14),
    ]
    shuffled = rows[:]
    random.Random(3).shuffle(shuffled)  # the order of rows does not matter, only ordinals
    upserts, deletes = net_changes(changes(shuffled), ["id"])
    assert upserts.column_names == ["id", "k2", "v"]
    assert {k: r["v"] for k, r in as_dict(upserts).items()} == {(1,): 1.5, (3,): 3.3}
    assert sorted(deletes.column("id").to_pylist()) == [2, 4]
    assert deletes.column_names == ["id"]


def test_an_update_before_alone_in_the_last_snapshot_removes_the_key():
    rows = [(1, "a", 1.0, "INSERT", 1, 10), (1, "a", 1.0, "UPDATE_BEFORE", 2, 11)]
    upserts, deletes = net_changes(changes(rows), ["id"])
    assert upserts.num_rows == 0 and deletes.column("id").to_pylist() == [1]


def test_composite_keys_with_nulls_compare_null_equal_null():
    rows = [
        (1, None, 1.0, "INSERT", 1, 10),
        (1, "x", 2.0, "INSERT", 1, 10),
        (1, None, 1.0, "UPDATE_BEFORE", 2, 11),
        (1, None, 9.0, "UPDATE_AFTER", 2, 11),
    ]
    upserts, deletes = net_changes(changes(rows), ["id", "k2"])
    assert {k: r["v"] for k, r in as_dict(upserts, ("id", "k2")).items()} == {(1, None): 9.0, (1, "x"): 2.0}
    assert deletes.num_rows == 0


def test_two_after_images_of_one_key_in_one_snapshot_are_refused_naming_the_key():
    rows = [(7, "a", 1.0, "INSERT", 3, 99), (7, "a", 2.0, "INSERT", 3, 99)]
    with pytest.raises(
        MirrorKeyError, match=r"key id=7 has two after-images .*source snapshot 99 \(ordinal 3\)"
    ):
        net_changes(changes(rows), ["id"])
    rows = [(7, "a", 1.0, "DELETE", 3, 99), (7, "a", 1.0, "DELETE", 3, 99)]
    with pytest.raises(MirrorKeyError, match="two before-images"):
        net_changes(changes(rows), ["id"])


def test_empty_changes_give_empty_tables_with_the_right_columns():
    upserts, deletes = net_changes(changes([]), ["id"])
    assert upserts.column_names == ["id", "k2", "v"] and deletes.column_names == ["id"]
    assert upserts.num_rows == deletes.num_rows == 0


def test_mark_travels_as_strings_of_digits():
    mark = ChangelogMark(2**62 + 1, 2**62 + 3, 5)
    data = mark.to_dict()
    assert data["changelog_snapshot_id"] == str(2**62 + 1)
    assert ChangelogMark.from_dict(data) == mark


def _fold(history: list[list[tuple]]) -> dict:
    """The oracle: apply each snapshot's rows in order to a dict (before-images, then after-images)."""
    state: dict = {}
    for snapshot in history:
        for row in snapshot:
            if row[3] in ("DELETE", "UPDATE_BEFORE"):
                state.pop(row[0], None)
        for row in snapshot:
            if row[3] in ("INSERT", "UPDATE_AFTER"):
                state[row[0]] = row[2]
    return state


@st.composite
def histories(draw):
    """Random consistent changelogs: per snapshot each key is inserted, updated, deleted or left alone."""
    live: dict[int, float] = {}
    history = []
    for ordinal in range(1, draw(st.integers(1, 8)) + 1):
        rows = []
        for key in range(draw(st.integers(0, 6))):
            action = draw(st.sampled_from(["insert", "update", "delete", "skip", "update_before_only"]))
            value = float(draw(st.integers(0, 5)))
            if key in live and action == "update":
                rows += [
                    (key, "a", live[key], "UPDATE_BEFORE", ordinal, ordinal),
                    (key, "a", value, "UPDATE_AFTER", ordinal, ordinal),
                ]
                live[key] = value
            elif key in live and action in ("delete", "update_before_only"):
                kind = "DELETE" if action == "delete" else "UPDATE_BEFORE"
                rows.append((key, "a", live.pop(key), kind, ordinal, ordinal))
            elif key not in live and action in ("insert", "update"):
                rows.append((key, "a", value, "INSERT", ordinal, ordinal))
                live[key] = value
        history.append(rows)
    return history


@settings(max_examples=300, deadline=None)
@given(history=histories(), start=st.integers(0, 8), seed=st.integers(0, 1000))
def test_net_changes_equal_a_snapshot_by_snapshot_fold(history, start, seed):
    """Applying the net changes of snapshots after ``start`` to the state at ``start`` gives the final state."""
    before = _fold(history[:start])
    pending = [row for snapshot in history[start:] for row in snapshot]
    random.Random(seed).shuffle(pending)
    upserts, deletes = net_changes(changes(pending), ["id"])
    state = dict(before)
    for key in deletes.column("id").to_pylist():
        state.pop(key, None)
    for row in upserts.to_pylist():
        state[row["id"]] = row["v"]
    assert state == _fold(history)
    assert not set(deletes.column("id").to_pylist()) & set(upserts.column("id").to_pylist())

"""The replay invariant of the design notes, checked on a real source table and its sink.

    state(parent) - {DELETE, UPDATE_BEFORE} + {INSERT, UPDATE_AFTER} == state(snapshot)

as multisets of whole rows (nested values and float bits compared exactly);
no row both removed and added; with identifier columns, UPDATE_BEFORE and
UPDATE_AFTER pair per key and no key is both DELETEd and INSERTed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.table import Table

from cdc_devtools.mor_state import live_state, needs_reference_reader
from cdc_devtools.oracle import row_key

REMOVED = ("DELETE", "UPDATE_BEFORE")
ADDED = ("INSERT", "UPDATE_AFTER")


def multiset(table: pa.Table, names: Sequence[str]) -> Counter:
    return Counter(row_key(row, names) for row in table.select(list(names)).to_pylist())


def changes_of(sink: Table, snapshot_id: int) -> pa.Table:
    """The sink's change rows for one source snapshot."""
    return sink.scan(row_filter=f"_commit_snapshot_id == {snapshot_id}").to_arrow()


def state_at(source: Table, snapshot_id: int | None) -> pa.Table | None:
    """The rows at a snapshot; merge-on-read equality deletes through the tests' own reader."""
    if snapshot_id is None:
        return None
    if needs_reference_reader(source, snapshot_id):
        return live_state(source, snapshot_id)
    return source.scan(snapshot_id=snapshot_id).to_arrow()


def assert_replay(
    source: Table,
    sink: Table,
    snapshot_id: int,
    identifier_columns: Sequence[str] | None = None,
    *,
    names: Sequence[str] | None = None,
    base_snapshot_id: int | None = None,
) -> Counter:
    """Check the invariant for one snapshot; returns its change-type counts.

    ``names`` are the columns compared (default: the snapshot's schema); the
    states are read with the table's current schema, as a downstream replica would.
    ``base_snapshot_id``: the state the changes start from when it is not the
    snapshot's parent (a bridge over a gap in the history starts at the watermark's).
    """
    source.refresh()
    sink.refresh()
    snapshot = source.snapshot_by_id(snapshot_id)
    assert snapshot is not None, f"snapshot {snapshot_id} not in the source"
    names = list(names or [f.name for f in source.schema().fields])
    changes = changes_of(sink, snapshot_id)
    if "_commit_timestamp" in changes.column_names and changes.num_rows:
        stamps = set(changes.column("_commit_timestamp").cast(pa.int64()).to_pylist())  # microseconds
        assert stamps == {snapshot.timestamp_ms * 1000}, (
            f"snapshot {snapshot_id}: _commit_timestamp {stamps} is not the snapshot's commit time "
            f"{snapshot.timestamp_ms} ms"
        )
    kind = changes.column("_change_type")
    removed = multiset(changes.filter(pc.is_in(kind, pa.array(REMOVED))), names)
    added = multiset(changes.filter(pc.is_in(kind, pa.array(ADDED))), names)
    parent = state_at(
        source, base_snapshot_id if base_snapshot_id is not None else snapshot.parent_snapshot_id
    )
    state = multiset(parent, names) if parent is not None else Counter()
    assert not removed - state, f"snapshot {snapshot_id}: removed rows not in the parent's state"
    assert not (removed & added), f"snapshot {snapshot_id}: a row is both removed and added"
    state.subtract(removed)
    state.update(added)
    expected = multiset(state_at(source, snapshot_id), names)
    assert +state == expected, (
        f"snapshot {snapshot_id}: replay differs: missing {sum((expected - +state).values())} rows, "
        f"extra {sum((+state - expected).values())} rows"
    )
    if identifier_columns:
        keys: dict[str, Counter] = {}
        for change in set(kind.to_pylist()):
            rows = changes.filter(pc.equal(kind, change))
            keys[change] = multiset(rows, identifier_columns)
        assert keys.get("UPDATE_BEFORE", Counter()) == keys.get("UPDATE_AFTER", Counter()), (
            f"snapshot {snapshot_id}: UPDATE_BEFORE / UPDATE_AFTER do not pair per key"
        )
        assert not (keys.get("DELETE", Counter()) & keys.get("INSERT", Counter())), (
            f"snapshot {snapshot_id}: a key is both DELETEd and INSERTed"
        )
    return Counter(kind.to_pylist())


def assert_changelog_replays(source: Table, sink: Table, names: Sequence[str] | None = None) -> int:
    """The whole changelog, replayed from nothing in ordinal order, gives the source's current rows.

    For a sink that started at the source's first snapshot: every commit --
    per-snapshot or a bridge over a gap -- must carry the state forward, so
    the end state is the source's now. Returns how many ordinals were replayed.
    """
    source.refresh()
    sink.refresh()
    names = list(names or [f.name for f in source.schema().fields])
    rows = sink.scan().to_arrow()
    state: Counter = Counter()
    ordinals = sorted(set(rows.column("_change_ordinal").to_pylist()))
    for ordinal in ordinals:
        changes = rows.filter(pc.equal(rows.column("_change_ordinal"), ordinal))
        kind = changes.column("_change_type")
        removed = multiset(changes.filter(pc.is_in(kind, pa.array(REMOVED))), names)
        assert not removed - state, f"ordinal {ordinal}: removed rows not in the replayed state"
        state.subtract(removed)
        state.update(multiset(changes.filter(pc.is_in(kind, pa.array(ADDED))), names))
    expected = multiset(state_at(source, source.current_snapshot().snapshot_id), names)
    assert +state == expected, (
        f"the changelog's replay differs from the source's current rows: missing "
        f"{sum((expected - +state).values())}, extra {sum((+state - expected).values())}"
    )
    return len(ordinals)

"""Which source snapshot comes next: the watermark against the table's current history.

The pipeline processes the snapshots of the *current ancestry* of ``main``
(the current snapshot and its parents), oldest first. Snapshots off that line
— rolled back, or from a reset branch — never happened as far as readers of
the table are concerned, so they are never processed.

The watermark is the last processed snapshot. It only means something while
it is still on the current line: if the table was recreated (new uuid), rolled
back past it, or the snapshot expired, continuing would silently skip or
double-count changes, so each case fails with :class:`SourceHistoryError`
naming the table, the snapshots and the way out.

pyiceberg's ``expire_snapshots`` clears the parent id of an expired
snapshot's children (measured), so "no parent" does not prove a snapshot was
the table's first: see :func:`is_table_first_snapshot`.

Ordinals (the sink's ``_change_ordinal``) must increase along the source's
history *for the life of a sink*. Positions in the ancestry shift when old
snapshots expire (pyiceberg's ancestry walk stops at the first expired
parent), so a continuing sink takes ``watermark.ordinal + 1``; only a sink's
first snapshot takes its 1-based position in the ancestry.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot, ancestors_of

from iceberg_cdc.errors import SourceHistoryError
from iceberg_cdc.source.changes import table_name
from iceberg_cdc.watermark import Watermark

StartPosition = Literal["earliest", "latest"]


@dataclass(frozen=True)
class PendingSnapshot:
    """The next snapshot to process.

    ``is_initial_load``: emit the snapshot's whole state as INSERTs
    (:func:`~iceberg_cdc.source.changes.initial_load_changes`) instead of its
    own changes. ``remaining``: snapshots still pending after this one.
    """

    snapshot_id: int
    ordinal: int
    is_initial_load: bool
    remaining: int
    # A bridge over a gap in the history: its changes are from this snapshot (the watermark's, still in
    # the metadata) to ``snapshot_id``, not from ``snapshot_id``'s parent (:class:`HistoryGap`).
    bridge: HistoryGap | None = None


@dataclass(frozen=True)
class HistoryGap:
    """Why the watermark's snapshot is not on ``main``'s line, and where a bridge over it goes.

    ``reason``: ``expired`` (the snapshots after the watermark are gone from
    the metadata) or ``rolled back`` (``main`` no longer descends from it: a
    rollback, ``set_current_snapshot``, a branch published over main).
    ``base``: the watermark's snapshot (the state the changelog describes);
    ``target``: the oldest state of the current line the bridge can reach.
    """

    reason: Literal["expired", "rolled back"]
    base: int
    target: int | None  # None: main ends at the common ancestor; the bridge waits for main's next snapshot
    common_ancestor: int | None = None
    # The watermark's snapshot itself is gone too (no base tag held it): the base state is the
    # changelog's own replay (:mod:`iceberg_cdc.sink.replay`), not a snapshot's files.
    base_gone: bool = False

    def describe(self) -> str:
        if self.base_gone:
            return (
                f"the sink's last processed snapshot {self.base} expired with what followed it; the bridge "
                f"to {self.target} starts from the changelog's own replay"
            )
        if self.reason == "expired":
            return f"the snapshots between {self.base} and {self.target} expired"
        fork = f" (common ancestor {self.common_ancestor})" if self.common_ancestor is not None else ""
        waiting = "; the bridge waits for main's next snapshot" if self.target is None else ""
        return f"main no longer descends from {self.base}{fork}: rolled back or reset{waiting}"


def table_uuid(table: Table) -> str:
    return str(table.metadata.table_uuid)


def current_ancestry(table: Table) -> list[Snapshot]:
    """Snapshots of the current ancestry of ``main``, oldest first ([] for a table without snapshots).

    Uses pyiceberg's ``ancestors_of``, which stops at the first parent that is
    no longer in the metadata (expired), so the oldest element may have a
    ``parent_snapshot_id``.
    """
    ancestry = list(ancestors_of(table.metadata.current_snapshot(), table.metadata))
    ancestry.reverse()
    return ancestry


def is_table_first_snapshot(snapshot: Snapshot) -> bool:
    """Whether ``snapshot`` is positively the table's very first snapshot (so its changes are its state).

    No parent id is not enough: pyiceberg's ``expire_snapshots`` clears the
    ``parent-snapshot-id`` of the children of what it expires (Java keeps it),
    so an expired history looks like a fresh one. A v2 table's first snapshot
    has sequence number 1; v1 tables number every snapshot 0, so there the
    summary must show every data file as added by it. Without that evidence the
    caller does an initial load instead, which gives the same rows for a true
    first snapshot and the right ones for a truncated history.
    """
    if snapshot.parent_snapshot_id is not None:
        return False
    if snapshot.sequence_number == 1:
        return True
    summary = snapshot.summary
    if snapshot.sequence_number == 0 and summary is not None:
        total, added = summary.get("total-data-files"), summary.get("added-data-files")
        return total is not None and total == added
    return False


def _first_snapshot(ancestry: list[Snapshot]) -> PendingSnapshot:
    first = ancestry[0]
    # An oldest snapshot that is not the table's first cannot be diffed against its
    # (expired) parent: load its whole state instead.
    return PendingSnapshot(
        snapshot_id=first.snapshot_id,
        ordinal=1,
        is_initial_load=not is_table_first_snapshot(first),
        remaining=len(ancestry) - 1,
    )


def position_in(ancestry: list[Snapshot], snapshot_id: int) -> int | None:
    for index, snapshot in enumerate(ancestry):
        if snapshot.snapshot_id == snapshot_id:
            return index
    return None


_RESTART = (
    "drop the sink table (the next run creates it again) or point tables[].sink at a new table, and set "
    "`start: latest` for this table, so the next run loads the table's current rows as INSERTs"
)


def _expired_between(table: Table, mark: Snapshot, ancestry: list[Snapshot]) -> bool:
    """Whether the current line is cut off by expiry between the watermark's snapshot and now.

    pyiceberg's ``expire_snapshots`` clears the parent id of an expired
    snapshot's children, and the ancestry walk stops at a missing parent, so a
    watermark whose *following* snapshots expired looks, at first sight, like a
    rollback: its snapshot exists but is not on the line. It is expiry when the
    line is truncated (its oldest snapshot is not the table's first and has no
    parent in the metadata), the watermark's snapshot is older than that, and
    no ancestor of the watermark's snapshot is on the line (after a rollback
    one would be: the common ancestor).
    """
    if not ancestry:
        return False
    oldest = ancestry[0]
    parent = oldest.parent_snapshot_id
    truncated = not is_table_first_snapshot(oldest) and (
        parent is None or table.metadata.snapshot_by_id(parent) is None
    )
    older = mark.timestamp_ms <= oldest.timestamp_ms and (
        not mark.sequence_number
        or not oldest.sequence_number
        or mark.sequence_number < oldest.sequence_number
    )
    return truncated and older and _common_ancestor(table, mark.snapshot_id, ancestry) is None


def watermark_position(table: Table, watermark: Watermark, ancestry: list[Snapshot]) -> int:
    """Index of the watermark's snapshot in ``ancestry``, or the SourceHistoryError that explains why not."""
    name = table_name(table)
    uuid = table_uuid(table)
    if watermark.source_uuid != uuid:
        raise SourceHistoryError(
            f"Table {name} is not the table the sink's watermark belongs to: the watermark was written "
            f"for table uuid {watermark.source_uuid} (last processed snapshot {watermark.snapshot_id}), "
            f"the table now has uuid {uuid}, so it was dropped and recreated. Its history does not "
            "continue from the watermark, and the sink's ordinals would not increase along it. To "
            "capture the new table, start a new sink: drop the sink table (the next run creates it "
            "again and starts from the new table's first snapshot, or from its current rows with "
            "`start: latest`) or point tables[].sink at a new table. Nothing was committed."
        )
    position = position_in(ancestry, watermark.snapshot_id)
    if position is not None:
        return position
    current = ancestry[-1].snapshot_id if ancestry else None
    oldest = ancestry[0].snapshot_id if ancestry else None
    mark = table.metadata.snapshot_by_id(watermark.snapshot_id)
    if mark is None:
        children = [s.snapshot_id for s in ancestry if s.parent_snapshot_id == watermark.snapshot_id]
        after = f"snapshot {children[0]} that follows it" if children else "the snapshots that follow it"
        raise SourceHistoryError(
            f"The sink's last processed snapshot {watermark.snapshot_id} of table {name} has expired "
            f"(it is no longer in the table metadata), so {after} cannot be diffed against it. The "
            f"oldest snapshot left in the current history is {oldest}. Nothing was committed "
            "(tables[].on_history_gap is fail). To go on with this sink, set on_history_gap: bridge: one "
            f"commit then holds the net change from the changelog's own replay to {oldest} (it reads "
            f"every row of the changelog once). Or, to restart, {_RESTART}. "
            "To avoid it, keep tables[].protect_base on (the default: a tag holds the watermark's "
            "snapshot) or keep snapshots longer than the sink's lag (expire_snapshots retention)."
        )
    if _expired_between(table, mark, ancestry):
        parent = ancestry[0].parent_snapshot_id
        gone = f"snapshot {parent} and any before it" if parent is not None else "the snapshots"
        raise SourceHistoryError(
            f"Snapshots of table {name} between the sink's last processed snapshot "
            f"{watermark.snapshot_id} and snapshot {oldest} have expired ({gone} after "
            f"{watermark.snapshot_id}): {oldest} is the oldest snapshot left in the current history, "
            "so the changes of each snapshot in between cannot be read. Nothing was committed "
            "(tables[].on_history_gap is fail). To go on with this sink, set on_history_gap: bridge: "
            f"one commit then holds the net change from {watermark.snapshot_id} to {oldest}. Or, to "
            f"restart, {_RESTART}. To avoid it, set protect_pending: true, or keep snapshots longer "
            "than the sink's lag (expire_snapshots retention)."
        )
    common = _common_ancestor(table, watermark.snapshot_id, ancestry)
    raise SourceHistoryError(
        f"The sink's last processed snapshot {watermark.snapshot_id} of table {name} is no longer in "
        f"the table's current history (current snapshot {current}; common ancestor {common}): the table "
        "was rolled back or its main branch reset to a snapshot that does not descend from it. The sink "
        "already holds changes that the table no longer has. Nothing was committed (tables[]."
        "on_history_gap is fail). To go on with this sink, set on_history_gap: bridge: one commit then "
        "holds the net change back to the current line. Or, to start over, "
        f"{_RESTART}; or, if the rolled-back changes are acceptable in the sink, set the watermark to "
        f"the common ancestor {common} and reprocess from there."
    )


def _common_ancestor(table: Table, snapshot_id: int, ancestry: list[Snapshot]) -> int | None:
    """Newest snapshot of the current ancestry that is also an ancestor of ``snapshot_id``."""
    on_line = {s.snapshot_id for s in ancestry}
    for snapshot in ancestors_of(table.metadata.snapshot_by_id(snapshot_id), table.metadata):
        if snapshot.snapshot_id in on_line:
            return snapshot.snapshot_id
    return None


def history_gap(
    table: Table, watermark: Watermark, ancestry: list[Snapshot] | None = None
) -> HistoryGap | None:
    """The gap between the watermark and ``main``'s line that a bridge can cross, or None.

    Only for the same table (uuid). The bridge's changes are the difference
    between the watermark's state and the target's: read from the watermark's
    snapshot while it is in the metadata (held by the pipeline's base tag,
    ``protect_base``); when it is gone too (a sink configured before that tag),
    from the changelog's replay (``base_gone``), to the oldest snapshot on the
    line -- whether it expired or was rolled back first can no longer be told,
    and the net change to the oldest state left is exact either way.
    Expired: the target is the oldest snapshot on the line.
    Rolled back: the first snapshot after the common ancestor on the line (the
    line's oldest when there is none). When main ends at the common ancestor
    there is no target yet: its own commit already holds the ancestor's
    changes, so the bridge waits for main's next snapshot and goes there.
    """
    ancestry = current_ancestry(table) if ancestry is None else ancestry
    if not ancestry or watermark.source_uuid != table_uuid(table):
        return None
    if position_in(ancestry, watermark.snapshot_id) is not None:
        return None
    mark = table.metadata.snapshot_by_id(watermark.snapshot_id)
    if mark is None:
        return HistoryGap("expired", watermark.snapshot_id, ancestry[0].snapshot_id, base_gone=True)
    if _expired_between(table, mark, ancestry):
        return HistoryGap("expired", mark.snapshot_id, ancestry[0].snapshot_id)
    common = _common_ancestor(table, watermark.snapshot_id, ancestry)
    if common is None:
        return HistoryGap("rolled back", mark.snapshot_id, ancestry[0].snapshot_id)
    position = position_in(ancestry, common)
    assert position is not None
    target = ancestry[position + 1].snapshot_id if position + 1 < len(ancestry) else None
    return HistoryGap("rolled back", mark.snapshot_id, target, common)


def next_snapshot(
    table: Table, watermark: Watermark | None, start: StartPosition, *, bridge: bool = False
) -> PendingSnapshot | None:
    """The oldest unprocessed snapshot of the current ancestry, or None when the sink is caught up.

    Without a watermark, ``earliest`` starts at the oldest snapshot of the
    ancestry (a table's first snapshot has no parent: its changes are all
    INSERTs) and ``latest`` loads the current snapshot's state. ``bridge``
    (``tables[].on_history_gap: bridge``): a gap after the watermark
    (:func:`history_gap`) gives a pending bridge instead of the error that
    names it.
    """
    ancestry = current_ancestry(table)
    if watermark is not None and bridge:
        gap = history_gap(table, watermark, ancestry)
        if gap is not None and gap.target is None:
            return None  # rolled back to an ancestor with nothing after it yet: see history_gap
        if gap is not None and gap.target is not None:
            position = position_in(ancestry, gap.target)
            assert position is not None
            return PendingSnapshot(
                snapshot_id=gap.target,
                ordinal=watermark.ordinal + 1,
                is_initial_load=False,
                remaining=len(ancestry) - position - 1,
                bridge=gap,
            )
    if watermark is None:
        if not ancestry:
            return None
        if start == "earliest":
            return _first_snapshot(ancestry)
        if start == "latest":
            return PendingSnapshot(
                snapshot_id=ancestry[-1].snapshot_id, ordinal=len(ancestry), is_initial_load=True, remaining=0
            )
        raise ValueError(f"start must be 'earliest' or 'latest', not {start!r}")
    position = watermark_position(table, watermark, ancestry)
    if position + 1 >= len(ancestry):
        return None
    return PendingSnapshot(
        snapshot_id=ancestry[position + 1].snapshot_id,
        ordinal=watermark.ordinal + 1,
        is_initial_load=False,
        remaining=len(ancestry) - position - 2,
    )


def pending_count(
    table: Table, watermark: Watermark | None, start: StartPosition = "earliest", *, bridge: bool = False
) -> int:
    """How many snapshots the sink still has to process after its watermark (0 when caught up); a bridge is one."""
    pending = next_snapshot(table, watermark, start, bridge=bridge)
    return 0 if pending is None else pending.remaining + 1


def oldest_pending(
    table: Table, watermark: Watermark | None, start: StartPosition = "earliest", *, bridge: bool = False
) -> tuple[int, datetime] | None:
    """The oldest unprocessed snapshot's id and when it was committed (UTC); None when caught up.

    What freshness is measured from, for the changelog (its watermark) and for
    each mirror (its mark): the age of the oldest change not yet delivered.
    """
    pending = next_snapshot(table, watermark, start, bridge=bridge)
    if pending is None:
        return None
    snapshot = table.metadata.snapshot_by_id(pending.snapshot_id)
    if snapshot is None:
        return None
    return pending.snapshot_id, datetime.fromtimestamp(snapshot.timestamp_ms / 1000, tz=UTC)

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
            f"(it is no longer in the table metadata), so {after} cannot be diffed against it: the "
            f"files it removed may be gone. The oldest snapshot left in the current history is "
            f"{oldest}. Nothing was committed. To recover, {_RESTART}. To avoid it, keep snapshots "
            "longer than the sink's lag (expire_snapshots retention)."
        )
    if _expired_between(table, mark, ancestry):
        raise SourceHistoryError(
            f"The snapshots of table {name} after the sink's last processed snapshot "
            f"{watermark.snapshot_id} have expired: the oldest snapshot left in the current history is "
            f"{oldest}, and its parent is gone, so the changes between them cannot be read. Nothing "
            f"was committed. To recover, {_RESTART}. To avoid it, keep snapshots longer than the "
            "sink's lag (expire_snapshots retention)."
        )
    raise SourceHistoryError(
        f"The sink's last processed snapshot {watermark.snapshot_id} of table {name} is no longer in "
        f"the table's current history (current snapshot {current}): the table was rolled back or its "
        "main branch reset to a snapshot that does not descend from it. The sink already holds changes "
        f"that the table no longer has. Nothing was committed. To start over, {_RESTART}; or, if the "
        "rolled-back changes are acceptable in the sink, set the watermark to the common ancestor "
        f"{_common_ancestor(table, watermark.snapshot_id, ancestry)} and reprocess from there."
    )


def _common_ancestor(table: Table, snapshot_id: int, ancestry: list[Snapshot]) -> int | None:
    """Newest snapshot of the current ancestry that is also an ancestor of ``snapshot_id``."""
    on_line = {s.snapshot_id for s in ancestry}
    for snapshot in ancestors_of(table.metadata.snapshot_by_id(snapshot_id), table.metadata):
        if snapshot.snapshot_id in on_line:
            return snapshot.snapshot_id
    return None


def next_snapshot(table: Table, watermark: Watermark | None, start: StartPosition) -> PendingSnapshot | None:
    """The oldest unprocessed snapshot of the current ancestry, or None when the sink is caught up.

    Without a watermark, ``earliest`` starts at the oldest snapshot of the
    ancestry (a table's first snapshot has no parent: its changes are all
    INSERTs) and ``latest`` loads the current snapshot's state.
    """
    ancestry = current_ancestry(table)
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


def pending_count(table: Table, watermark: Watermark | None, start: StartPosition = "earliest") -> int:
    """How many snapshots the sink still has to process after its watermark (0 when caught up)."""
    pending = next_snapshot(table, watermark, start)
    return 0 if pending is None else pending.remaining + 1


def oldest_pending(
    table: Table, watermark: Watermark | None, start: StartPosition = "earliest"
) -> tuple[int, datetime] | None:
    """The oldest unprocessed snapshot's id and when it was committed (UTC); None when caught up.

    What freshness is measured from, for the changelog (its watermark) and for
    each mirror (its mark): the age of the oldest change not yet delivered.
    """
    pending = next_snapshot(table, watermark, start)
    if pending is None:
        return None
    snapshot = table.metadata.snapshot_by_id(pending.snapshot_id)
    if snapshot is None:
        return None
    return pending.snapshot_id, datetime.fromtimestamp(snapshot.timestamp_ms / 1000, tz=UTC)

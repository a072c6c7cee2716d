"""Which snapshots a manual run may reprocess: one snapshot, or a range, of the current history.

A reprocess replaces the sink's rows of a snapshot the sink already holds (or
runs the next pending one). It is refused, naming the fix, when the snapshot
is not in the source's current history (expired, rolled back, another
table's), when the sink has nothing to replace yet, and for a range whose
ends are out of order or reach past the watermark. Ordinary runs' choice of
the next snapshot is :mod:`iceberg_cdc.source.history`'s.
"""

from __future__ import annotations

from pyiceberg.table import Table

from iceberg_cdc.errors import SourceHistoryError
from iceberg_cdc.source.changes import table_name
from iceberg_cdc.source.history import (
    PendingSnapshot,
    StartPosition,
    current_ancestry,
    is_table_first_snapshot,
    next_snapshot,
    position_in,
    watermark_position,
)
from iceberg_cdc.watermark import Watermark

# A double holds 53 bits: a 63-bit id a browser parsed as a number is off by at most 512 (ids below 2**63).
ROUNDING_REACH = 2048


def _why_not_in_ancestry(table: Table, snapshot_id: int) -> str:
    """Why a snapshot id cannot be processed: gone from the metadata, or off the current history."""
    if table.metadata.snapshot_by_id(snapshot_id) is None:
        return "it does not exist in the table metadata (expired, or from another table)"
    return "it is not in the current history of main (rolled back, or on another branch)"


def rounding_hint(table: Table, snapshot_id: int, param: str = "snapshot_id") -> str:
    """When no snapshot has ``snapshot_id`` but one is within :data:`ROUNDING_REACH` of it: the id was rounded.

    An unquoted 19-digit id in the Trigger form's JSON editor (or any browser's
    JSON) becomes a double and loses its last digits; the run then looks for
    a snapshot that never existed. The hint names the near snapshot and says
    to quote the id. Empty when the id exists or nothing is near.
    """
    if table.metadata.snapshot_by_id(snapshot_id) is not None:
        return ""
    near = [
        s.snapshot_id for s in table.metadata.snapshots if abs(s.snapshot_id - snapshot_id) <= ROUNDING_REACH
    ]
    if not near:
        return ""
    meant = min(near, key=lambda found: abs(found - snapshot_id))
    return (
        f" The id looks rounded: snapshot {meant} differs from it by only {abs(meant - snapshot_id)}, as when "
        "a browser or the Trigger form's JSON editor reads an unquoted 19-digit number (it keeps about 16 "
        f'digits). Quote the id, as a string of digits: {{"{param}": "{meant}"}} if {meant} is the one you '
        "meant."
    )


def validate_manual_snapshot(
    table: Table,
    snapshot_id: int,
    watermark: Watermark | None = None,
    start: StartPosition = "earliest",
    *,
    loaded_in_full: bool = False,
) -> PendingSnapshot:
    """Check a snapshot given for a manual reprocess, and give it its ordinal.

    It must be in the current ancestry (a rolled-back snapshot never happened
    for readers of the table) and at most the next pending snapshot: a later
    one would carry the watermark past snapshots that were never processed.
    With no watermark (a fresh sink) that means exactly the snapshot the next
    scheduled run would pick, with the same ordinal and initial-load flag.
    ``loaded_in_full``: the sink holds this snapshot as an initial load (its
    whole state as INSERTs, ``start: latest``), so a reprocess loads the whole
    state again instead of replacing it with the snapshot's own diff.
    ``remaining`` counts the snapshots pending after the watermark.
    """
    ancestry = current_ancestry(table)
    position = position_in(ancestry, snapshot_id)
    name = table_name(table)
    if position is None:
        reason = _why_not_in_ancestry(table, snapshot_id)
        raise SourceHistoryError(
            f"Cannot reprocess snapshot {snapshot_id} of table {name}: {reason}. Only snapshots of the "
            f"current ancestry can be processed; the current snapshot is "
            f"{ancestry[-1].snapshot_id if ancestry else None} and the oldest one still available is "
            f"{ancestry[0].snapshot_id if ancestry else None}.{rounding_hint(table, snapshot_id)}"
        )
    if watermark is None:
        first = next_snapshot(table, None, start)
        if first is None or first.snapshot_id != snapshot_id:
            raise SourceHistoryError(
                f"Cannot process snapshot {snapshot_id} of table {name} on its own: the sink has no "
                f"watermark yet, so the first run must process snapshot {first and first.snapshot_id} "
                f"(start: {start}); committing {snapshot_id} first would set the watermark there and the "
                "snapshots before it would never reach the sink. Nothing was run. Trigger the DAG without "
                "snapshot_id to process the pending snapshots in order."
            )
        return first
    marked = watermark_position(table, watermark, ancestry)
    if position > marked + 1:
        # Committing it would move the watermark past the snapshots in between: lost for good.
        raise SourceHistoryError(
            f"Cannot process snapshot {snapshot_id} of table {name} on its own: the sink's watermark "
            f"is at snapshot {watermark.snapshot_id}, and the {position - marked - 1} snapshot(s) "
            f"between them (the next one is {ancestry[marked + 1].snapshot_id}) are not processed "
            "yet; committing this one would move the watermark past them and their changes would "
            "never reach the sink. Nothing was run. Trigger the DAG without snapshot_id to process "
            "the pending snapshots in order; snapshot_id is for reprocessing a snapshot the sink "
            "already holds (or the next pending one)."
        )
    is_first = position == 0 and not is_table_first_snapshot(ancestry[0])
    return PendingSnapshot(
        snapshot_id=snapshot_id,
        ordinal=watermark.ordinal + position - marked,
        is_initial_load=loaded_in_full or is_first,
        remaining=len(ancestry) - max(position, marked) - 1,
    )


def validate_reprocess_range(
    table: Table, first_id: int, through_id: int, watermark: Watermark | None
) -> list[int]:
    """The snapshots a range reprocess (``snapshot_id`` A through ``through_snapshot_id`` B) will redo.

    A range reprocess replaces, one run per snapshot and in order, the rows of
    snapshots the sink already holds: A, then each snapshot after it in the
    current ancestry, up to and including B. So the sink must have a watermark
    (a fresh sink holds nothing to replace), both snapshots must be in the
    current ancestry (not expired, not rolled back), B must not come before A,
    and B must not be after the watermark (pending snapshots are processed by
    ordinary runs, in order). Returns the ids A..B, oldest first.
    """
    name = table_name(table)
    if watermark is None:
        raise SourceHistoryError(
            f"Cannot reprocess snapshots {first_id} through {through_id} of table {name}: the sink has "
            "no watermark yet, so it holds no snapshot to replace. Nothing was run. Trigger the DAG "
            "without snapshot_id and through_snapshot_id to process the pending snapshots in order."
        )
    ancestry = current_ancestry(table)
    marked = watermark_position(table, watermark, ancestry)
    positions = {}
    for label, snapshot_id in (("snapshot_id", first_id), ("through_snapshot_id", through_id)):
        position = position_in(ancestry, snapshot_id)
        if position is None:
            reason = _why_not_in_ancestry(table, snapshot_id)
            raise SourceHistoryError(
                f"Cannot reprocess snapshots {first_id} through {through_id} of table {name}: "
                f"{label} {snapshot_id} is not usable: {reason}. Only snapshots of the current ancestry "
                f"can be reprocessed; the oldest one still available is "
                f"{ancestry[0].snapshot_id if ancestry else None}, the sink's watermark is at "
                f"{watermark.snapshot_id}. Nothing was run.{rounding_hint(table, snapshot_id, label)}"
            )
        positions[label] = position
    first, through = positions["snapshot_id"], positions["through_snapshot_id"]
    if through < first:
        raise SourceHistoryError(
            f"Cannot reprocess snapshots {first_id} through {through_id} of table {name}: "
            f"through_snapshot_id {through_id} comes before snapshot_id {first_id} in the current "
            f"history (positions {through + 1} and {first + 1}). Nothing was run. Swap them: "
            f'{{"snapshot_id": {through_id}, "through_snapshot_id": {first_id}}}.'
        )
    if through > marked:
        raise SourceHistoryError(
            f"Cannot reprocess snapshots {first_id} through {through_id} of table {name}: "
            f"through_snapshot_id {through_id} is not processed yet (the sink's watermark is at "
            f"snapshot {watermark.snapshot_id}). A range reprocess only replaces snapshots the sink "
            f"holds. Nothing was run. Use a through_snapshot_id up to {watermark.snapshot_id}, and "
            "trigger the DAG without snapshot_id to process the pending snapshots in order."
        )
    return [s.snapshot_id for s in ancestry[first : through + 1]]

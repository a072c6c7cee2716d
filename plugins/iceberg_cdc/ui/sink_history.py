"""The sink's own record of what was processed: one entry per CDC commit, with its figures.

Read from the sink table's snapshot summaries, which the commit step writes
(:mod:`iceberg_cdc.run.commit_step`) and which outlive Airflow's
database: INSERT / DELETE / UPDATE counts, carryover, shuffle bytes, seconds
per phase, the conservation rows (``cdc.rows.*``) and skew. Commits made
before a figure existed simply lack it (shown as unknown, never as zero).

A history that stays true: a snapshot reprocessed later has two commits in
the sink's history; the older one's rows were deleted by the reprocess, so it
is marked **replaced** (by which sink commit, and when) instead of being
listed as if it still held the snapshot's changes. No Airflow import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from iceberg_cdc.units import format_bytes

DEFAULT_RECENT = 10

# The commit's summary is read through iceberg_cdc.sink.summary.CommitSummary (imported where used:
# it brings pyiceberg). The conservation stages shown:
ROW_STAGES = ("input", "shuffled", "read", "carryover", "changes")
# Recorded when not zero-by-construction: rows delete files masked, carryover cancelled before the shuffle.
OPTIONAL_ROW_STAGES = ("masked", "cancelled")
# Phases in the order a run goes through them; others follow alphabetically.
PHASE_ORDER = ("detect", "insert", "write", "coalesce", "read", "commit", "watermark", "cleanup")


@dataclass(frozen=True)
class ProcessedSnapshot:
    """One source snapshot committed to the sink, with the figures its commit recorded."""

    source_snapshot_id: int
    ordinal: int | None
    sink_snapshot_id: int
    committed_at: datetime
    operation: str | None  # the source snapshot's operation (append, overwrite, ...)
    initial_load: bool
    reprocess: bool  # a manual reprocess that replaced the snapshot's earlier rows
    inserts: int | None
    deletes: int | None
    updates: int | None
    carryover_rows: int | None
    shuffle_bytes: int | None
    change_rows: int | None  # rows added to the sink (INSERT + DELETE + 2 x UPDATE)
    seconds: dict[str, float] = field(default_factory=dict)
    # conservation rows: input, shuffled, read, carryover, changes (and masked, cancelled when recorded)
    rows: dict[str, int] = field(default_factory=dict)
    skew: list[str] = field(default_factory=list)
    # A later commit of the same source snapshot (a reprocess) deleted this one's rows.
    replaced_by: int | None = None  # that commit's sink snapshot id
    replaced_at: datetime | None = None
    # A bridge over a gap in the source's history: reason, from, common_ancestor (ids as strings).
    bridge: dict[str, str | None] | None = None

    @property
    def replaced(self) -> bool:
        return self.replaced_by is not None

    @property
    def balanced(self) -> bool | None:
        """Whether the conservation rows add up (None when the commit recorded none).

        input = masked + cancelled + read, read = carryover + changes, and the shuffle (when there
        was one) held every row read.
        """
        if not all(stage in self.rows for stage in ROW_STAGES):
            return None
        r = self.rows
        return (
            r["read"] + r.get("masked", 0) + r.get("cancelled", 0) == r["input"]
            and r["read"] == r["carryover"] + r["changes"]
            and r["shuffled"] in (0, r["read"])
        )

    @property
    def total_seconds(self) -> float | None:
        return round(sum(self.seconds.values()), 2) if self.seconds else None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        # 64-bit ids as strings: JSON readers in browsers lose digits above 2**53.
        out["source_snapshot_id"] = str(self.source_snapshot_id)
        out["sink_snapshot_id"] = str(self.sink_snapshot_id)
        out["committed_at"] = _iso(self.committed_at)
        out["replaced"] = self.replaced
        out["replaced_by"] = None if self.replaced_by is None else str(self.replaced_by)
        out["replaced_at"] = _iso(self.replaced_at)
        out["balanced"] = self.balanced
        out["total_seconds"] = self.total_seconds
        return out


def _phase_key(phase: str) -> tuple[int, str]:
    return (PHASE_ORDER.index(phase) if phase in PHASE_ORDER else len(PHASE_ORDER), phase)


def skew_warnings(summary: Mapping[str, str]) -> list[str]:
    """Skew a commit recorded, as readable warnings; [] when it recorded none (or found none).

    The commit step records how many partitions were skewed, which ones, and
    the largest one's size and ratio to the median partition
    (:class:`iceberg_cdc.sink.summary.Skew`).
    """
    from iceberg_cdc.sink.summary import Skew

    skew = Skew.from_summary(summary)
    if skew is None or not skew.count:
        return []
    listed = [str(p) for p in skew.partitions]
    noun = "partition" if skew.count == 1 else "partitions"
    text = f"{skew.count} skewed {noun}"
    if listed:
        more = ", …" if len(listed) < skew.count else ""
        text += f" ({', '.join(listed)}{more})"
    if skew.max_ratio is not None and skew.max_bytes is not None:
        which = "" if skew.count == 1 else "largest "
        text += f": {which}{format_bytes(skew.max_bytes)}, {skew.max_ratio:.0f}x the median"
    return [text]


def processed_snapshot(snapshot: Any, summary: Mapping[str, str]) -> ProcessedSnapshot | None:
    """The figures of one sink commit (a pyiceberg Snapshot and its summary), or None if it is no CDC commit."""
    from iceberg_cdc.sink.summary import CommitSummary, int_value

    record = CommitSummary.from_summary(summary)
    if record.source_snapshot_id is None:
        return None
    rows = {stage: record.rows[stage] for stage in ROW_STAGES + OPTIONAL_ROW_STAGES if stage in record.rows}
    change_rows = rows.get("changes")
    if change_rows is None:
        change_rows = int_value(summary.get("added-records"))
    return ProcessedSnapshot(
        source_snapshot_id=record.source_snapshot_id,
        ordinal=record.change_ordinal,
        sink_snapshot_id=snapshot.snapshot_id,
        committed_at=_from_ms(snapshot.timestamp_ms),
        operation=record.operation,
        initial_load=record.initial_load is True,
        reprocess=record.replace,
        inserts=record.inserts,
        deletes=record.deletes,
        updates=record.updates,
        carryover_rows=record.carryover_rows,
        shuffle_bytes=record.shuffle_bytes,
        change_rows=change_rows,
        seconds=dict(sorted(record.seconds.items(), key=lambda item: _phase_key(item[0]))),
        rows=rows,
        skew=skew_warnings(summary),
        bridge=None
        if record.bridge is None
        else {
            "reason": record.bridge.reason,
            "from": str(record.bridge.from_snapshot_id),
            "common_ancestor": None
            if record.bridge.common_ancestor is None
            else str(record.bridge.common_ancestor),
        },
    )


def recent_commits(sink_table: Any, source: str, limit: int = DEFAULT_RECENT) -> list[ProcessedSnapshot]:
    """The last ``limit`` commits of ``source`` in the sink's current history, newest first.

    An older commit of a source snapshot that a later one (a reprocess) replaced is marked so.
    """
    from pyiceberg.table.snapshots import ancestors_of

    from iceberg_cdc.sink.summary import SOURCE_TABLE_KEY
    from iceberg_cdc.sink.table import summary_properties

    found: list[ProcessedSnapshot] = []
    if limit <= 0:
        return found
    # source snapshot id -> the newest commit of it seen so far (walking newest first)
    newest: dict[int, ProcessedSnapshot] = {}
    for snapshot in ancestors_of(sink_table.current_snapshot(), sink_table.metadata):
        summary = summary_properties(snapshot)
        if summary.get(SOURCE_TABLE_KEY) != source:
            continue
        processed = processed_snapshot(snapshot, summary)
        if processed is None:
            continue
        later = newest.get(processed.source_snapshot_id)
        if later is not None:
            processed = replace(processed, replaced_by=later.sink_snapshot_id, replaced_at=later.committed_at)
        else:
            newest[processed.source_snapshot_id] = processed
        found.append(processed)
        if len(found) >= limit:
            break
    return found


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat().replace("+00:00", "Z")


def _from_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)

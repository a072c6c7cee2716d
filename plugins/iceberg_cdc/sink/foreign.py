"""Sink snapshots the pipeline did not write: another writer changed the changelog.

Every snapshot the pipeline commits to a sink carries its marker
(``cdc.source-table``; appends also the source snapshot, a reprocess's delete
the replaced snapshot). A snapshot in the sink's current history without it,
other than a ``replace`` (a compaction: same rows, new files), was written by
someone else -- an append of rows that are no change of the source, a delete
of change rows. Nothing breaks (the watermark and exactly-once marker live in
the pipeline's own commits), but readers of the changelog would take those
rows for changes, so detect warns in the run's note and the CDC view lists
them. No Airflow import.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from iceberg_cdc.sink.table import SOURCE_TABLE_KEY, summary_properties

SCAN_LIMIT = 1000  # sink snapshots looked at, newest first: the cost stays bounded on a long history


@dataclass(frozen=True)
class ForeignCommit:
    """A sink snapshot without the pipeline's marker."""

    snapshot_id: int
    operation: str
    committed_at: datetime
    added_records: int | None
    deleted_records: int | None

    def describe(self) -> str:
        counts = []
        if self.added_records:
            counts.append(f"+{self.added_records:,} rows")
        if self.deleted_records:
            counts.append(f"-{self.deleted_records:,} rows")
        what = f", {', '.join(counts)}" if counts else ""
        stamp = self.committed_at.strftime("%Y-%m-%d %H:%M:%S UTC")
        return f"snapshot {self.snapshot_id} ({self.operation}{what}, {stamp})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "snapshot_id": str(self.snapshot_id),  # 64-bit: a string for browsers
            "operation": self.operation,
            "committed_at": self.committed_at.isoformat().replace("+00:00", "Z"),
            "added_records": self.added_records,
            "deleted_records": self.deleted_records,
        }


def _count(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def foreign_commits(sink_table: Any, source: str, limit: int = SCAN_LIMIT) -> list[ForeignCommit]:
    """Snapshots of the sink's current history not written for ``source`` by the pipeline, newest first."""
    from pyiceberg.table.snapshots import ancestors_of

    found: list[ForeignCommit] = []
    current = sink_table.current_snapshot()
    if current is None:
        return found
    for seen, snapshot in enumerate(ancestors_of(current, sink_table.metadata)):
        if seen >= limit:
            break
        summary = summary_properties(snapshot)
        operation = str(getattr(snapshot.summary, "operation", "") or summary.get("operation", "?"))
        operation = operation.rsplit(".", 1)[-1].lower()
        if summary.get(SOURCE_TABLE_KEY) == source or operation == "replace":
            continue
        found.append(
            ForeignCommit(
                snapshot_id=snapshot.snapshot_id,
                operation=operation,
                committed_at=datetime.fromtimestamp(snapshot.timestamp_ms / 1000, tz=UTC),
                added_records=_count(summary.get("added-records")),
                deleted_records=_count(summary.get("deleted-records")),
            )
        )
    return found


def foreign_commits_warning(sink_table: Any, source: str) -> str | None:
    """One line for the run's note when the sink holds snapshots the pipeline did not write, else None."""
    found = foreign_commits(sink_table, source)
    if not found:
        return None
    name = ".".join(sink_table.name()) if hasattr(sink_table, "name") else "the sink"
    return (
        f"sink {name} has {len(found)} snapshot(s) the pipeline did not write (newest: "
        f"{found[0].describe()}): another writer changed the changelog, and its rows are no changes of "
        f"{source}. Find that writer; remove its rows (or roll the sink back) if they do not belong there."
    )

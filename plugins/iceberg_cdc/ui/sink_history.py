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

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from iceberg_cdc.run.story import format_bytes

DEFAULT_RECENT = 10

# Summary keys written by the commit step (run/commit_step.py): the
# stats figures become ``cdc.<name with - for _>``, phases ``cdc.seconds.<phase>``,
# conservation ``cdc.rows.<stage>``.
_FIGURE_KEYS = {
    "inserts": "cdc.inserts",
    "deletes": "cdc.deletes",
    "updates": "cdc.updates",  # pairs: one UPDATE_BEFORE and one UPDATE_AFTER row each
    "carryover_rows": "cdc.carryover-rows",
    "shuffle_bytes": "cdc.shuffle-bytes",
}
_SECONDS_PREFIX = "cdc.seconds."
_ROWS_PREFIX = "cdc.rows."
ROW_STAGES = ("input", "shuffled", "read", "carryover", "changes")
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
    # conservation rows: input, shuffled, read, carryover, changes
    rows: dict[str, int] = field(default_factory=dict)
    skew: list[str] = field(default_factory=list)
    # A later commit of the same source snapshot (a reprocess) deleted this one's rows.
    replaced_by: int | None = None  # that commit's sink snapshot id
    replaced_at: datetime | None = None

    @property
    def replaced(self) -> bool:
        return self.replaced_by is not None

    @property
    def balanced(self) -> bool | None:
        """Whether the conservation rows add up (None when the commit recorded none).

        input = read = carryover + changes, and the shuffle (when there was one) held every input row.
        """
        if not all(stage in self.rows for stage in ROW_STAGES):
            return None
        r = self.rows
        return (
            r["read"] == r["input"]
            and r["read"] == r["carryover"] + r["changes"]
            and r["shuffled"] in (0, r["input"])
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


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        try:
            return int(float(value))
        except ValueError:
            return None


def _float(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


def _phase_key(phase: str) -> tuple[int, str]:
    return (PHASE_ORDER.index(phase) if phase in PHASE_ORDER else len(PHASE_ORDER), phase)


def skew_warnings(summary: Mapping[str, str]) -> list[str]:
    """Skew a commit recorded, as readable warnings; [] when it recorded none (or found none).

    The commit step writes ``cdc.skewed`` (how many partitions were skewed),
    ``cdc.skew.max-ratio`` (the largest one over the median partition),
    ``cdc.skew.max-bytes`` and ``cdc.skew.partitions``
    (:func:`iceberg_cdc.pipeline.groups.skew_summary`).
    """
    count = _int(summary.get("cdc.skewed"))
    if not count:
        return []
    listed = [p for p in re.split(r"[\s,\[\]]+", summary.get("cdc.skew.partitions", "")) if p]
    noun = "partition" if count == 1 else "partitions"
    text = f"{count} skewed {noun}"
    if listed:
        more = ", …" if len(listed) < count else ""
        text += f" ({', '.join(listed)}{more})"
    ratio = _float(summary.get("cdc.skew.max-ratio", ""))
    size = _int(summary.get("cdc.skew.max-bytes"))
    if ratio is not None and size is not None:
        which = "" if count == 1 else "largest "
        text += f": {which}{format_bytes(size)}, {ratio:.0f}x the median"
    return [text]


def processed_snapshot(snapshot: Any, summary: Mapping[str, str]) -> ProcessedSnapshot | None:
    """The figures of one sink commit (a pyiceberg Snapshot and its summary), or None if it is no CDC commit."""
    from iceberg_cdc.sink.table import (
        CHANGE_ORDINAL_KEY,
        INITIAL_LOAD_KEY,
        REPLACE_KEY,
        SOURCE_SNAPSHOT_ID_KEY,
    )

    source_snapshot = _int(summary.get(SOURCE_SNAPSHOT_ID_KEY))
    if source_snapshot is None:
        return None
    figures = {name: _int(summary.get(key)) for name, key in _FIGURE_KEYS.items()}
    seconds = {}
    for key, value in summary.items():
        if key.startswith(_SECONDS_PREFIX) and (number := _float(value)) is not None:
            seconds[key.removeprefix(_SECONDS_PREFIX)] = number
    rows = {}
    for stage in ROW_STAGES:
        number = _int(summary.get(_ROWS_PREFIX + stage))
        if number is not None:
            rows[stage] = number
    change_rows = rows.get("changes")
    if change_rows is None:
        change_rows = _int(summary.get("added-records"))
    return ProcessedSnapshot(
        source_snapshot_id=source_snapshot,
        ordinal=_int(summary.get(CHANGE_ORDINAL_KEY)),
        sink_snapshot_id=snapshot.snapshot_id,
        committed_at=_from_ms(snapshot.timestamp_ms),
        operation=summary.get("cdc.operation"),
        initial_load=summary.get(INITIAL_LOAD_KEY) == "true",
        reprocess=summary.get(REPLACE_KEY) == "true",
        change_rows=change_rows,
        seconds=dict(sorted(seconds.items(), key=lambda item: _phase_key(item[0]))),
        rows=rows,
        skew=skew_warnings(summary),
        **figures,
    )


def recent_commits(sink_table: Any, source: str, limit: int = DEFAULT_RECENT) -> list[ProcessedSnapshot]:
    """The last ``limit`` commits of ``source`` in the sink's current history, newest first.

    An older commit of a source snapshot that a later one (a reprocess) replaced is marked so.
    """
    from pyiceberg.table.snapshots import ancestors_of

    from iceberg_cdc.sink.table import SOURCE_TABLE_KEY, summary_properties

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

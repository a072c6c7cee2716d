"""The CDC view's status model of one table: what the page and the JSON show, and how it is written.

Built by :func:`iceberg_cdc.ui.status.table_status` from the catalog alone;
64-bit snapshot ids leave here as strings (a browser's JSON reader would
round them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from iceberg_cdc.run.freshness import breaches
from iceberg_cdc.sink.foreign import ForeignCommit
from iceberg_cdc.ui.blocking import Blocked
from iceberg_cdc.ui.mirrors import MirrorStatus
from iceberg_cdc.ui.sink_history import ProcessedSnapshot


@dataclass(frozen=True)
class LeaseStatus:
    """A run holding the table's lease now."""

    owner: str
    epoch: int
    expires_at: datetime
    host: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "owner": self.owner,
            "epoch": self.epoch,
            "expires_at": _iso(self.expires_at),
            "host": self.host,
        }


@dataclass
class TableStatus:
    """One configured table: watermark, lag, recent commits, and what could not be read."""

    source: str
    sink: str
    dag_id: str
    start: str
    checked_at: datetime
    source_exists: bool | None = None
    sink_exists: bool | None = None
    source_snapshot_id: int | None = None  # the source's current snapshot
    source_snapshot_at: datetime | None = None
    watermark_snapshot_id: int | None = None
    watermark_ordinal: int | None = None
    watermark_snapshot_at: datetime | None = None  # when the source made the watermark's snapshot
    pending: int | None = None
    oldest_pending_snapshot_id: int | None = None
    oldest_pending_at: datetime | None = None
    recent: list[ProcessedSnapshot] = field(default_factory=list)
    foreign: list[ForeignCommit] = field(default_factory=list)  # sink snapshots the pipeline did not write
    lease: LeaseStatus | None = None
    lease_checked: bool = False
    # The retention guard (source/retention.py): when a snapshot the sink needs may be expired.
    retention: dict[str, Any] | None = None
    retention_warning: str | None = None
    mirrors: list[MirrorStatus] = field(default_factory=list)  # each mirror's watermark and lag
    freshness_slo: float | None = None  # tables[].freshness_slo: "late" (red) above it
    # A failed run no retry can fix holds the table up (ui/blocking.py; set from Airflow's runs by the app).
    blocked: Blocked | None = None
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def oldest_pending_age_seconds(self) -> float | None:
        if self.oldest_pending_at is None:
            return None
        return max(0.0, (self.checked_at - self.oldest_pending_at).total_seconds())

    @property
    def freshness_breached(self) -> bool:
        """The oldest pending snapshot is older than the table's freshness SLO (run/freshness.py's rule)."""
        return breaches(self.oldest_pending_age_seconds, self.freshness_slo)

    @property
    def last_commit(self) -> ProcessedSnapshot | None:
        return self.recent[0] if self.recent else None

    @property
    def warnings(self) -> list[str]:
        """What the operator should look at although the table is readable (foreign sink commits)."""
        if not self.foreign:
            return []
        return [
            f"the sink has {len(self.foreign)} snapshot(s) the pipeline did not write (newest: "
            f"{self.foreign[0].describe()}): another writer changed the changelog; its rows are no "
            f"changes of {self.source}"
        ]

    @property
    def state(self) -> str:
        """``blocked``, ``error``, ``late`` (behind by more than the freshness SLO), ``behind``, ``caught-up``
        or ``unknown``. Blocked comes first: however far behind, no run moves the table until a person acts."""
        if self.blocked is not None:
            return "blocked"
        if self.errors:
            return "error"
        if self.pending is None:
            return "unknown"
        if self.pending and self.freshness_breached:
            return "late"
        return "behind" if self.pending else "caught-up"

    @property
    def skewed_commits(self) -> int:
        return sum(1 for s in self.recent if s.skew)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "sink": self.sink,
            "dag_id": self.dag_id,
            "start": self.start,
            "state": self.state,
            "blocked": self.blocked.to_dict() if self.blocked else None,
            "checked_at": _iso(self.checked_at),
            "source_exists": self.source_exists,
            "sink_exists": self.sink_exists,
            "source_snapshot_id": _id(self.source_snapshot_id),
            "source_snapshot_at": _iso(self.source_snapshot_at),
            "watermark": None
            if self.watermark_snapshot_id is None
            else {
                "snapshot_id": _id(self.watermark_snapshot_id),
                "ordinal": self.watermark_ordinal,
                "snapshot_at": _iso(self.watermark_snapshot_at),
            },
            "lag": {
                "pending_snapshots": self.pending,
                "oldest_pending_snapshot_id": _id(self.oldest_pending_snapshot_id),
                "oldest_pending_at": _iso(self.oldest_pending_at),
                "oldest_pending_age_seconds": self.oldest_pending_age_seconds,
            },
            "freshness": {"slo_seconds": self.freshness_slo, "breached": self.freshness_breached},
            "recent": [s.to_dict() for s in self.recent],
            "foreign_commits": [f.to_dict() for f in self.foreign],
            "warnings": self.warnings,
            "lease": self.lease.to_dict() if self.lease else None,
            "retention": self.retention,
            "retention_warning": self.retention_warning,
            "mirrors": [m.to_dict() for m in self.mirrors],
            "errors": list(self.errors),
            "notes": list(self.notes),
        }


def _id(value: int | None) -> str | None:
    return None if value is None else str(value)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat().replace("+00:00", "Z")


def from_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)

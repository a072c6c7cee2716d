"""Where each mirror of a table stands: its watermark, its lag and its last apply, for the CDC view.

A mirror's watermark is a :class:`~iceberg_cdc.mirror.net_changes.ChangelogMark`
that its target stores with its rows (the PostgreSQL state table; the Iceberg
mirror's own metadata). Its lag, in snapshots:

* **behind the changelog** -- changelog snapshots (ordinals) the changelog has
  and the mirror has not applied yet (its DAG's next run applies them at once);
* **behind the source** -- that plus the source snapshots the changelog itself
  has not processed yet;

and in time: the age of the oldest source snapshot after the mirror's (the
oldest change the mirror does not hold yet), as the table's own lag is the
age of its oldest pending snapshot.

The **last apply** (time, rows, seconds) is the latest apply run, one that
changed no row included, for both targets alike; it comes from where the
target records it in the apply's own transaction or commit -- the PostgreSQL
state row, the Iceberg mirror's ``cdc.mirror.last-apply`` property (older
mirrors: the apply snapshot's summary;
:func:`~iceberg_cdc.mirror.targets.read_last_apply`) -- so it outlives
Airflow's database, as the watermark does. The mirror DAG's
last failure is Airflow's to tell (:mod:`iceberg_cdc.airflow.views.app` adds it).

A mirror whose target cannot be read (server down, wrong DSN, the Iceberg
target not installed) carries the error on its own line; it never hides the
table's status or the other mirrors'.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from iceberg_cdc.config import MirrorConfig, TableConfig
from iceberg_cdc.run.freshness import breaches


@dataclass(frozen=True)
class MirrorStatus:
    name: str
    type: str
    table: str
    dag_id: str
    snapshot_id: int | None = None  # the source snapshot the mirror holds
    changelog_snapshot_id: int | None = None  # the changelog snapshot that brought it there
    ordinal: int | None = None
    snapshot_at: datetime | None = None  # when the source made that snapshot
    behind_changelog: int | None = None
    behind_source: int | None = None
    error: str | None = None
    verification: dict[str, Any] | None = None  # the last verification (mirror.verify.record), if any
    oldest_unapplied_snapshot_id: int | None = None  # the oldest source snapshot the mirror does not hold
    oldest_unapplied_at: datetime | None = None
    checked_at: datetime | None = None
    last_apply: Any = None  # mirror.targets.LastApply
    last_apply_error: str | None = None  # why the last apply could not be read (the watermark could)
    freshness_slo: float | None = None  # the table's tables[].freshness_slo, which its mirrors keep too

    @property
    def late(self) -> bool:
        """Behind the source by more than the table's freshness SLO (run/freshness.py's rule)."""
        return breaches(self.lag_seconds, self.freshness_slo)

    @property
    def lag_seconds(self) -> float | None:
        """How long the oldest change the mirror has not applied has been waiting (0: caught up)."""
        if self.behind_source == 0:
            return 0.0
        if self.oldest_unapplied_at is None or self.checked_at is None:
            return None
        return max(0.0, (self.checked_at - self.oldest_unapplied_at).total_seconds())

    @property
    def state(self) -> str:
        if self.error:
            return "error"
        if self.behind_source is None:
            return "unknown"
        if self.behind_source and self.late:
            return "late"
        return "behind" if self.behind_source else "caught-up"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "table": self.table,
            "dag_id": self.dag_id,
            "state": self.state,
            "watermark": None
            if self.ordinal is None
            else {
                "snapshot_id": str(self.snapshot_id),
                "changelog_snapshot_id": None
                if self.changelog_snapshot_id is None
                else str(self.changelog_snapshot_id),
                "ordinal": self.ordinal,
                "snapshot_at": self.snapshot_at.isoformat() if self.snapshot_at else None,
            },
            "lag": {
                "behind_changelog": self.behind_changelog,
                "behind_source": self.behind_source,
                "oldest_unapplied_snapshot_id": None
                if self.oldest_unapplied_snapshot_id is None
                else str(self.oldest_unapplied_snapshot_id),
                "oldest_unapplied_at": self.oldest_unapplied_at.isoformat()
                if self.oldest_unapplied_at
                else None,
                "age_seconds": self.lag_seconds,
            },
            "freshness": {"slo_seconds": self.freshness_slo, "breached": self.late},
            "last_apply": self.last_apply.to_dict() if self.last_apply is not None else None,
            "last_apply_error": self.last_apply_error,
            "error": self.error,
            "verification": None
            if not self.verification
            else {
                k: self.verification.get(k)
                for k in ("status", "verified_at", "at", "drifted_keys", "repaired_keys", "left_keys", "line")
            },
        }


MirrorReader = Callable[[TableConfig, MirrorConfig], Any]  # -> ChangelogMark | None
VerificationReader = Callable[[TableConfig, MirrorConfig], "dict[str, Any] | None"]
ApplyReader = Callable[[TableConfig, MirrorConfig], Any]  # -> mirror.targets.LastApply | None


def oldest_unapplied(source_table: Any, mark: Any, start: str) -> tuple[int, datetime] | None:
    """The oldest source snapshot after the mirror's ``mark`` on the source's current line, and when it was made.

    The sink's own rule for "the next snapshot" (:func:`~iceberg_cdc.source.history.next_snapshot`),
    from the mirror's mark. None: the mirror holds the source's current snapshot.
    """
    from iceberg_cdc.source.history import oldest_pending, table_uuid
    from iceberg_cdc.watermark import Watermark

    watermark = (
        None if mark is None else Watermark(table_uuid(source_table), mark.source_snapshot_id, mark.ordinal)
    )
    return oldest_pending(source_table, watermark, start)  # type: ignore[arg-type]


def mirror_statuses(
    table: TableConfig,
    *,
    reader: MirrorReader,
    changelog_ordinal: int | None,
    source_pending: int | None,
    source_table: Any,
    redact: Callable[[str], str] = str,
    describe: Callable[[BaseException], str] = lambda exc: f"{type(exc).__name__}: {exc}",
    verifications: VerificationReader | None = None,
    applies: ApplyReader | None = None,
    now: datetime | None = None,
) -> list[MirrorStatus]:
    """One :class:`MirrorStatus` per configured mirror of ``table``."""
    out = []
    now = now or datetime.now(UTC)
    for mirror in table.mirrors:
        verification = None
        if verifications is not None:
            try:
                verification = verifications(table, mirror)
            except Exception:  # the view shows the watermark anyway; the next verification rewrites it
                verification = None
        base: dict[str, Any] = {
            "name": mirror.mirror_name,
            "type": mirror.type,
            "table": mirror.table,
            "dag_id": table.mirror_dag_id(mirror),
            "checked_at": now,
            "freshness_slo": table.freshness_slo,
        }
        if applies is not None:
            try:
                base["last_apply"] = applies(table, mirror)
            except Exception as exc:
                base["last_apply_error"] = redact(f"last apply not readable: {describe(exc)}")
        try:
            mark = reader(table, mirror)
        except Exception as exc:
            out.append(
                MirrorStatus(
                    **base,
                    error=redact(f"watermark not readable: {describe(exc)}"),
                    verification=verification,
                )
            )
            continue
        ordinal = mark.ordinal if mark is not None else 0
        behind = None if changelog_ordinal is None else max(0, changelog_ordinal - ordinal)
        if changelog_ordinal is None and mark is None:
            behind = 0
        snapshot_at = None
        oldest = None
        if source_table is not None:
            if mark is not None:
                snapshot = source_table.metadata.snapshot_by_id(mark.source_snapshot_id)
                if snapshot is not None:
                    snapshot_at = datetime.fromtimestamp(snapshot.timestamp_ms / 1000, tz=UTC)
            try:
                oldest = oldest_unapplied(source_table, mark, table.start)
            except Exception:  # a mark off the source's line (a rollback): the lag in snapshots says enough
                oldest = None
        out.append(
            MirrorStatus(
                **base,
                snapshot_id=mark.source_snapshot_id if mark is not None else None,
                changelog_snapshot_id=mark.changelog_snapshot_id if mark is not None else None,
                ordinal=mark.ordinal if mark is not None else None,
                snapshot_at=snapshot_at,
                behind_changelog=behind,
                behind_source=None if behind is None or source_pending is None else behind + source_pending,
                verification=verification,
                oldest_unapplied_snapshot_id=oldest[0] if oldest else None,
                oldest_unapplied_at=oldest[1] if oldest else None,
            )
        )
    return out


def default_reader(config: Any, connections: Any = None) -> MirrorReader:
    """Read each mirror's watermark from its target (the mirror's DSN, or its Airflow connection)."""
    from iceberg_cdc.mirror.targets import read_mirror_mark
    from iceberg_cdc.run.context import Context

    def read(table: TableConfig, mirror: MirrorConfig) -> Any:
        return read_mirror_mark(Context.of(config, table.source, connections), mirror)

    return read


def default_verifications(config: Any, connections: Any = None) -> VerificationReader:
    """Read each mirror's last verification from the shuffle store (:mod:`iceberg_cdc.mirror.verify.record`)."""
    from iceberg_cdc.mirror.verify.record import last_verification
    from iceberg_cdc.run.context import Context

    def read(table: TableConfig, mirror: MirrorConfig) -> dict[str, Any] | None:
        store = Context.of(config, table.source, connections).runtime.store()
        return last_verification(store, table.source, mirror.mirror_name)

    return read


def default_applies(config: Any, connections: Any = None) -> ApplyReader:
    """Read each mirror's last apply from its target (:func:`iceberg_cdc.mirror.targets.read_last_apply`)."""
    from iceberg_cdc.mirror.targets import read_last_apply
    from iceberg_cdc.run.context import Context

    def read(table: TableConfig, mirror: MirrorConfig) -> Any:
        return read_last_apply(Context.of(config, table.source, connections), mirror)

    return read

"""Where each mirror of a table stands: its watermark and its lag, for the CDC view.

A mirror's watermark is a :class:`~iceberg_cdc.mirror.net_changes.ChangelogMark`
that its target stores with its rows (the PostgreSQL state table; the Iceberg
mirror's own metadata). Its lag has two parts:

* **behind the changelog** -- changelog snapshots (ordinals) the changelog has
  and the mirror has not applied yet (its DAG's next run applies them at once);
* **behind the source** -- that plus the source snapshots the changelog itself
  has not processed yet.

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


@dataclass(frozen=True)
class MirrorStatus:
    name: str
    type: str
    table: str
    dag_id: str
    snapshot_id: int | None = None  # the source snapshot the mirror holds
    ordinal: int | None = None
    snapshot_at: datetime | None = None  # when the source made that snapshot
    behind_changelog: int | None = None
    behind_source: int | None = None
    error: str | None = None
    verification: dict[str, Any] | None = None  # the last verification (mirror.verify.record), if any

    @property
    def state(self) -> str:
        if self.error:
            return "error"
        if self.behind_source is None:
            return "unknown"
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
                "ordinal": self.ordinal,
                "snapshot_at": self.snapshot_at.isoformat() if self.snapshot_at else None,
            },
            "lag": {"behind_changelog": self.behind_changelog, "behind_source": self.behind_source},
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
) -> list[MirrorStatus]:
    """One :class:`MirrorStatus` per configured mirror of ``table``."""
    out = []
    for mirror in table.mirrors:
        verification = None
        if verifications is not None:
            try:
                verification = verifications(table, mirror)
            except Exception:  # the view shows the watermark anyway; the next verification rewrites it
                verification = None
        base = {
            "name": mirror.mirror_name,
            "type": mirror.type,
            "table": mirror.table,
            "dag_id": table.mirror_dag_id(mirror),
        }
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
        if mark is not None and source_table is not None:
            snapshot = source_table.metadata.snapshot_by_id(mark.source_snapshot_id)
            if snapshot is not None:
                snapshot_at = datetime.fromtimestamp(snapshot.timestamp_ms / 1000, tz=UTC)
        out.append(
            MirrorStatus(
                **base,
                snapshot_id=mark.source_snapshot_id if mark is not None else None,
                ordinal=mark.ordinal if mark is not None else None,
                snapshot_at=snapshot_at,
                behind_changelog=behind,
                behind_source=None if behind is None or source_pending is None else behind + source_pending,
                verification=verification,
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

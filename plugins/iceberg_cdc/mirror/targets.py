"""Where a mirror's rows go: the PostgreSQL target here, the Iceberg target in :mod:`iceberg_cdc.mirror.iceberg`.

Both targets are part of the package. The Iceberg target's steps are
imported when a mirror of ``type: iceberg`` first needs them (they pull in
pyiceberg's writers and Arrow compute, which DAG parsing never needs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import ModuleType
from typing import Any

from iceberg_cdc.config import MirrorConfig
from iceberg_cdc.mirror.net_changes import ChangelogMark
from iceberg_cdc.mirror.postgres.connection import dsn_for
from iceberg_cdc.mirror.postgres.target import PostgresTarget


def iceberg_steps(mirror: MirrorConfig | None = None) -> ModuleType:
    """The Iceberg target's steps (``plan``, ``commit``, ``cleanup``, ``watermark`` ...): :mod:`iceberg_cdc.mirror.iceberg.steps`."""
    from iceberg_cdc.mirror.iceberg import steps

    return steps


def postgres_target(ctx: Any, mirror: MirrorConfig) -> PostgresTarget:
    """The PostgreSQL target of ``mirror`` (``ctx``: the table's run context)."""
    return PostgresTarget(dsn_for(mirror), mirror.table, changelog=ctx.table.sink, source=ctx.table.source)


def read_mirror_mark(ctx: Any, mirror: MirrorConfig) -> ChangelogMark | None:
    """The mirror's watermark as its target stores it (None: never applied)."""
    if mirror.type == "postgres":
        return postgres_target(ctx, mirror).read_mark()
    return iceberg_steps(mirror).watermark(ctx, mirror)


@dataclass(frozen=True)
class LastApply:
    """What a mirror's last apply did, as its target recorded it with the watermark (outlives Airflow's database).

    ``rows``: PostgreSQL's ``upserted`` and ``deleted`` (the state table);
    Iceberg's ``upserted`` and ``replaced`` (the apply snapshot's summary).
    ``seconds``: PostgreSQL, the apply's transaction up to its mark; Iceberg,
    the sum of ``phases`` (plan, join, commit).
    """

    at: datetime | None
    rows: dict[str, int]
    seconds: float | None
    phases: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat().replace("+00:00", "Z") if self.at else None,
            "rows": dict(self.rows),
            "seconds": self.seconds,
            "phases": dict(self.phases),
        }


def read_last_apply(ctx: Any, mirror: MirrorConfig) -> LastApply | None:
    """The mirror's last apply as its target recorded it (None: never applied, or not recorded)."""
    if mirror.type == "postgres":
        state = postgres_target(ctx, mirror).state()
        if state is None or state.mark is None or state.upserted is None:
            return None
        return LastApply(
            at=state.applied_at,
            rows={"upserted": state.upserted, "deleted": state.deleted or 0},
            seconds=state.seconds,
        )
    found = iceberg_steps(mirror).last_apply(ctx, mirror)
    if not found:
        return None
    phases = {k: float(v) for k, v in found.get("seconds", {}).items()}
    return LastApply(
        at=datetime.fromtimestamp(found["at_ms"] / 1000, tz=UTC) if found.get("at_ms") else None,
        rows={k: int(v) for k, v in found.get("rows", {}).items()},
        seconds=round(sum(phases.values()), 3) if phases else None,
        phases=phases,
    )

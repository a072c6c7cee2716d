"""A mirror's freshness: :mod:`iceberg_cdc.run.freshness`'s measure, from the mark the mirror's target stores.

The table's ``freshness_slo`` holds for each of its mirrors too: a mirror whose
DAG is paused or failing breaks it while the changelog stays fresh.
"""

from __future__ import annotations

from datetime import UTC, datetime

from iceberg_cdc.config import MirrorConfig
from iceberg_cdc.mirror.targets import read_mirror_mark
from iceberg_cdc.run.context import Context
from iceberg_cdc.run.freshness import Freshness, freshness_after
from iceberg_cdc.source.history import table_uuid
from iceberg_cdc.source.tables import load_source_table
from iceberg_cdc.watermark import Watermark


def measure_mirror(ctx: Context, mirror: MirrorConfig, now: datetime | None = None) -> Freshness:
    """One mirror's freshness now (never applied: everything pending)."""
    source = load_source_table(ctx.catalog(), ctx.table)
    mark = read_mirror_mark(ctx, mirror)
    watermark = None if mark is None else Watermark(table_uuid(source), mark.source_snapshot_id, mark.ordinal)
    return freshness_after(ctx, source, watermark, now or datetime.now(UTC), mirror=mirror.mirror_name)


__all__ = ["measure_mirror"]

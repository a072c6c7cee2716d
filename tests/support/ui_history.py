"""The table history the CDC view's tests look at: three snapshots processed, one pending."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from cdc_devtools.cow import cow_merge
from cdc_devtools.inline_pipeline import InlinePipeline
from cdc_devtools.orders import SCHEMA, rows


def processed_history(tmp: Path) -> SimpleNamespace:
    """shop.orders: two appends and a copy-on-write MERGE processed, one more append pending."""
    pipeline = InlinePipeline(tmp)
    source = pipeline.create_source(SCHEMA)
    source.append(rows(range(10)))
    source.append(rows(range(10, 20), region="eu"))
    pipeline.catch_up()
    merge = cow_merge(source, upserts=rows([1, 2], region="eu", status="paid"), delete_keys=[3])
    pipeline.catch_up()
    source.refresh()
    source.append(rows(range(20, 25)))
    source.refresh()
    return SimpleNamespace(
        pipeline=pipeline,
        config=pipeline.config,
        merge=merge,
        pending=source.current_snapshot().snapshot_id,
        ids=[s.snapshot_id for s in source.snapshots()],
        source=source,
    )

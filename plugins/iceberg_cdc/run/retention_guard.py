"""The retention guard, as detect runs it: how long the sink's snapshots are safe, and protect_pending.

Called by detect once it holds the table's lease and knows the watermark:

1. with ``protect_pending``, the table's tags are moved to the snapshots the
   sink needs now (:func:`~iceberg_cdc.source.protection.sync_tags`, one
   source metadata commit when something changed); without it, tags left by an
   earlier configuration are removed;
2. tags of tables that left the config are swept (one listing of the shuffle
   store's ``_protection/`` records per run);
3. the outlook (:mod:`iceberg_cdc.source.retention`): when the first needed
   snapshot may be expired, and a warning below ``tables[].retention_warning``.

A failure to move the tags (no write access to the source, a catalog that
keeps refusing the commit) does not fail the run -- the changes still get
captured -- but it is in the result (``protection.error``) and the run's note.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
from pyiceberg.table import Table

from iceberg_cdc.config import TableConfig
from iceberg_cdc.error_lines import line_of
from iceberg_cdc.run.context import Context
from iceberg_cdc.source import protection
from iceberg_cdc.source.retention import needed_snapshots, outlook
from iceberg_cdc.watermark import Watermark

log = logging.getLogger("iceberg_cdc")


def guard(ctx: Context, source: Table, watermark: Watermark | None, *, catalog: Any) -> dict[str, Any]:
    """Protect (or release), sweep, and report: the ``retention`` part of detect's result."""
    table = ctx.table
    store = ctx.runtime.store()
    needed = needed_snapshots(source, watermark, table.start)
    result: dict[str, Any] = {}
    if table.protect_pending or table.protect_base:
        result["protection"] = sync_protection(ctx, source, watermark, needed)
    elif protection.own_tags(source, table.sink):
        change = protection.release_tags(source, table.sink)
        protection.forget(store, table.source, table.sink)
        log.warning(
            "protect_pending and protect_base are off for %s: removed its %d tag(s) from %s",
            table.sink,
            len(change.removed),
            table.source,
        )
    protected_now = [(t.source, t.sink) for t in ctx.config.tables if t.protect_pending or t.protect_base]
    protection.sweep_unconfigured(store, protected_now, lambda name: _load_or_none(catalog, name))

    now_ms = int(time.time() * 1000)
    prefix = protection.own_tag_prefixes(table.sink) if table.protect_pending or table.protect_base else None
    view = outlook(source.metadata, needed, protection_prefix=prefix)
    result["retention"] = view.to_dict(now_ms)
    warning = view.warning(now_ms, table.retention_warning)
    if "error" in result.get("protection", {}):
        warning = f"protect_pending failed ({result['protection']['error']})" + (
            f"; {warning}" if warning else ""
        )
    if warning:
        result["retention_warning"] = warning
        log.warning("%s: %s", table.source, warning)
    return result


def sync_protection(
    ctx: Context, source: Table, watermark: Watermark | None, needed: Any = None
) -> dict[str, Any]:
    """Move the sink's tags on ``source`` to what it needs now; never raises (the error is in the result).

    Detect calls it at the start of a run, the watermark step after a commit
    (``protect_pending``: the committed snapshot's pending tag goes at once,
    so a caught-up table keeps only its base tag) and the every-minute check
    (:func:`protect`: snapshots committed while no run is active get their tag
    within a minute of being committed, a paused DAG included).
    """
    table = ctx.table
    needed = needed_snapshots(source, watermark, table.start) if needed is None else needed
    try:
        protection.record(ctx.runtime.store(), table.source, table.sink)
        pending, bases = protected_ids(table, source, watermark, needed)
        change = protection.sync_tags(source, table.sink, pending, bases)
    except Exception as exc:  # the capture goes on; the note says protection failed
        line = line_of(exc)
        log.warning("protection: could not move the tags on %s: %s", table.source, line)
        return {"error": line}
    if change.committed:
        log.info(
            "protection: %s tags now %d snapshot(s) for %s (+%d -%d, one metadata commit)",
            table.source,
            change.kept + len(change.added),
            table.sink,
            len(change.added),
            len(change.removed),
        )
    return change.to_dict()


def protect(ctx: Context) -> dict[str, Any]:
    """The every-minute check of a ``protect_pending`` table: tags on what is pending now, whatever runs."""
    from iceberg_cdc.sink.table import read_watermark
    from iceberg_cdc.source.tables import load_source_table

    catalog = ctx.catalog()
    source = load_source_table(catalog, ctx.table)
    sink = catalog.load_table(ctx.table.sink) if catalog.table_exists(ctx.table.sink) else None
    watermark = read_watermark(sink, ctx.table.source) if sink is not None else None
    return sync_protection(ctx, source, watermark)


def protected_ids(
    table: TableConfig, source: Table, watermark: Watermark | None, needed: Any
) -> tuple[list[int], list[int]]:
    """The snapshots the sink's tags hold: (pending tags, base tags).

    ``protect_base``: the watermark's snapshot -- the state the changelog
    describes, where a bridge over a gap starts (``source/history.py``) --
    kept even when it left main's line, and the next pending snapshot (the one
    a run processes now, the watermark's once it commits: the base is never
    unheld between two runs). ``protect_pending``: every pending one (and the
    watermark's, when protect_base is off).
    """
    mark = (
        [watermark.snapshot_id]
        if watermark is not None and source.metadata.snapshot_by_id(watermark.snapshot_id) is not None
        else []
    )
    pending = list(needed.pending) if table.protect_pending else []
    if not table.protect_base:
        return mark + pending, []
    return pending, mark + list(needed.pending[:1])


def _load_or_none(catalog: Any, identifier: str) -> Table | None:
    try:
        return catalog.load_table(identifier)
    except (NoSuchTableError, NoSuchNamespaceError):
        return None

"""The last steps of a run: confirm the watermark, and clean up (the teardown).

Cleanup touches only the run's own namespace (its lease epoch) and its own
staged files, so it is safe even after the run was overtaken; it releases the
lease only if the epoch is still the run's. When the commit's outcome is
unknown (``commit-pending`` left by the commit step), the staged files stay:
a commit that lands late references them, and a later run's sweep deletes
them if none did.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from iceberg_cdc.coordination.commit_in_flight import MarkerState, read_marker
from iceberg_cdc.coordination.commit_in_flight import describe as describe_marker
from iceberg_cdc.errors import CdcError
from iceberg_cdc.run import lease as run_lease
from iceberg_cdc.run.context import Context
from iceberg_cdc.run.retention_guard import sync_protection
from iceberg_cdc.run.shuffle_steps import attempt_paths
from iceberg_cdc.run.state import Detected
from iceberg_cdc.sink.staging import delete_uncommitted_staged
from iceberg_cdc.sink.table import read_watermark
from iceberg_cdc.snapshot_ids import as_text
from iceberg_cdc.source.history import next_snapshot
from iceberg_cdc.source.tables import load_source_table

log = logging.getLogger("iceberg_cdc")


def watermark(ctx: Context, detected: Detected | Mapping[str, Any]) -> dict[str, Any]:
    """Check the sink's watermark reached this snapshot; count what is pending after it, afresh."""
    detected = Detected.of(detected)
    if detected.action == "caught_up":
        return {"snapshot_id": None, "remaining": 0, "next_conf": {}}
    catalog = ctx.catalog()
    sink = catalog.load_table(ctx.table.sink)
    mark = read_watermark(sink, ctx.table.source)
    if not detected.manual and (mark is None or mark.ordinal < detected.ordinal):
        raise CdcError(
            f"the watermark of {ctx.table.source} in {ctx.table.sink} is at "
            f"{mark and mark.snapshot_id}, not at snapshot {detected.snapshot_id} after commit"
        )
    source = load_source_table(catalog, ctx.table)
    if ctx.table.protect_pending:  # the committed snapshot's pending tag goes now, not at the next run
        sync_protection(ctx, source, mark)
    after = next_snapshot(source, mark, ctx.table.start, bridge=ctx.table.on_history_gap == "bridge")
    remaining = 0 if after is None else after.remaining + 1
    log.info(
        "watermark of %s: snapshot %s (ordinal %s); %d more snapshot(s) pending",
        ctx.table.source,
        mark and mark.snapshot_id,
        mark and mark.ordinal,
        remaining,
    )
    # Ids as strings: this result (and the next run's conf) is shown by browsers, which round 19 digits.
    result = {
        "snapshot_id": as_text(mark and mark.snapshot_id),
        "remaining": remaining,
        "next_snapshot_id": as_text(after and after.snapshot_id),
        "next_conf": {},
    }
    if detected.next_in_range is not None:
        # A range reprocess goes on with the next snapshot of the range, up to its last one.
        result["next_conf"] = {
            "snapshot_id": as_text(detected.next_in_range),
            "through_snapshot_id": as_text(detected.through_snapshot_id),
        }
        result["range_left"] = detected.range_left
        log.info(
            "reprocess of %s through snapshot %s: snapshot %s is next",
            ctx.table.source,
            detected.through_snapshot_id,
            detected.next_in_range,
        )
    return result


def cleanup(ctx: Context, detected: Detected | Mapping[str, Any] | None, run_id: str) -> dict[str, Any]:
    """Release the run's lease, then delete its shuffle namespace and its uncommitted staged files.

    The lease goes first: a zombie commit of this run that has not yet put its
    ``commit-pending`` marker then fails its lease check, and one that has is
    seen here, so its staged files stay.
    """
    detected = None if detected is None else Detected.of(detected)
    removed = 0
    kept_staged = False
    epoch = int(detected.epoch) if detected and detected.epoch not in (None, run_lease.NO_EPOCH) else None
    released = False
    if epoch is not None:
        try:
            released = run_lease.give_back(ctx, run_id, epoch)
        except Exception:  # the lease then expires by itself; the deletions below still help
            log.exception("run %r could not release the lease of %s", run_id, ctx.table.source)
    if detected and detected.snapshot_id is not None and epoch is not None:
        paths = attempt_paths(detected)
        store = ctx.runtime.store()
        marker = read_marker(store, paths.commit_pending)
        kept_staged = marker.keeps_files
        if kept_staged:
            log.warning(
                "the sink commit of snapshot %s had an unknown outcome (%s): its staged files are kept "
                "(a late commit references them); a later run's sweep removes them if unused",
                detected.snapshot_id,
                describe_marker(marker),
            )
        else:
            # Staged files first: if cleanup stops half way, the namespace left behind leads
            # the next run's sweep back to them.
            sink = ctx.catalog().load_table(ctx.table.sink)
            delete_uncommitted_staged(
                sink, detected.snapshot_id, properties=ctx.runtime.io_properties, attempt=paths.attempt
            )
        if ctx.config.shuffle.retain_files:
            log.info("retain_files is set: keeping %s", store.describe(paths.prefix))
        elif marker.state is MarkerState.UNREADABLE:
            # Not even known whether the marker exists: the whole namespace leads a later sweep back.
            removed = 0
        elif kept_staged:
            # Keep only the marker: it leads a later sweep to the staged files.
            removed = sum(
                store.delete_prefix(info.key)
                for info in store.list(paths.prefix)
                if info.key != paths.commit_pending
            )
        else:
            removed = store.delete_prefix(paths.prefix)
    log.info("cleanup: %d shuffle objects deleted; lease %s", removed, "released" if released else "not held")
    return {"shuffle_objects_deleted": removed, "lease_released": bool(released), "staged_kept": kept_staged}

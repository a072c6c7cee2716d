"""The leftover sweep detect runs while it holds the table's lease: dead and overtaken runs' objects."""

from __future__ import annotations

import logging

from iceberg_cdc.coordination.commit_in_flight import describe as describe_marker
from iceberg_cdc.coordination.commit_in_flight import may_sweep, read_marker
from iceberg_cdc.pipeline.paths import SnapshotPaths, attempt_of_key, table_prefix
from iceberg_cdc.run import lease as run_lease
from iceberg_cdc.run.context import Context
from iceberg_cdc.sink.staging import delete_uncommitted_staged

log = logging.getLogger("iceberg_cdc")


def sweep_leftovers(ctx: Context, sink, keep_attempt: str) -> dict[str, int]:
    """Delete what earlier runs of this table left behind; only ever called while holding the lease.

    Every shuffle namespace of the table except ``keep_attempt`` (the
    caller's) belongs to a finished, dead or overtaken run, none of which may
    use it any more (an overtaken run fails its next lease check). For each:
    first the staged files of that attempt that no sink commit references
    (committed ones are referenced and kept), then the namespace itself -- in
    that order, so a sweep cut short leaves the namespace that leads the next
    sweep back to the files. The cost follows the leftovers, not the sink's
    history: committed files stay in the staging directory, so listing all of
    it would grow with every commit. ``retain_files`` keeps the namespaces.
    """
    store = ctx.runtime.store()
    table = ctx.table.source
    keys: dict[tuple[int, str], list[str]] = {}
    for info in store.list(table_prefix(table)):
        found = attempt_of_key(table, info.key)
        if found is not None and found[1] != keep_attempt:
            keys.setdefault(found, []).append(info.key)
    attempts = set(keys)
    removed = staged = 0
    for snapshot_id, attempt in sorted(attempts):
        paths = SnapshotPaths(table, snapshot_id, attempt)
        if paths.commit_pending in keys[(snapshot_id, attempt)]:
            marker = read_marker(store, paths.commit_pending)
            if not may_sweep(marker, run_lease.lease_ttl_seconds(ctx.table)):
                log.warning("%s: keeping %s: %s", table, paths.prefix, describe_marker(marker))
                continue
        staged += len(
            delete_uncommitted_staged(
                sink, snapshot_id, properties=ctx.runtime.io_properties, attempt=attempt
            )
        )
        if not ctx.config.shuffle.retain_files:
            removed += store.delete_prefix(paths.prefix)
    if removed or staged:
        log.warning(
            "%s: swept leftovers of earlier runs: %d shuffle objects in %d namespace(s), %d uncommitted "
            "staged file(s)",
            table,
            removed,
            len(attempts),
            staged,
        )
    return {"namespaces": len(attempts), "shuffle_objects": removed, "staged_files": staged}


__all__ = ["sweep_leftovers"]

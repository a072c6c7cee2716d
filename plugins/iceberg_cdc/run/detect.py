"""detect: take the table, find the snapshot to process, sweep leftovers, plan the work.

The first step of every DAG run. It takes the table's lease with a new epoch
(the run's fencing token), so everything it plans lives in the epoch's own
namespace of the shuffle store and the sink's staging directory. Holding the
lease, it also repairs what dead or overtaken runs left behind (:mod:`.sweep`): their shuffle
namespaces and their staged files that no sink commit references.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from iceberg_cdc.coordination.lease import HolderState, LeaseInfo
from iceberg_cdc.errors import SourceHistoryError
from iceberg_cdc.pipeline.groups import record_phase
from iceberg_cdc.pipeline.paths import SnapshotPaths, attempt_name
from iceberg_cdc.pipeline.plan import SnapshotPlan, group_tasks
from iceberg_cdc.run import lease as run_lease
from iceberg_cdc.run.bridge import bridge_plan_changes, bridge_record, refuse_large_bridge
from iceberg_cdc.run.context import Context
from iceberg_cdc.run.retention_guard import guard
from iceberg_cdc.run.state import Detected
from iceberg_cdc.run.sweep import sweep_leftovers
from iceberg_cdc.sink import field_ids
from iceberg_cdc.sink.foreign import foreign_commits_warning
from iceberg_cdc.sink.schema import evolve_sink_schema
from iceberg_cdc.sink.table import ensure_sink_table, loaded_in_full, read_watermark
from iceberg_cdc.source.changes import (
    initial_load_changes,
    require_supported,
    snapshot_changes,
)
from iceberg_cdc.source.history import history_gap, next_snapshot
from iceberg_cdc.source.key_ranges import key_field_id
from iceberg_cdc.source.planning import CancelPlanning, plan_write_tasks
from iceberg_cdc.source.reading import table_name_mapping_json
from iceberg_cdc.source.reprocess import validate_manual_snapshot, validate_reprocess_range
from iceberg_cdc.source.tables import load_source_table, resolve_identifier_columns

log = logging.getLogger("iceberg_cdc")


def detect(
    ctx: Context,
    run_id: str,
    snapshot_id: int | None = None,
    *,
    dag_id: str = "",
    try_number: int | None = None,
    holder_state: Callable[[LeaseInfo], HolderState] | None = None,
    through_snapshot_id: int | None = None,
    expected_snapshot_id: int | None = None,
    live_chain: Callable[[], str | None] | None = None,
) -> Detected:
    """Take the lease, find the snapshot to process, plan it, and say which path the run takes.

    The cleanup teardown releases the lease, but it only runs when detect
    succeeded; so a detect that fails after taking the lease releases it itself.
    ``through_snapshot_id``: this run reprocesses ``snapshot_id``, the first of a
    range that ends there (:func:`~iceberg_cdc.source.history.validate_reprocess_range`);
    detect's result names the next snapshot of the range (``next_in_range``).

    One chain per table (docs/operating.md, "Run ids"): a chained run's id names
    the snapshot it was started for (``expected_snapshot_id``) and it processes
    that one or none; any other run that would take the next pending snapshot
    asks ``live_chain`` (while holding the lease) whether a chained run is
    waiting to process it, and if so leaves it to that run (``caught_up``,
    ``reason`` naming it).
    """
    if through_snapshot_id is not None and snapshot_id is None:
        raise SourceHistoryError(
            f"through_snapshot_id={through_snapshot_id} needs snapshot_id, the first snapshot to "
            f'reprocess: trigger with {{"snapshot_id": <first>, "through_snapshot_id": '
            f"{through_snapshot_id}}}. Nothing was run."
        )
    held = run_lease.take(ctx, run_id, dag_id=dag_id, try_number=try_number, holder_state=holder_state)
    try:
        with run_lease.renewing(ctx, run_id, held.epoch, run_lease.lease_ttl_seconds(ctx.table)):
            return _detect(
                ctx, run_id, snapshot_id, held, through_snapshot_id, expected_snapshot_id, live_chain
            )
    except BaseException:
        try:
            run_lease.give_back(ctx, run_id, held.epoch)
        except Exception:  # the original error matters more; the lease then expires by itself
            log.exception("run %r could not release the lease of %s", run_id, ctx.table.source)
        raise


def left_to_run_ahead(ctx: Context, run_id: str, reason: str) -> Detected:
    """What a run that leaves the table to a run ahead of it returns (:mod:`iceberg_cdc.run.queue`).

    It took no lease (:data:`~iceberg_cdc.run.lease.NO_EPOCH`: cleanup
    releases nothing and deletes nothing) and processes nothing; its note says which run it left
    the table to, not "caught up".
    """
    return Detected(
        action="caught_up",
        source=ctx.table.source,
        sink=ctx.table.sink,
        run_id=run_id,
        epoch=run_lease.NO_EPOCH,
        lease_ttl=run_lease.lease_ttl_seconds(ctx.table),
        reason=reason,
    )


def chain_deferral(
    pending: int, expected_snapshot_id: int | None, live_chain: Callable[[], str | None] | None
) -> str | None:
    """Why this run leaves the pending snapshot ``pending`` alone, or None when it processes it.

    A chained run processes only the snapshot its id names; another run defers
    to a live chained run, which was started (by the lease holder, before it
    gave the lease back) to process exactly this snapshot.
    """
    if expected_snapshot_id is not None:
        if pending == expected_snapshot_id:
            return None
        return (
            f"superseded: this chained run was started for snapshot {expected_snapshot_id}, but the next "
            f"pending snapshot is {pending} (another run processed {expected_snapshot_id}); it processes "
            "nothing, so its id does not name a snapshot it did not process"
        )
    live = live_chain() if live_chain is not None else None
    if live:
        return f"left to the chain: run {live} processes snapshot {pending} and those after it"
    return None


def _detect(
    ctx: Context,
    run_id: str,
    snapshot_id: int | None,
    held: LeaseInfo,
    through_snapshot_id: int | None,
    expected_snapshot_id: int | None = None,
    live_chain: Callable[[], str | None] | None = None,
) -> Detected:
    started = time.perf_counter()
    catalog = ctx.catalog()
    source = load_source_table(catalog, ctx.table)
    sink = ensure_sink_table(catalog, ctx.table.sink, source.schema())
    watermark = read_watermark(sink, ctx.table.source)
    in_range: list[int] = []
    if through_snapshot_id is not None and snapshot_id is not None:
        in_range = validate_reprocess_range(source, snapshot_id, through_snapshot_id, watermark)
    if snapshot_id is not None:
        pending = validate_manual_snapshot(
            source,
            snapshot_id,
            watermark,
            ctx.table.start,
            loaded_in_full=watermark is not None
            and loaded_in_full(sink, ctx.table.source, snapshot_id, start=ctx.table.start),
        )
    else:
        pending = next_snapshot(
            source, watermark, ctx.table.start, bridge=ctx.table.on_history_gap == "bridge"
        )
    attempt = attempt_name(held.epoch)
    swept = sweep_leftovers(ctx, sink, attempt)
    base: dict[str, Any] = {
        "source": ctx.table.source,
        "sink": ctx.table.sink,
        "run_id": run_id,
        "epoch": held.epoch,
        "lease_ttl": run_lease.lease_ttl_seconds(ctx.table),
        "manual": snapshot_id is not None,
        "swept": swept,
        # Where the tables live: their names in lineage events (iceberg_cdc/lineage.py).
        "source_location": source.location(),
        "sink_location": sink.location(),
        **guard(ctx, source, watermark, catalog=catalog),
    }
    if in_range:
        base.update(
            through_snapshot_id=through_snapshot_id,
            next_in_range=in_range[1] if in_range[1:] else None,
            range_left=len(in_range) - 1,  # snapshots of the range after this one
        )
    warning = foreign_commits_warning(sink, ctx.table.source)
    if warning:
        log.warning("%s", warning)
        base["warnings"] = (warning,)
    if (
        pending is None
        and watermark is not None
        and ctx.table.on_history_gap == "bridge"
        and snapshot_id is None
    ):
        waiting = history_gap(source, watermark)
        if waiting is not None:  # rolled back to an ancestor of the watermark, nothing after it yet
            base["warnings"] = (*base.get("warnings", ()), waiting.describe())
            log.warning("%s: %s", ctx.table.source, waiting.describe())
    if pending is None:
        log.info(
            "%s is caught up: nothing after snapshot %s",
            ctx.table.source,
            watermark and watermark.snapshot_id,
        )
        return Detected(action="caught_up", **base)
    if snapshot_id is None:
        deferred = chain_deferral(pending.snapshot_id, expected_snapshot_id, live_chain)
        if deferred:
            log.warning("%s: %s", ctx.table.source, deferred)
            return Detected(action="caught_up", reason=deferred, remaining=pending.remaining, **base)

    gap = pending.bridge
    key_id = key_field_id(ctx.table, source.schema())
    if pending.is_initial_load:
        changes = initial_load_changes(source, pending.snapshot_id)
    elif gap is not None:
        changes = bridge_plan_changes(ctx, source, sink, gap, attempt, key_id)
        base["bridge"] = bridge_record(gap)
        log.warning(
            "%s: %s; bridging: one commit of the net change from snapshot %s to %s, then per-snapshot "
            "commits resume",
            ctx.table.source,
            gap.describe(),
            gap.base,
            gap.target,
        )
    else:
        changes = snapshot_changes(source, pending.snapshot_id, key_id)
    require_supported(changes)
    paths = SnapshotPaths(ctx.table.source, pending.snapshot_id, attempt)
    base.update(
        snapshot_id=pending.snapshot_id,
        base_snapshot_id=None if pending.is_initial_load else changes.parent_id,
        ordinal=pending.ordinal,
        operation=changes.operation,
        remaining=pending.remaining,
        source_uuid=str(source.metadata.table_uuid),
        plan=paths.plan,
        initial_load=pending.is_initial_load,
    )
    if changes.kind in ("replace", "empty"):
        log.info(
            "snapshot %s of %s is a %s snapshot (%s): no logical change, skipped",
            pending.snapshot_id,
            ctx.table.source,
            changes.operation,
            changes.kind,
        )
        return Detected(action="skip", reason=changes.kind, **base)

    schema = source.schemas()[changes.schema_id] if changes.schema_id in source.schemas() else source.schema()
    if schema.schema_id != source.schema().schema_id:
        # The rows are written in the snapshot's schema: the sink must also hold its columns that
        # were dropped since (a sink created from the current schema lacks them). Fields are matched
        # by id and the current schema's names and types win, so this never renames back or narrows.
        evolve_sink_schema(sink, source.schema(), history=schema)
    identifiers = resolve_identifier_columns(ctx.table, schema)
    store = ctx.runtime.store()
    kind = "with_deletes" if changes.kind == "with_deletes" else "insert_only"
    shuffle = ctx.config.shuffle
    cancel = kind == "with_deletes" and shuffle.cancel_before_shuffle
    tasks = plan_write_tasks(
        changes, shuffle.write_task_size, cancel=CancelPlanning(shuffle.cancel_max_bytes) if cancel else None
    )
    groups = group_tasks(tasks, ctx.config.spark.parallel_jobs)
    plan = SnapshotPlan(
        source=ctx.table.source,
        sink=ctx.table.sink,
        source_uuid=base["source_uuid"],
        snapshot_id=pending.snapshot_id,
        parent_id=changes.parent_id,
        ordinal=pending.ordinal,
        operation=changes.operation,
        kind=kind,
        schema_json=schema.model_dump_json(),
        sink_schema_json=sink.schema().model_dump_json(),
        identifier_columns=identifiers,
        partitions=ctx.config.shuffle.partitions,
        duplicate_keys=ctx.table.duplicate_keys,
        sink_location=sink.location(),
        write_tasks=tasks,
        groups=groups,
        initial_load=pending.is_initial_load,
        replace_existing=snapshot_id is not None,
        run_id=run_id,
        epoch=held.epoch,
        lease_ttl_seconds=base["lease_ttl"],
        name_mapping_json=table_name_mapping_json(source),
        delete_files={path: ref.to_dict() for path, ref in sorted(changes.delete_refs.items())},
        cancel_before_shuffle=cancel,
        cancel_memory=shuffle.cancel_memory,
        row_lineage=cancel and shuffle.row_lineage and source.metadata.format_version >= 3,
        snapshot_timestamp_ms=source.metadata.snapshot_by_id(pending.snapshot_id).timestamp_ms,
        sink_field_ids=sink.properties.get(field_ids.PROPERTY),
        bridge=base.get("bridge"),
    )
    if gap is not None:
        refuse_large_bridge(ctx, gap, plan.input_records)
    plan.save(store, paths.plan)
    phase = plan.phase
    args = [
        ["--phase", phase, "--plan", paths.plan, "--group", str(g.index), "--label", label]
        for g, label in zip(groups, plan.group_labels(), strict=True)
    ]
    record_phase(
        store, paths, "detect", started, files_deleted=len(changes.deleted), files_added=len(changes.added)
    )
    log.info(
        "snapshot %s of %s (%s, ordinal %s%s): %d deleted + %d added data files%s (%d rows) -> %d %s tasks in "
        "%d Spark job(s); %d more pending; lease epoch %d",
        pending.snapshot_id,
        ctx.table.source,
        changes.operation,
        pending.ordinal,
        ", initial load" if pending.is_initial_load else "",
        len(changes.deleted),
        len(changes.added),
        f", {len(changes.delete_refs)} delete files applied" if changes.delete_refs else "",
        plan.input_records,
        len(tasks),
        phase,
        len(groups),
        pending.remaining,
        held.epoch,
    )
    shuffled = kind == "with_deletes"
    jobs = tuple(tuple(job) for job in args)
    return Detected(
        action="shuffle" if shuffled else "insert",
        identifier_columns=tuple(identifiers or ()),
        write_args=jobs if shuffled else (),
        insert_args=() if shuffled else jobs,
        write_task_ids=tuple(t.task_id for t in tasks) if shuffled else (),
        **base,
    )

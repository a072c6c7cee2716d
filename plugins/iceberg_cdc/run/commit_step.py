"""commit: check the run still owns its table and every row is accounted for, then commit once.

In order:

1. the lease, renewed with the run's epoch: an overtaken run stops here
   (:class:`~iceberg_cdc.errors.LeaseLostError`) and commits nothing;
2. the plan in the run's namespace must be the run's own (epoch and run id);
3. row conservation over the plan, the map outputs' row records, the read
   ranges, the staged records and the staged files' footers
   (:mod:`iceberg_cdc.pipeline.conservation`) -- nothing is committed unless
   every row adds up;
4. the lease once more, then the one atomic sink commit, exactly once by its
   marker (:func:`~iceberg_cdc.sink.commit.commit_changes`).

Around the catalog call a ``commit-pending`` marker sits in the run's
namespace, by the one protocol of :mod:`iceberg_cdc.coordination.commit_in_flight`:
while a commit's outcome is unknown, no cleanup or sweep deletes its staged files.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from iceberg_cdc.coordination.commit_in_flight import commit_in_flight
from iceberg_cdc.errors import ConservationError, LeaseLostError
from iceberg_cdc.pipeline.conservation import check_snapshot
from iceberg_cdc.pipeline.groups import phase_records, phase_seconds, skew_summary
from iceberg_cdc.pipeline.in_process import in_process_phases
from iceberg_cdc.pipeline.paths import SnapshotPaths
from iceberg_cdc.pipeline.plan import SnapshotPlan
from iceberg_cdc.run import lease as run_lease
from iceberg_cdc.run.context import Context
from iceberg_cdc.run.shuffle_steps import written_records
from iceberg_cdc.run.state import Detected
from iceberg_cdc.sink.commit import NOT_COMMITTED, advance_watermark, commit_changes
from iceberg_cdc.sink.datafiles import data_files_from_parquet
from iceberg_cdc.sink.summary import Bridge, CommitSummary, Skew
from iceberg_cdc.storage import ObjectStore, get_json_many

log = logging.getLogger("iceberg_cdc")


def _staged_records(store: ObjectStore, paths: SnapshotPaths) -> list[dict[str, Any]]:
    keys = sorted(info.key for info in store.list(paths.staged_prefix) if info.key.endswith(".json"))
    return get_json_many(store, keys)


def _own_plan(store: ObjectStore, detected: Detected | Mapping[str, Any]) -> SnapshotPlan:
    detected = Detected.of(detected)
    plan = SnapshotPlan.load(store, detected.plan)
    if plan.epoch != int(detected.epoch) or plan.run_id != detected.run_id:
        raise LeaseLostError(
            f"the plan {detected.plan} belongs to run {plan.run_id!r} (epoch {plan.epoch}), not to this "
            f"run {detected.run_id!r} (epoch {detected.epoch}); nothing was committed"
        )
    return plan


def _footers(sink, staged_paths: list[str], plan: SnapshotPlan) -> list:
    """The staged files' metadata from their footers; a missing or unreadable file is a ConservationError."""
    if not staged_paths:
        return []
    try:
        return data_files_from_parquet(sink.io, sink.metadata, staged_paths)
    except (OSError, ValueError) as exc:
        missing = [p for p in staged_paths if not sink.io.new_input(p).exists()]
        raise ConservationError(
            f"snapshot {plan.snapshot_id} of {plan.source}: staged file(s) {missing[:3] or staged_paths[:3]} "
            f"cannot be read ({type(exc).__name__}: {exc}); they were deleted or damaged after their task "
            "wrote them. Nothing was committed; the next run processes the snapshot again."
        ) from exc


def _sum_figures(records: list[dict[str, Any]]) -> dict[str, int]:
    figures: dict[str, int] = {}
    for record in records:
        for key, value in record["stats"].items():
            if isinstance(value, int):
                figures[key] = figures.get(key, 0) + value
    return figures


def commit(ctx: Context, detected: Detected | Mapping[str, Any]) -> dict[str, Any]:
    """One atomic sink commit of everything staged for the snapshot (or a watermark-only advance)."""
    detected = Detected.of(detected)
    action = detected.action
    if action == "caught_up":
        return {"committed": False, "reason": "caught up"}
    run_lease.confirm(ctx, detected)
    catalog = ctx.catalog()
    sink = catalog.load_table(ctx.table.sink)
    if action == "skip":
        advance_watermark(
            sink, ctx.table.source, detected.source_uuid, detected.snapshot_id, detected.ordinal
        )
        return {
            "committed": False,
            "snapshot_id": detected.snapshot_id,
            "reason": f"skipped {detected.reason} snapshot",
        }
    store = ctx.runtime.store()
    plan = _own_plan(store, detected)
    paths = plan.paths
    records = _staged_records(store, paths)
    ranges = json.loads(store.get(paths.ranges))["ranges"] if plan.kind == "with_deletes" else None
    written = written_records(store, plan) if plan.kind == "with_deletes" else {}
    staged_paths = [f["path"] for record in records for f in record["files"]]
    data_files = _footers(sink, staged_paths, plan)
    conservation = check_snapshot(
        plan,
        written=written,
        ranges=ranges,
        staged=records,
        footer_rows={f.file_path: f.record_count for f in data_files},
    )
    figures = _sum_figures(records)
    phases = phase_records(store, paths)
    seconds = phase_seconds(store, paths, phases)
    skew = skew_summary(phases)
    summary = CommitSummary(
        operation=plan.operation,
        initial_load=plan.initial_load,
        # cdc.carryover-rows is all carryover: cancelled before the shuffle and removed after it.
        figures={**figures, "carryover_rows": conservation.all_carryover_rows},
        seconds=seconds,
        rows=conservation.rows(),
        skew=skew,
        bridge=_bridge(plan),
    )
    result = commit_in_flight(
        store,
        paths.commit_pending,
        run_id=plan.run_id,
        epoch=plan.epoch,
        confirm_lease=lambda: run_lease.confirm(ctx, detected),
        commit=lambda: commit_changes(
            sink,
            staged_paths=staged_paths,
            data_files=data_files,
            source_identifier=plan.source,
            source_uuid=plan.source_uuid,
            snapshot_id=plan.snapshot_id,
            ordinal=plan.ordinal,
            replace_existing=plan.replace_existing,
            summary=summary,
        ),
        certainly_not_committed=NOT_COMMITTED,
    )
    log.info(
        "commit of snapshot %s to %s: %s; rows: %d input, %d cancelled before the shuffle, %d shuffled, "
        "%d read, %d carryover, %d changes; %s",
        plan.snapshot_id,
        ctx.table.sink,
        "committed" if result.committed else f"not committed ({result.reason})",
        conservation.input_rows,
        conservation.cancelled_rows,
        conservation.shuffled_rows,
        conservation.read_rows,
        conservation.carryover_rows,
        conservation.change_rows,
        ", ".join(f"{k}={v}" for k, v in sorted(figures.items())),
    )
    return {
        "committed": result.committed,
        "snapshot_id": plan.snapshot_id,
        "sink_snapshot_id": None if result.sink_snapshot_id is None else str(result.sink_snapshot_id),
        "reason": result.reason,
        "files": len(staged_paths),
        **figures,
        # Carryover in all, and the part of it the write tasks cancelled before the shuffle.
        "carryover_rows": conservation.all_carryover_rows,
        "cancelled_rows": conservation.cancelled_rows,
        "conservation": vars(conservation),
        "seconds": seconds,
        # Phases whose groups all ran in the Airflow task's process (no Spark job): the story says so.
        "in_process": list(in_process_phases(phases)),
        # A bridge over a gap in the source's history: reason, from, to (the story, the metric).
        "bridge": dict(plan.bridge or {}),
        **_skew_figures(skew),
    }


def _bridge(plan: SnapshotPlan) -> Bridge | None:
    """The plan's bridge over a gap in the source's history, as the sink summary records it."""
    if not plan.bridge:
        return None
    ancestor = plan.bridge.get("common_ancestor")
    return Bridge(
        reason=str(plan.bridge["reason"]),
        from_snapshot_id=int(plan.bridge["from"]),
        common_ancestor=None if ancestor is None else int(ancestor),
        base=str(plan.bridge.get("base") or "snapshot"),
    )


def _skew_figures(skew: Skew | None) -> dict[str, Any]:
    """Skew for commit's XCom (the run's story, metrics): how many partitions, the largest one's ratio."""
    if skew is None:
        return {}
    figures: dict[str, Any] = {"skewed_partitions": skew.count}
    if skew.max_ratio is not None:
        figures["skew_max_ratio"] = skew.max_ratio
    return figures

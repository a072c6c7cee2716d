"""What each non-Spark task of a DAG run does, as plain functions.

The DAG factory wraps these in Airflow tasks; tests call them directly. Each
returns a small JSON-able dict (it becomes the task's XCom and its figures in
the UI) and logs one readable line per decision.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from iceberg_cdc.config import CdcConfig, TableConfig
from iceberg_cdc.coordination.lease import TableLease
from iceberg_cdc.errors import CdcError, ConfigError
from iceberg_cdc.pipeline.paths import SnapshotPaths
from iceberg_cdc.pipeline.plan import SnapshotPlan, group_tasks
from iceberg_cdc.pipeline.runtime import Runtime, load_catalog_from_config, runtime_from_config
from iceberg_cdc.shuffle.coalesce import coalesce as plan_ranges
from iceberg_cdc.shuffle.fetch import MapOutputSpan
from iceberg_cdc.shuffle.layout import data_key
from iceberg_cdc.shuffle.reader import read_index
from iceberg_cdc.sink.commit import advance_watermark, commit_changes
from iceberg_cdc.sink.schema import evolve_sink_schema
from iceberg_cdc.sink.staging import delete_uncommitted_staged
from iceberg_cdc.sink.table import ensure_sink_table, read_watermark
from iceberg_cdc.source.changes import initial_load_changes, require_supported, snapshot_changes
from iceberg_cdc.source.history import next_snapshot, validate_manual_snapshot
from iceberg_cdc.source.planning import plan_write_tasks

log = logging.getLogger("iceberg_cdc")

LEASE_TTL_SECONDS = 6 * 3600
INDEX_READ_THREADS = 16


@dataclass(frozen=True)
class Context:
    """One table of the config, with storage and catalog access."""

    config: CdcConfig
    table: TableConfig
    runtime: Runtime

    @classmethod
    def of(cls, config: CdcConfig, source: str) -> Context:
        return cls(config, config.table(source), runtime_from_config(config))

    def catalog(self):
        return load_catalog_from_config(self.config)

    def lease(self) -> TableLease:
        return TableLease(self.runtime.store(), self.table.source)


def _identifier_columns(ctx: Context, schema) -> list[str] | None:
    """The configured identifier columns, else the table's identifier fields; checked to exist."""
    names = ctx.table.identifier_columns or sorted(schema.identifier_field_names()) or None
    if names:
        present = {field.name for field in schema.fields}
        missing = [name for name in names if name not in present]
        if missing:
            raise ConfigError(
                f"table {ctx.table.source}: identifier column(s) {missing} do not exist in the source "
                f"schema (columns: {sorted(present)}). Fix tables[].identifier_columns in the config, "
                "or leave it out to use the table's identifier fields."
            )
    return names


def detect(ctx: Context, run_id: str, snapshot_id: int | None = None) -> dict[str, Any]:
    """Take the lease, find the snapshot to process, plan it, and say which path the run takes.

    The cleanup teardown releases the lease, but it only runs when detect
    succeeded; so a detect that fails after taking the lease releases it itself.
    """
    lease = ctx.lease()
    lease.acquire(run_id, LEASE_TTL_SECONDS)
    try:
        return _detect(ctx, run_id, snapshot_id)
    except BaseException:
        lease.release(run_id)
        raise


def _detect(ctx: Context, run_id: str, snapshot_id: int | None) -> dict[str, Any]:
    started = time.perf_counter()
    catalog = ctx.catalog()
    source = catalog.load_table(ctx.table.source)
    sink = ensure_sink_table(catalog, ctx.table.sink, source.schema())
    watermark = read_watermark(sink, ctx.table.source)
    if snapshot_id is not None:
        pending = validate_manual_snapshot(source, snapshot_id, watermark)
    else:
        pending = next_snapshot(source, watermark, ctx.table.start)
    base = {
        "source": ctx.table.source,
        "sink": ctx.table.sink,
        "run_id": run_id,
        "manual": snapshot_id is not None,
    }
    if pending is None:
        log.info(
            "%s is caught up: nothing after snapshot %s",
            ctx.table.source,
            watermark and watermark.snapshot_id,
        )
        return {**base, "action": "caught_up", "remaining": 0, "write_args": [], "insert_args": []}

    changes = (
        initial_load_changes(source, pending.snapshot_id)
        if pending.is_initial_load
        else snapshot_changes(source, pending.snapshot_id)
    )
    require_supported(changes)
    paths = SnapshotPaths(ctx.table.source, pending.snapshot_id)
    base.update(
        snapshot_id=pending.snapshot_id,
        ordinal=pending.ordinal,
        operation=changes.operation,
        remaining=pending.remaining,
        source_uuid=str(source.metadata.table_uuid),
        plan=paths.plan,
    )
    if changes.kind in ("replace", "empty"):
        log.info(
            "snapshot %s of %s is a %s snapshot (%s): no logical change, skipped",
            pending.snapshot_id,
            ctx.table.source,
            changes.operation,
            changes.kind,
        )
        return {**base, "action": "skip", "reason": changes.kind, "write_args": [], "insert_args": []}

    schema = source.schemas()[changes.schema_id] if changes.schema_id in source.schemas() else source.schema()
    if schema.schema_id != source.schema().schema_id:
        # The rows are written in the snapshot's schema: the sink must also hold its columns that
        # were renamed or dropped since (a sink created from the current schema lacks them).
        evolve_sink_schema(sink, schema)
    identifiers = _identifier_columns(ctx, schema)
    # Leftovers of an earlier failed attempt must not mix with this one.
    store = ctx.runtime.store()
    store.delete_prefix(paths.prefix)
    delete_uncommitted_staged(sink, pending.snapshot_id, properties=ctx.runtime.io_properties)

    kind = "with_deletes" if changes.kind == "with_deletes" else "insert_only"
    tasks = plan_write_tasks(changes, ctx.config.shuffle.write_task_size)
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
    )
    plan.save(store, paths.plan)
    phase = plan.phase
    args = [
        ["--phase", phase, "--plan", paths.plan, "--group", str(g.index), "--label", label]
        for g, label in zip(groups, plan.group_labels(), strict=True)
    ]
    _record(
        store, paths, "detect", started, files_deleted=len(changes.deleted), files_added=len(changes.added)
    )
    log.info(
        "snapshot %s of %s (%s, ordinal %s): %d deleted + %d added data files -> %d %s tasks in %d Spark "
        "job(s); %d more pending",
        pending.snapshot_id,
        ctx.table.source,
        changes.operation,
        pending.ordinal,
        len(changes.deleted),
        len(changes.added),
        len(tasks),
        phase,
        len(groups),
        pending.remaining,
    )
    return {
        **base,
        "action": "shuffle" if kind == "with_deletes" else "insert",
        "identifier_columns": identifiers,
        "write_args": args if kind == "with_deletes" else [],
        "insert_args": args if kind == "insert_only" else [],
        "write_task_ids": [t.task_id for t in tasks] if kind == "with_deletes" else [],
    }


def _record(store, paths: SnapshotPaths, phase: str, started: float, **figures: Any) -> None:
    document = {"phase": phase, "seconds": round(time.perf_counter() - started, 3), **figures}
    store.put(paths.stats(phase), json.dumps(document).encode())


def missing_map_outputs(ctx: Context, detected: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """(write tasks whose index is missing, failed task -> error) from ONE listing of the snapshot."""
    paths = SnapshotPaths(ctx.table.source, detected["snapshot_id"])
    store = ctx.runtime.store()
    done: set[str] = set()
    failed: dict[str, str] = {}
    for info in store.list(paths.prefix):
        task = paths.task_of_index_key(info.key)
        if task is not None:
            done.add(task)
        elif info.key.startswith(paths.failed_prefix):
            failed[info.key[len(paths.failed_prefix) : -len(".json")]] = ""
    for task_id in failed:
        with contextlib.suppress(CdcError):  # a marker deleted meanwhile: keep the bare task id
            failed[task_id] = json.loads(store.get(paths.failed(task_id))).get("error", "")
    return [t for t in detected["write_task_ids"] if t not in done], failed


def coalesce(ctx: Context, detected: dict[str, Any]) -> list[list[str]]:
    """Read every index, plan read ranges, store them, and return one arg list per read job."""
    started = time.perf_counter()
    plan_key = detected["plan"]
    store = ctx.runtime.store()
    plan = SnapshotPlan.load(store, plan_key)
    paths = SnapshotPaths(plan.source, plan.snapshot_id)
    sizes = {info.key: info.size for info in store.list(paths.map_prefix)}
    names = [paths.map_output(t.task_id) for t in plan.write_tasks]

    def index_of(name: str):
        return read_index(store, name, plan.partitions, sizes.get(data_key(name)))

    with ThreadPoolExecutor(max_workers=INDEX_READ_THREADS) as pool:
        indexes = list(pool.map(index_of, names))
    totals = (
        np.sum([ix.partition_sizes() for ix in indexes], axis=0) if indexes else np.zeros(plan.partitions)
    )
    result = plan_ranges(
        totals, ctx.config.shuffle.target_partition_size, ctx.config.shuffle.min_partition_size
    )
    ranges = [
        {
            "index": i,
            "start": r.start,
            "end": r.end,
            "size": r.size,
            "spans": [MapOutputSpan.of(ix, r.start, r.end).to_dict() for ix in indexes],
        }
        for i, r in enumerate(result.ranges)
    ]
    jobs = max(1, min(ctx.config.spark.parallel_jobs, len(ranges)))
    groups = [[r["index"] for r in ranges[j::jobs]] for j in range(jobs)] if ranges else []
    store.put(paths.ranges, json.dumps({"ranges": ranges, "groups": groups}).encode())
    for skew in result.skewed:
        log.warning(
            "partition %d holds %d bytes, %.0fx the median (%d): skewed keys; a read task takes it alone",
            skew.partition,
            skew.size,
            skew.size / max(skew.median, 1),
            skew.median,
        )
    _record(
        store,
        paths,
        "coalesce",
        started,
        shuffle_bytes=int(result.total_size),
        ranges=[r["size"] for r in ranges],
        skewed=[s.partition for s in result.skewed],
    )
    log.info(
        "coalesce: %d map outputs, %d bytes in %d partitions -> %d read ranges in %d job(s)",
        len(indexes),
        result.total_size,
        plan.partitions,
        len(ranges),
        len(groups),
    )
    args = []
    for j, members in enumerate(groups):
        size = sum(ranges[i]["size"] for i in members)
        label = f"read {j + 1}/{len(groups)}: {len(members)} ranges, {size / 2**20:.1f} MB"
        args.append(["--phase", "read", "--plan", plan_key, "--group", str(j), "--label", label])
    return args


def _staged_records(store, paths: SnapshotPaths) -> list[dict[str, Any]]:
    keys = [info.key for info in store.list(paths.staged_prefix) if info.key.endswith(".json")]
    return [json.loads(store.get(key)) for key in sorted(keys)]


def _phase_seconds(store, paths: SnapshotPaths) -> dict[str, float]:
    seconds: dict[str, float] = {}
    for info in store.list(paths.prefix + "stats/"):
        document = json.loads(store.get(info.key))
        seconds[document["phase"]] = seconds.get(document["phase"], 0.0) + float(document.get("seconds", 0))
    return {k: round(v, 2) for k, v in seconds.items()}


def commit(ctx: Context, detected: dict[str, Any]) -> dict[str, Any]:
    """One atomic sink commit of everything staged for the snapshot (or a watermark-only advance)."""
    action = detected["action"]
    if action == "caught_up":
        return {"committed": False, "reason": "caught up"}
    catalog = ctx.catalog()
    sink = catalog.load_table(ctx.table.sink)
    if action == "skip":
        advance_watermark(
            sink, ctx.table.source, detected["source_uuid"], detected["snapshot_id"], detected["ordinal"]
        )
        return {"committed": False, "reason": f"skipped {detected['reason']} snapshot"}
    store = ctx.runtime.store()
    plan = SnapshotPlan.load(store, detected["plan"])
    paths = SnapshotPaths(plan.source, plan.snapshot_id)
    records = _staged_records(store, paths)
    files = [f["path"] for record in records for f in record["files"]]
    figures: dict[str, int] = {}
    for record in records:
        for key, value in record["stats"].items():
            if isinstance(value, int):
                figures[key] = figures.get(key, 0) + value
    seconds = _phase_seconds(store, paths)
    summary = {f"cdc.{k.replace('_', '-')}": str(v) for k, v in figures.items()}
    summary.update({f"cdc.seconds.{k}": str(v) for k, v in seconds.items()})
    summary["cdc.operation"] = plan.operation
    result = commit_changes(
        sink,
        staged_paths=files,
        source_identifier=plan.source,
        source_uuid=plan.source_uuid,
        snapshot_id=plan.snapshot_id,
        ordinal=plan.ordinal,
        replace_existing=plan.replace_existing,
        summary=summary,
    )
    log.info(
        "commit of snapshot %s to %s: %s; %s",
        plan.snapshot_id,
        ctx.table.sink,
        "committed" if result.committed else f"not committed ({result.reason})",
        ", ".join(f"{k}={v}" for k, v in sorted(figures.items())),
    )
    return {"committed": result.committed, "files": len(files), **figures, "seconds": seconds}


def watermark(ctx: Context, detected: dict[str, Any]) -> dict[str, Any]:
    """Check the sink's watermark reached this snapshot; report what is still pending."""
    if detected["action"] == "caught_up":
        return {"snapshot_id": None, "remaining": 0}
    sink = ctx.catalog().load_table(ctx.table.sink)
    mark = read_watermark(sink, ctx.table.source)
    if not detected.get("manual") and (mark is None or mark.ordinal < detected["ordinal"]):
        raise CdcError(
            f"the watermark of {ctx.table.source} in {ctx.table.sink} is at "
            f"{mark and mark.snapshot_id}, not at snapshot {detected['snapshot_id']} after commit"
        )
    log.info(
        "watermark of %s: snapshot %s (ordinal %s); %d more snapshot(s) pending",
        ctx.table.source,
        mark and mark.snapshot_id,
        mark and mark.ordinal,
        detected["remaining"],
    )
    return {"snapshot_id": mark and mark.snapshot_id, "remaining": detected["remaining"]}


def cleanup(ctx: Context, detected: dict[str, Any] | None, run_id: str) -> dict[str, Any]:
    """Delete the snapshot's shuffle objects and uncommitted staged files; release the lease."""
    removed = 0
    try:
        if detected and detected.get("snapshot_id") is not None:
            paths = SnapshotPaths(ctx.table.source, detected["snapshot_id"])
            store = ctx.runtime.store()
            if ctx.config.shuffle.retain_files:
                log.info("retain_files is set: keeping %s", store.describe(paths.prefix))
            else:
                removed = store.delete_prefix(paths.prefix)
            sink = ctx.catalog().load_table(ctx.table.sink)
            delete_uncommitted_staged(sink, detected["snapshot_id"], properties=ctx.runtime.io_properties)
    finally:
        released = ctx.lease().release(run_id)
    log.info("cleanup: %d shuffle objects deleted; lease %s", removed, "released" if released else "not held")
    return {"shuffle_objects_deleted": removed, "lease_released": bool(released)}

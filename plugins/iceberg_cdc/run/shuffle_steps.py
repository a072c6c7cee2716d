"""The steps between the two Spark phases: the barrier's check and coalesce.

A map output counts as committed when its write task has recorded its rows
(``written/<task>.json``, put after ``NAME.index``): the barrier waits for
those records, and coalesce turns them into each read range's expected rows,
which read tasks check against what they fetch.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from iceberg_cdc.errors import CdcError, CorruptShuffleError
from iceberg_cdc.pipeline.groups import record_phase
from iceberg_cdc.pipeline.paths import SnapshotPaths, attempt_name
from iceberg_cdc.pipeline.plan import SnapshotPlan
from iceberg_cdc.run import lease as run_lease
from iceberg_cdc.run.context import Context
from iceberg_cdc.run.state import Detected
from iceberg_cdc.shuffle.coalesce import coalesce as plan_ranges
from iceberg_cdc.shuffle.coalesce import total_partition_sizes
from iceberg_cdc.shuffle.fetch import MapOutputSpan
from iceberg_cdc.shuffle.layout import data_key
from iceberg_cdc.shuffle.reader import read_index
from iceberg_cdc.storage import ObjectStore, get_json_many
from iceberg_cdc.units import format_bytes

log = logging.getLogger("iceberg_cdc")

INDEX_READ_THREADS = 16


def attempt_paths(detected: Detected | Mapping[str, Any]) -> SnapshotPaths:
    """Where this run's objects of its snapshot live."""
    detected = Detected.of(detected)
    return SnapshotPaths(detected.source, detected.snapshot_id, attempt_name(int(detected.epoch)))


def missing_map_outputs(
    ctx: Context, detected: Detected | Mapping[str, Any]
) -> tuple[list[str], dict[str, str]]:
    """(write tasks not committed yet, failed task -> error) from ONE listing of the run's namespace."""
    detected = Detected.of(detected)
    paths = attempt_paths(detected)
    store = ctx.runtime.store()
    done: set[str] = set()
    failed: dict[str, str] = {}
    for info in store.list(paths.prefix):
        task = paths.task_of_written_key(info.key)
        if task is not None:
            done.add(task)
        elif info.key.startswith(paths.failed_prefix):
            failed[info.key[len(paths.failed_prefix) : -len(".json")]] = ""
    for task_id in failed:
        with contextlib.suppress(CdcError):  # a marker deleted meanwhile: keep the bare task id
            failed[task_id] = json.loads(store.get(paths.failed(task_id))).get("error", "")
    return [t for t in detected.write_task_ids if t not in done], failed


def written_records(store: ObjectStore, plan: SnapshotPlan) -> dict[str, dict[str, Any]]:
    """Task id -> the row record its write task left, for every record of this attempt."""
    paths = plan.paths
    tasks = {
        key: task
        for key in (info.key for info in store.list(paths.written_prefix))
        if (task := paths.task_of_written_key(key)) is not None
    }
    return dict(zip(tasks.values(), get_json_many(store, list(tasks)), strict=True))


def _span_rows(record: dict[str, Any], start: int, end: int, name: str, partitions: int) -> int:
    rows = record.get("partition_rows") or []
    if len(rows) != partitions:
        raise CorruptShuffleError(
            f"the row record of map output {name!r} has {len(rows)} partitions, the plan {partitions}"
        )
    return int(sum(rows[start:end]))


def coalesce(ctx: Context, detected: Detected | Mapping[str, Any]) -> list[list[str]]:
    """Read every index, plan read ranges with their expected rows, store them; one arg list per read job."""
    detected = Detected.of(detected)
    started = time.perf_counter()
    run_lease.confirm(ctx, detected)
    plan_key = detected.plan
    store = ctx.runtime.store()
    plan = SnapshotPlan.load(store, plan_key)
    paths = plan.paths
    sizes = {info.key: info.size for info in store.list(paths.map_prefix)}
    names = [paths.map_output(t.task_id) for t in plan.write_tasks]
    written = written_records(store, plan)
    missing = [t.task_id for t in plan.write_tasks if t.task_id not in written]
    if missing:
        raise CorruptShuffleError(
            f"map outputs {missing[:5]} of snapshot {plan.snapshot_id} have no row record "
            f"({paths.written_prefix}): their write tasks did not finish"
        )

    def index_of(name: str):
        return read_index(store, name, plan.partitions, sizes.get(data_key(name)))

    with ThreadPoolExecutor(max_workers=INDEX_READ_THREADS) as pool:
        indexes = list(pool.map(index_of, names))
    totals = total_partition_sizes([ix.partition_sizes() for ix in indexes], plan.partitions)
    shuffle = ctx.config.shuffle
    result = plan_ranges(
        totals, shuffle.target_partition_size, shuffle.min_partition_size, min_ranges=shuffle.min_read_ranges
    )
    records = [written[t.task_id] for t in plan.write_tasks]
    ranges = []
    for i, r in enumerate(result.ranges):
        span_rows = [
            _span_rows(record, r.start, r.end, name, plan.partitions)
            for record, name in zip(records, names, strict=True)
        ]
        ranges.append(
            {
                "index": i,
                "start": r.start,
                "end": r.end,
                "size": r.size,
                "rows": sum(span_rows),
                "span_rows": span_rows,
                "spans": [MapOutputSpan.of(ix, r.start, r.end).to_dict() for ix in indexes],
            }
        )
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
    record_phase(
        store,
        paths,
        "coalesce",
        started,
        shuffle_bytes=int(result.total_size),
        ranges=[r["size"] for r in ranges],
        skewed=[s.partition for s in result.skewed],
        skew=[{"partition": s.partition, "size": s.size, "median": s.median} for s in result.skewed],
    )
    log.info(
        "coalesce: %d map outputs, %d bytes and %d rows in %d partitions -> %d read ranges in %d job(s)",
        len(indexes),
        result.total_size,
        sum(r["rows"] for r in ranges),
        plan.partitions,
        len(ranges),
        len(groups),
    )
    args = []
    for j, members in enumerate(groups):
        size = sum(ranges[i]["size"] for i in members)
        label = f"read {j + 1}/{len(groups)}: {len(members)} ranges, {format_bytes(size)}"
        args.append(["--phase", "read", "--plan", plan_key, "--group", str(j), "--label", label])
    return args

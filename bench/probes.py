"""Task memory and per-core speed: the pipeline's own unit functions, each phase in a fresh child process.

A Spark Python worker is a long-lived process that runs task after task, and
its RSS includes PySpark's own worker code; here each phase's units (all
write tasks, then all read ranges) run one after another in a spawned
process pinned to one Arrow thread, with nothing else in it; each unit
resets the process's peak-RSS mark when it starts and reports its own peak
(``VmHWM``).
Running the same snapshot shape at two table sizes (files 10x larger)
shows whether task memory follows the input files or stays bounded.

The steps around the units (detect, barrier, coalesce, cleanup) are the
DAG's own, in this process; nothing is committed, so the probe's sink keeps
its watermark and the probe can be repeated.
"""

from __future__ import annotations

import multiprocessing as mp
import uuid
from typing import Any

from iceberg_cdc.config import CdcConfig, parse_config
from iceberg_cdc.pipeline.groups import read_group_count, units_of
from iceberg_cdc.pipeline.plan import SnapshotPlan
from iceberg_cdc.run import steps


def _run_units(args: dict[str, Any]) -> list[dict[str, Any]]:
    import pyarrow as pa

    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    from iceberg_cdc.pipeline.groups import PHASE_FUNCTIONS
    from iceberg_cdc.pipeline.runtime import runtime_from_config

    runtime = runtime_from_config(parse_config(args["raw_config"]))
    plan = SnapshotPlan.load(runtime.store(), args["plan"])
    function = PHASE_FUNCTIONS[args["phase"]]
    return [function(plan, runtime, unit) for unit in args["units"]]


def _in_child(args: dict[str, Any]) -> list[dict[str, Any]]:
    with mp.get_context("spawn").Pool(1) as pool:
        return pool.apply(_run_units, (args,))


def probe(raw_config: dict[str, Any], config: CdcConfig, source: str) -> dict[str, Any]:
    """Write and read units of the source's next snapshot in child processes; their figures."""
    ctx = steps.Context.of(config, source)
    run_id = f"bench__probe__{uuid.uuid4().hex[:8]}"
    detected = steps.detect(ctx, run_id)
    try:
        store = ctx.runtime.store()
        plan = SnapshotPlan.load(store, detected.plan)
        write_units = [u for g in range(len(plan.groups)) for u in units_of("write", plan, g, store)]
        common = {"raw_config": raw_config, "plan": detected.plan}
        writes = _in_child({**common, "phase": "write", "units": write_units})
        missing, failed = steps.missing_map_outputs(ctx, detected)
        if missing or failed:
            raise RuntimeError(f"probe: map outputs missing {missing}, failed {failed}")
        steps.coalesce(ctx, detected)
        groups = read_group_count(plan, store)
        read_units = [u for g in range(groups) for u in units_of("read", plan, g, store)]
        reads = [r["stats"] for r in _in_child({**common, "phase": "read", "units": read_units})]
    finally:
        steps.cleanup(ctx, detected, run_id)
    return summarize(writes, reads, plan)


def summarize(
    writes: list[dict[str, Any]], reads: list[dict[str, Any]], plan: SnapshotPlan
) -> dict[str, Any]:
    """Per-core speeds and peak memory of one probe."""
    mib = float(1 << 20)
    arrow_in = sum(w["input_bytes"] for w in writes)
    engine_s = sum(w["encode_seconds"] + w["commit_seconds"] for w in writes)
    task_s = sum(w["seconds"] for w in writes)
    arrow_read = sum(r["arrow_bytes"] for r in reads)
    fetch_merge_s = sum(r["fetch_seconds"] + r["merge_seconds"] for r in reads)
    files = [f for task in plan.write_tasks for f in task.files]
    return {
        "write_tasks": len(writes),
        "read_ranges": len(reads),
        "largest_input_file_mb": round(max(f.size for f in files) / mib, 1),
        "mean_input_file_mb": round(sum(f.size for f in files) / len(files) / mib, 2),
        "largest_task_input_mb": round(max(t.bytes for t in plan.write_tasks) / mib, 1),
        "write": {
            "arrow_mb": round(arrow_in / mib, 1),
            "task_seconds": round(task_s, 3),
            "read_input_seconds": round(sum(w["read_seconds"] for w in writes), 3),
            "encode_seconds": round(sum(w["encode_seconds"] for w in writes), 3),
            "commit_seconds": round(sum(w["commit_seconds"] for w in writes), 3),
            "engine_mb_s_per_core": round(arrow_in / mib / max(engine_s, 1e-9), 1),
            "with_parquet_decode_mb_s_per_core": round(arrow_in / mib / max(task_s, 1e-9), 1),
            "peak_rss_mb_per_task": [w["peak_rss_mb"] for w in writes],
            "peak_rss_mb": max(w["peak_rss_mb"] for w in writes),
            "spills_max": max(w["spills"] for w in writes),
        },
        "read": {
            "arrow_mb": round(arrow_read / mib, 1),
            "fetch_seconds": round(sum(r["fetch_seconds"] for r in reads), 3),
            "merge_seconds": round(sum(r["merge_seconds"] for r in reads), 3),
            "stage_seconds": round(sum(r["stage_seconds"] for r in reads), 3),
            "read_merge_mb_s_per_core": round(arrow_read / mib / max(fetch_merge_s, 1e-9), 1),
            "largest_range_mb": round(max(r["shuffle_bytes"] for r in reads) / mib, 1),
            "peak_rss_mb_per_range": [r["peak_rss_mb"] for r in reads],
            "peak_rss_mb": max(r["peak_rss_mb"] for r in reads),
        },
    }

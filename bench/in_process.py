"""Where a phase group costs the same in the task's process and as a Spark job: ``spark.in_process_below``.

For a few input sizes, one copy-on-write snapshot that rewrites every file
of a table (so the write group's input is the size), detect plans it once,
then the write group runs in process and on a warm Spark Connect server
(``connect_app.run_group``, as the DAG's operator runs it), alternating, and
so does the read group after coalesce. Each figure is the wall time of the
whole call a task makes (the session is warm; its first start is not
counted; one unmeasured call of each first), the median of ``--repeats``. Warehouse and shuffle on ``file://``:
the same I/O for both paths.

Prints one line per size and ``in-process: ... same cost at about X MiB``,
the size where the two lines cross (interpolated), which is what the
default of ``spark.in_process_below`` follows (docs/benchmarks.md).

    python bench/in_process.py [--sizes-mib 0.05 1 4 16 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

ROWS_PER_MIB = 180_000  # orders rows (id, region, status) per MiB of Parquet input, about; measured per size


def _timed(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def _size_figures(work: Path, url: str, size_mib: float, repeats: int) -> dict[str, Any]:
    import pyarrow as pa

    from cdc_devtools.cow import cow_merge
    from cdc_devtools.inline_pipeline import SOURCE, InlinePipeline
    from cdc_devtools.orders import SCHEMA, rows
    from iceberg_cdc.pipeline import connect_app
    from iceberg_cdc.pipeline.in_process import run_if_small
    from iceberg_cdc.pipeline.plan import SnapshotPlan
    from iceberg_cdc.run import steps

    pipeline = InlinePipeline(work, shuffle={"target_partition_size": "256MB", "min_read_ranges": 1})
    source = pipeline.create_source(SCHEMA)
    count = max(10, int(size_mib * ROWS_PER_MIB))
    source.append(rows(range(count), "us"))
    pipeline.run()
    # One update per 100 rows: a rewrite of every file, mostly carryover (as a MERGE writes).
    cow_merge(source, upserts=pa.concat_tables([rows(range(0, count, 100), "us", "shipped")]), delete_keys=[])
    ctx = steps.Context.of(pipeline.config, SOURCE)
    runtime = ctx.runtime
    detected = steps.detect(ctx, "bench-in-process")
    figures: dict[str, Any] = {"rows": count}
    try:
        plan = SnapshotPlan.load(runtime.store(), detected.plan)
        figures["input_bytes"] = sum(g.bytes for g in plan.groups)
        huge = 1 << 50
        for phase in ("write", "read"):
            if phase == "read":
                steps.coalesce(ctx, detected)
            here, spark = [], []
            run_if_small(runtime, detected.plan, phase, 0, huge)  # warm: imports, the workers' first task
            connect_app.run_group(url, runtime, detected.plan, phase, 0)
            for _ in range(repeats):
                here.append(_timed(lambda p=phase: run_if_small(runtime, detected.plan, p, 0, huge)))
                spark.append(_timed(lambda p=phase: connect_app.run_group(url, runtime, detected.plan, p, 0)))
            figures[phase] = {
                "in_process_seconds": round(statistics.median(here), 3),
                "spark_seconds": round(statistics.median(spark), 3),
            }
        figures["shuffle_bytes"] = sum(
            info.size for info in runtime.store().list(plan.paths.prefix) if info.key.endswith(".data")
        )
    finally:
        steps.cleanup(ctx, detected, "bench-in-process")
    return figures


def crossover_mib(points: list[dict[str, Any]]) -> float | None:
    """The input size (MiB) where the snapshot's in-process and Spark times cross, by linear interpolation."""
    previous = None
    for point in points:
        gap = point["in_process_seconds"] - point["spark_seconds"]
        if gap >= 0:
            if previous is None:
                return point["input_mib"]
            (x0, g0), x1 = previous, point["input_mib"]
            return round(x0 + (x1 - x0) * (-g0) / (gap - g0), 1)
        previous = (point["input_mib"], gap)
    return None


def figures(sizes_mib: list[float], repeats: int, *, echo: bool = False) -> dict[str, Any]:
    from cdc_devtools.connect_server import LocalSparkConnectServer
    from iceberg_cdc.pipeline import connect_app
    from iceberg_cdc.pipeline.pyfiles import package_digest, package_zip

    with tempfile.TemporaryDirectory(prefix="bench-in-process-") as tmp:
        work = Path(tmp)
        with LocalSparkConnectServer(work / "spark-connect", master="local[2]") as server:
            connect_app.session(server.url, package_zip(), package_digest())  # its start is not counted
            results = []
            for size in sizes_mib:
                found = _size_figures(work / f"size-{size}", server.url, size, repeats)
                found["input_mib"] = round(found["input_bytes"] / 2**20, 3)
                # The snapshot's cost: its write group and its read group.
                found["in_process_seconds"] = round(
                    sum(found[p]["in_process_seconds"] for p in ("write", "read")), 3
                )
                found["spark_seconds"] = round(sum(found[p]["spark_seconds"] for p in ("write", "read")), 3)
                results.append(found)
                if echo:
                    print(point_line(found), flush=True)
    return {"points": results, "crossover_mib": crossover_mib(results), "repeats": repeats}


def point_line(point: dict[str, Any]) -> str:
    return (
        f"in-process: {point['input_mib']:.2f} MiB of input ({point['rows']:,} rows): write + read "
        f"{point['in_process_seconds']:.2f} s in process, {point['spark_seconds']:.2f} s as Spark Connect jobs"
    )


def summary_line(result: dict[str, Any]) -> str:
    cross = result["crossover_mib"]
    largest = result["points"][-1]["input_mib"]
    where = f"about {cross} MiB" if cross is not None else f"above {largest:.0f} MiB (the largest tried)"
    return f"in-process: a snapshot's groups cost the same in process and on warm Spark Connect at {where}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes-mib", type=float, nargs="+", default=[0.05, 1, 4, 16, 32])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "in_process.json")
    args = parser.parse_args()
    result = figures(args.sizes_mib, args.repeats, echo=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(summary_line(result))


if __name__ == "__main__":
    main()

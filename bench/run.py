"""make bench: the pipeline against Spark's own shuffle, side by side, on the same two cores.

Workload (``workload.py``): an Iceberg table of N rows (default 5 M) and one
copy-on-write snapshot that updates 10% of rows (a fifth of them move
partition), deletes 1% and rewrites every data file.

Runs, in this one invocation, all on Spark ``local[2]``:

* the pipeline, phase by phase through the Spark jobs the DAG submits, with
  the shuffle on ``file://`` and on the local S3 server (requests per phase
  counted on the server);
* the Spark-native baseline: one PySpark job, Spark's shuffle, same input
  files, same changelog -- checked row for row against the pipeline's sink;
* the floor: read every input file, write as many rows, no shuffle;
* scaling: the same at N / 10;
* task memory and per-core speed of the pipeline's own task functions in
  child processes, at both sizes (input files 10x apart);
* the pipeline (``spark.mode: connect``) and the Spark-native job on one warm
  Spark Connect server (``connect_run.py``), each run twice, the second timed;
* the real peer (``peer.py``): Iceberg's own ``create_changelog_view`` in a warm
  Iceberg Java session beside the warm pipeline, on the same snapshot as Iceberg
  Java writes it, each twice, alternating, outputs compared (``--skip-peer``
  leaves it out; it needs ``make java-setup``);
* small-snapshot latency: a real ``airflow dags test`` run after a one-row
  update, in submit mode and in connect mode (a local Spark Connect server);
* under Airflow's scheduler (API server, scheduler, DAG processor, a
  LocalExecutor with 2 slots; connect mode): one-row latency from the REST
  trigger to success, and a backlog of 30 one-row snapshots caught up by
  chained runs (also with ``--quick``; ``--no-scheduler`` leaves it out);
* under the scheduler with the event trigger (``freshness.py``): 10 one-row
  commits at random intervals, nobody triggering: ``freshness: p50 X s, p95 Y s``
  (source commit to sink commit) and the catalog poll's calls per minute per table;
* the streaming-writer soak (``soak.py``), the same deployment with both mirrors on:
  a writer committing every 5 s, then every 10 s, for 10 minutes each (1 minute
  with ``--quick``), then the catch-up: ``soak: a commit every 5 s for 600 s: lag
  p50 A s, p95 B s, max C s; caught up D s after the last commit; exact``;
* the engine-only figures of ``engine_bench.py``;
* mirrors (``mirror_bench.py``): 1 M changed rows applied to PostgreSQL against
  ``executemany``, and a mirror 30 changelog snapshots behind caught up in one
  run against one run per snapshot (``--skip-mirror`` leaves it out);
* verifying both mirrors (``verify_bench.py``): digests of the bench table's
  PostgreSQL and Iceberg mirrors against reading both sides once, and a
  1-row drift found and repaired (``--skip-verify`` leaves it out);
* an Iceberg mirror (``iceberg_mirror_bench.py``): a 1% update + 0.1% delete
  of the N-row table applied by the Iceberg mirror target against pyiceberg's
  own ``Table.upsert`` (seconds, bytes written), and a 30-snapshot catch-up in
  one apply against one apply per snapshot (``--skip-iceberg-mirror`` leaves
  it out).

Writes ``bench/results/pipeline.{json,txt,png,md}`` and ends with the lines
``bench (warm Spark Connect): pipeline X s, spark-native Y s, ratio=R`` and
``bench: pipeline X s, spark-native Y s, floor Z s, ratio=R`` (R = X / Y, both
with the shuffle on local disk; the last line: pipeline in submit mode,
Spark-native as one spark-submit).

    python bench/run.py            # N = 5 M, about 10-15 minutes
    python bench/run.py --quick    # N = 100 k, about 2 minutes: side by side (S3 in process) and warm Connect
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import report  # noqa: E402
import workload as wl  # noqa: E402
from connect_run import connect_line, run_connect  # noqa: E402
from freshness import freshness_figures, freshness_lines  # noqa: E402
from harness import (  # noqa: E402
    NATIVE_DRIVER_MEMORY,
    NO_CANCEL,
    PARTITIONS,
    RESULTS,
    SHUFFLE_BUCKET,
    SPARK_SQL_CONF,
    Bench,
    MiB,
    by_type,
    log,
    same_rows,
)
from iceberg_mirror_bench import iceberg_mirror_lines  # noqa: E402
from iceberg_mirror_bench import run as run_iceberg_mirror_bench  # noqa: E402
from in_process import figures as in_process_figures  # noqa: E402
from in_process import point_line as in_process_point_line  # noqa: E402
from in_process import summary_line as in_process_summary_line  # noqa: E402
from latency import (  # noqa: E402
    compare_modes,
    latency_line,
    one_row_latency,
    scheduler_figures,
    scheduler_lines,
)
from mor_bench import mor_line, run_mor_vs_cow  # noqa: E402
from peer import peer_line, run_peer  # noqa: E402
from pipeline_run import sink_changes  # noqa: E402
from point_update import point_update_line, run_point_update  # noqa: E402
from probes import probe  # noqa: E402
from s3log import RequestLog  # noqa: E402
from soak import failed as soak_failed  # noqa: E402
from soak import soak_figures, soak_lines  # noqa: E402

from cdc_devtools.iceberg_java import missing as java_missing  # noqa: E402
from cdc_devtools.local_s3 import LocalS3Server  # noqa: E402

# --- floors --------------------------------------------------------------------------------------


def pyarrow_floor(workload: wl.Workload, keep_fraction: float, out: Path) -> dict[str, Any]:
    """Read every input file whole and write ``keep_fraction`` of its rows: one process, Arrow's threads."""
    started = time.perf_counter()
    read = written = 0
    writer = None
    for uri in [*workload.removed, *workload.added]:
        table = pq.read_table(uri.removeprefix("file://"))
        read += table.num_rows
        keep = table.slice(0, round(table.num_rows * keep_fraction))
        if writer is None:
            writer = pq.ParquetWriter(out, keep.schema, compression="zstd")
        writer.write_table(keep)
        written += keep.num_rows
    if writer is not None:
        writer.close()
    return {
        "wall_seconds": round(time.perf_counter() - started, 3),
        "rows_read": read,
        "rows_written": written,
        "threads": pa.cpu_count(),
    }


# --- runs ----------------------------------------------------------------------------------------


def build_workloads(bench: Bench, rows: int, appends: int, quick: bool) -> dict[str, wl.Workload]:
    workloads = {}
    log(f"building the source table: {rows:,} rows in {appends} appends, then the copy-on-write snapshot")
    workloads["main"] = wl.build_source(bench.catalog, "orders", rows, appends)
    log(f"building the N/10 table: {rows // 10:,} rows")
    workloads["small"] = wl.build_source(bench.catalog, "orders_small", rows // 10, appends)
    if not quick:
        workloads["tiny"] = wl.build_one_row_update(bench.catalog, "tiny", 10_000)
    main = workloads["main"]
    # About 4 write tasks per core: the bin packing's target, from the snapshot's input size.
    bench.write_task_size = max(MiB, (main.removed_bytes + main.added_bytes) // 8 + 1)
    return workloads


def run_side_by_side(bench: Bench, workloads: dict[str, wl.Workload], results: dict[str, Any]) -> None:
    main = workloads["main"]
    if not bench.quick:
        log("fixed cost of one Spark application (a two-task job)")
        results["spark_app_fixed_cost"] = bench.spark_app("spark-noop", "noop", None)
    log("pipeline, shuffle on file:// (spark-submit per phase)")
    results["pipeline"] = {"file": bench.pipeline("file", main, "file")}
    pipeline_rows = sink_changes(
        bench.catalog, results["pipeline"]["file"]["sink"], main.snapshot_id, wl.COLUMNS
    )
    log("the same without cancelling carryover before the shuffle (every row shuffled, as before)")
    results["pipeline"]["file_no_cancel"] = bench.pipeline("file-no-cancel", main, "file", extra=NO_CANCEL)
    before_rows = sink_changes(
        bench.catalog, results["pipeline"]["file_no_cancel"]["sink"], main.snapshot_id, wl.COLUMNS
    )
    results["checks"] = {"no_cancel_vs_cancel": same_rows(pipeline_rows, before_rows)}
    del before_rows
    log("Spark-native baseline (one PySpark job, Spark's shuffle)")
    native = bench.spark_app("spark-native", "native", main)
    native_rows = pq.ParquetDataset(native.pop("out")).read()
    results["spark_native"] = native
    results["checks"]["spark_native_vs_pipeline"] = same_rows(pipeline_rows, native_rows)
    del native_rows
    keep = pipeline_rows.num_rows / max(main.rows * 2, 1)
    log("floor: read every input and write as many rows, no shuffle (Spark, then pyarrow)")
    results["floor"] = {
        "spark": bench.spark_app("spark-floor", "floor", main, "--keep-fraction", f"{keep:.6f}")
    }
    results["floor"]["spark"].pop("out")
    results["floor"]["pyarrow"] = pyarrow_floor(main, keep, bench.work / "floor-pyarrow.parquet")
    log("pipeline, shuffle on the local S3 server" + (" (in process, no Spark)" if bench.quick else ""))
    results["pipeline"]["s3"] = bench.pipeline("s3", main, "s3", inline=bench.quick)
    s3_rows = sink_changes(bench.catalog, results["pipeline"]["s3"]["sink"], main.snapshot_id, wl.COLUMNS)
    results["checks"]["s3_vs_file"] = same_rows(pipeline_rows, s3_rows)
    expected = wl.expected_counts(main.rows)
    got = results["pipeline"]["file"]["breakdown"]["rows"]
    results["checks"]["generator_counts"] = {
        "expected": expected,
        "pipeline": {"updates": got["updates"], "deletes": got["deletes"], "inserts": got["inserts"]},
        "equal": expected == {"updates": got["updates"], "deletes": got["deletes"]} and got["inserts"] == 0,
    }


def run_scaling(bench: Bench, workloads: dict[str, wl.Workload], results: dict[str, Any]) -> None:
    small = workloads["small"]
    scaling: dict[str, Any] = {"rows": [small.rows, workloads["main"].rows]}
    if not bench.quick:
        log(f"scaling: pipeline (file://) and Spark-native at N/10 = {small.rows:,} rows")
        scaling["pipeline_small"] = bench.pipeline("file-small", small, "file")
        native = bench.spark_app("spark-native-small", "native", small)
        native.pop("out")
        scaling["spark_native_small"] = native
    sizes = ("main",) if bench.quick else ("small", "main")
    log("task memory and per-core speed: unit functions in child processes, " + " then ".join(sizes))
    memory = {}
    for key in sizes:
        workload = workloads[key]
        sink = f"{workload.table}_changes_probe"
        wl.start_sink_at_parent(bench.catalog, workload, sink)
        _, raw, config = bench.config(f"probe-{key}", workload.table, sink, "file")
        memory[key] = {"rows": workload.rows, **probe(raw, config, workload.table)}
    # Read tasks over full-size ranges (every row shuffled), merged a few partitions at a time and,
    # as before, each range at once: the peak memory of both, in one run.
    main = workloads["main"]
    log("read task memory: every row shuffled, ranges merged by partition groups and whole")
    sink = f"{main.table}_changes_probe_no_cancel"
    wl.start_sink_at_parent(bench.catalog, main, sink)
    _, raw, config = bench.config("probe-no-cancel", main.table, sink, "file", NO_CANCEL)
    memory["main_no_cancel"] = {"rows": main.rows, **probe(raw, config, main.table, whole_range_too=True)}
    results["scaling"] = scaling
    results["memory"] = memory


def run_latency(bench: Bench, workloads: dict[str, wl.Workload], results: dict[str, Any]) -> None:
    tiny = workloads["tiny"]
    sink = f"{tiny.table}_changes"
    wl.start_sink_at_parent(bench.catalog, tiny, sink)
    path, _, _ = bench.config("tiny", tiny.table, sink, "s3")
    log("small-snapshot latency: airflow dags test after a one-row update (takes about a minute)")
    home = ROOT / ".cdc" / "bench-airflow"
    latency = one_row_latency(home, path, "cdc__bench__tiny", bench.logs / "airflow-one-row.log")
    row_changes = sink_changes(bench.catalog, sink, tiny.snapshot_id, wl.COLUMNS)
    latency["changes"] = by_type(row_changes)
    latency["commit_summary_seconds"] = dict(_commit_summary(bench, sink, tiny.snapshot_id).seconds)
    results["latency"] = latency
    log("the same in connect mode: a local Spark Connect server, then two one-row runs on it")
    results["latency_connect"] = compare_modes(
        bench.work, bench.s3, bench.logs, rows=tiny.rows, submit_runs=0, connect_runs=2, home=home
    )


def _commit_summary(bench: Bench, sink: str, snapshot_id: int):
    """The pipeline's record of its commit of ``snapshot_id`` (empty when there is none)."""
    from iceberg_cdc.sink.summary import CommitSummary

    table = bench.catalog.load_table(sink)
    for snapshot in table.snapshots():
        record = CommitSummary.from_summary(
            snapshot.summary.additional_properties if snapshot.summary else {}
        )
        if record.source_snapshot_id == snapshot_id:
            return record
    return CommitSummary()


def run_engine_bench(quick: bool, out_dir: Path) -> dict[str, Any]:
    log("engine-only figures (engine_bench.py, generated input, file://)")
    out = out_dir / "engine.json"
    command = [sys.executable, str(ROOT / "bench" / "engine_bench.py"), "--no-s3", "--out", str(out)]
    with open(out_dir / "engine.txt", "w") as text:
        subprocess.run([*command, *(["--quick"] if quick else [])], check=True, stdout=text)
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="N = 100 k, about a minute")
    parser.add_argument("--rows", type=int, default=None, help="N (default 5 M; 100 k with --quick)")
    parser.add_argument("--skip-engine", action="store_true", help="leave engine_bench.py out (--quick does)")
    parser.add_argument("--skip-airflow", action="store_true", help="leave the one-row Airflow run out")
    parser.add_argument("--skip-mirror", action="store_true", help="leave the mirror figures out")
    parser.add_argument(
        "--skip-verify", action="store_true", help="leave verify_bench.py (verifying both mirrors) out"
    )
    parser.add_argument(
        "--skip-iceberg-mirror", action="store_true", help="leave the Iceberg mirror figures out"
    )
    parser.add_argument(
        "--skip-connect", action="store_true", help="leave the warm Spark Connect comparison out"
    )
    parser.add_argument(
        "--skip-peer", action="store_true", help="leave Iceberg's create_changelog_view (the peer) out"
    )
    parser.add_argument(
        "--scheduler",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="one-row latency, a 30-snapshot backlog, freshness by event and the streaming-writer soak "
        "under Airflow's scheduler (default: on, also with --quick; about 50 minutes, 15 with --quick)",
    )
    args = parser.parse_args()
    rows = args.rows or (100_000 if args.quick else 5_000_000)
    if not args.skip_peer and (why := java_missing()) is not None:
        raise SystemExit(f"the peer (create_changelog_view) needs Iceberg Java: {why}; or pass --skip-peer")
    started = time.perf_counter()
    work = ROOT / ".cdc" / "bench"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    bench = Bench(work, args.quick)
    results: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "pyarrow": pa.__version__,
            "spark_master": "local[2]",
        },
        "quick": args.quick,
    }
    workloads = build_workloads(bench, rows, 5, args.quick)
    results["workloads"] = {k: wl.describe_workload(w) for k, w in workloads.items()}
    results["config"] = {
        "partitions": PARTITIONS,
        "write_task_size": bench.write_task_size,
        "target_partition_size": 64 * MiB,
        "parallel_jobs": 1,
        "spark_native_driver_memory": NATIVE_DRIVER_MEMORY,
        "spark_sql_conf": SPARK_SQL_CONF,
    }
    bench.s3 = LocalS3Server(log_path=work / "s3.log").start()
    try:
        bench.s3.client().create_bucket(Bucket=SHUFFLE_BUCKET)
        bench.request_log = RequestLog(work / "s3.log")
        run_side_by_side(bench, workloads, results)
        run_scaling(bench, workloads, results)
        results["merge_on_read"] = run_mor_vs_cow(bench, rows, 5, log)
        results["checks"]["merge_on_read_deletes"] = {"equal": results["merge_on_read"]["equal"]}
        log(f"merge-on-read: one-row update by deletion vector of a {rows:,}-row file")
        results["point_update"] = run_point_update(bench.catalog, rows)
        results["checks"]["point_update"] = {"equal": results["point_update"]["equal"]}
        if not args.skip_connect:
            run_connect(
                bench,
                workloads,
                results,
                driver_memory=NATIVE_DRIVER_MEMORY,
                sql_conf=SPARK_SQL_CONF,
                same_rows=same_rows,
                log=log,
                no_cancel=NO_CANCEL,
            )
        if not args.skip_peer:
            results["peer"] = run_peer(
                bench,
                rows,
                appends=5,
                driver_memory=NATIVE_DRIVER_MEMORY,
                sql_conf=SPARK_SQL_CONF,
                same_rows=same_rows,
                log=log,
            )
            results["checks"].update(results["peer"]["checks"])
        if not args.quick and not args.skip_airflow:
            run_latency(bench, workloads, results)
        if not args.quick:
            log("phase groups in the task's process against warm Spark Connect jobs, by input size")
            results["in_process"] = in_process_figures([0.05, 1, 4, 16], repeats=3)
        if args.scheduler:
            log("under the scheduler: one-row latency, then 30 one-row snapshots caught up by chained runs")
            results["scheduler"] = scheduler_figures(work, bench.s3, bench.logs)
            log(
                "under the scheduler with the event trigger: freshness of 10 one-row commits, no manual trigger"
            )
            results["freshness"] = freshness_figures(work / "freshness", bench.s3, bench.logs)
            log("the streaming-writer soak, mirrors on: a commit every 5 s, then every 10 s (soak.py)")
            results["soak"] = soak_figures(
                work / "soak", bench.s3, bench.logs, duration=60.0 if args.quick else 600.0, log=log
            )
            results["checks"]["soak"] = {"equal": not soak_failed(results["soak"])}
    finally:
        bench.s3.stop()
    # A quick run must not overwrite the committed figures of a full one.
    out_dir = work / "results" if args.quick else RESULTS
    out_dir.mkdir(parents=True, exist_ok=True)
    if not args.skip_iceberg_mirror:
        log("Iceberg mirror: net changes applied by the mirror target and by pyiceberg's upsert")
        iceberg = run_iceberg_mirror_bench(rows, work / "iceberg-mirror", 30)
        results["iceberg_mirror"] = iceberg
        results["checks"]["iceberg_mirror"] = {"equal": iceberg["equal"]}
        (out_dir / "iceberg_mirror.json").write_text(json.dumps(iceberg, indent=2) + "\n")
        (out_dir / "iceberg_mirror.txt").write_text("\n".join(iceberg_mirror_lines(iceberg)) + "\n")
    if not args.skip_engine and not args.quick:
        results["engine"] = run_engine_bench(args.quick, out_dir)
    if not args.skip_mirror:
        log(
            "mirrors: changes applied to PostgreSQL, and a mirror 30 changelog snapshots behind (mirror_bench.py)"
        )
        command = [sys.executable, str(ROOT / "bench" / "mirror_bench.py"), "--out", str(out_dir)]
        subprocess.run(
            [*command, *(["--quick"] if args.quick else [])], check=True, stdout=subprocess.DEVNULL
        )
        results["mirror"] = json.loads((out_dir / "mirror.json").read_text())
    if not args.skip_verify:
        log(
            "verify: both mirrors of the bench table proved equal, then a 1-row drift repaired (verify_bench.py)"
        )
        command = [
            sys.executable,
            str(ROOT / "bench" / "verify_bench.py"),
            "--rows",
            str(rows),
            "--out",
            str(out_dir),
        ]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        results["verify"] = json.loads((out_dir / "verify.json").read_text())
    results["bench_wall_seconds"] = round(time.perf_counter() - started, 1)
    results["headline"] = report.headline(results)
    (out_dir / "pipeline.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    report.write_all(results, out_dir, None if args.quick else ROOT / "bench" / "README.md")
    print(report.summary_text(results))
    print(f"\nresults: {out_dir}/pipeline.{{json,txt,png,md}}")
    h = results["headline"]
    ok = all(check.get("equal", False) for check in results["checks"].values())
    if not ok:
        print("bench: CHECK FAILED: the pipeline and a comparison run disagree; see pipeline.json 'checks'")
    print(mor_line(results["merge_on_read"]))
    if "iceberg_mirror" in results:
        print("\n".join(iceberg_mirror_lines(results["iceberg_mirror"])))
    print(point_update_line(results["point_update"]))
    if "latency_connect" in results:
        print(latency_line(results["latency"]["wall_seconds"], results["latency_connect"]))
    elif "latency" in results:
        print(f"latency: one-row snapshot {results['latency']['wall_seconds']:.1f} s (submit)")
    if "in_process" in results:
        in_process = results["in_process"]
        (out_dir / "in_process.json").write_text(json.dumps(in_process, indent=2) + "\n")
        print(
            "\n".join(
                [*map(in_process_point_line, in_process["points"]), in_process_summary_line(in_process)]
            )
        )
    if "scheduler" in results:
        print("\n".join(scheduler_lines(results["scheduler"])))
    if "freshness" in results:
        freshness = freshness_lines(results["freshness"])
        (out_dir / "freshness.json").write_text(json.dumps(results["freshness"], indent=2) + "\n")
        (out_dir / "freshness.txt").write_text("\n".join(["# make bench", *freshness]) + "\n")
        print("\n".join(freshness))
    if "soak" in results:
        soak = soak_lines(results["soak"])
        (out_dir / "soak.json").write_text(json.dumps(results["soak"], indent=2) + "\n")
        (out_dir / "soak.txt").write_text("\n".join(["# make bench", *soak]) + "\n")
        print("\n".join(soak))
    if "mirror" in results:
        print((out_dir / "mirror.txt").read_text().rstrip())
    if "verify" in results:
        print((out_dir / "verify.txt").read_text().rstrip())
    if "peer" in results:
        print(peer_line(results["peer"]))
    print(report.shuffled_line(results))
    if "connect" in results:
        print(connect_line(results))
    print(
        f"bench: pipeline {h['pipeline_s']:.1f} s, spark-native {h['spark_native_s']:.1f} s, "
        f"floor {h['floor_s']:.1f} s, ratio={h['ratio']:.2f}"
    )
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()

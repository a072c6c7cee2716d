"""The real peer: Apache Iceberg's own ``create_changelog_view`` beside the pipeline, both warm.

On the bench's copy-on-write snapshot (N rows, 10% updated, 1% deleted, every file rewritten) as
Iceberg Java writes it (``java_source.py``: Iceberg 1.10.2 on Spark 3.5.9), the same cores
(``local[2]``, the same driver memory and Spark SQL settings as the warm Spark Connect comparison):

* the peer: one Iceberg Java session kept up (``IcebergJava.serve``) runs
  ``CALL bench.system.create_changelog_view(table => ..., options => map('start-snapshot-id', <parent>,
  'end-snapshot-id', <snapshot>), compute_updates => true, identifier_columns => array('id'))`` and
  writes the view's rows to Parquet (zstd): the procedure call and the write are its seconds. It reads
  a copy of the catalog file taken after the source was written (the same metadata and data files):
  a live Spark JVM locks its SQLite file, and the pipeline commits to the original meanwhile;
* the pipeline: ``spark.mode: connect`` on a warm local Spark Connect server (``connect_run.py``'s),
  shuffle on ``file://``, as the bench's warm Connect comparison runs it, committing to a sink. The
  server's JVM runs as a CDC server is meant to (``COORDINATOR_JAVA_OPTIONS``: the JIT's first tier
  only, as ``make airflow``'s and the compose file's); the peer's JVM computes, so it keeps Spark's
  defaults (the first tier alone made it twice as slow);
* each side four times, alternating (pipeline, peer, pipeline, peer, ...); the first run of each warms
  its JVM, the median of the other three is the comparison (one warm run of either side varies by
  +-15% from the next on this machine). Every run's rows are compared with the other side's of the same
  turn: the same rows and change types (the view's ``_change_ordinal`` and ``_commit_snapshot_id`` left out).

``make bench`` runs it (``--skip-peer`` leaves it out); alone, with the table at another size::

    python bench/peer.py                 # N = 5 M: writes bench/results/peer.{json,txt}
    python bench/peer.py --rows 50000    # a small table first: writes .cdc/bench-peer/results/

It ends with ``peer: Iceberg create_changelog_view X s, pipeline (warm) Y s, ratio=R`` (R = Y / X).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
WARMUP_RUNS = 1  # each side: runs that only warm its JVM
TIMED_RUNS = 3  # each side: runs after those; their median is the comparison
TABLE = "orders_java"
# The view's own columns that the pipeline's sink keeps elsewhere (its snapshot marker) or not at all.
VIEW_METADATA = ("_change_ordinal", "_commit_snapshot_id")


def changelog_call(catalog: str, table: str, parent_id: int, snapshot_id: int, view: str) -> str:
    """Iceberg's procedure for the changes of ``snapshot_id`` alone (start is exclusive), updates paired."""
    return (
        f"CALL {catalog}.system.create_changelog_view(table => '{catalog}.{table}', "
        f"options => map('start-snapshot-id', '{parent_id}', 'end-snapshot-id', '{snapshot_id}'), "
        f"changelog_view => '{view}', compute_updates => true, identifier_columns => array('id'))"
    )


def view_rows(view: pa.Table, columns: list[str]) -> pa.Table:
    """The view's rows as the pipeline's sink rows compare: source columns and ``_change_type``."""
    wanted = [*columns, "_change_type"]
    extra = set(view.column_names) - set(wanted) - set(VIEW_METADATA)
    if extra or not set(wanted) <= set(view.column_names):
        raise ValueError(
            f"the changelog view has columns {view.column_names}, expected {wanted} + {VIEW_METADATA}"
        )
    return view.select(wanted)


def peer_seconds(answer: list[dict[str, Any]]) -> float:
    """The procedure call and the view's write (the row count read back from the files is left out)."""
    call, write = answer
    return call["seconds"] + write["write_seconds"]


def peer_figures(peer: dict[str, Any]) -> dict[str, float]:
    """Each side's median over its timed runs (after ``warmup_runs``) and ratio = pipeline / peer.

    Results written before the median (no ``warmup_runs``) compare the last run of each side.
    """
    warmup = peer.get("warmup_runs")
    timed = slice(-1, None) if warmup is None else slice(warmup, None)
    x = statistics.median(run["seconds"] for run in peer["peer"][timed])
    y = statistics.median(run["wall_seconds"] for run in peer["pipeline"][timed])
    return {"peer_s": x, "peer_pipeline_s": y, "peer_ratio": round(y / max(x, 1e-9), 3)}


def peer_line(peer: dict[str, Any]) -> str:
    """``peer: Iceberg create_changelog_view X s, pipeline (warm) Y s, ratio=R`` (medians, see :func:`peer_figures`)."""
    f = peer_figures(peer)
    return (
        f"peer: Iceberg create_changelog_view {f['peer_s']:.1f} s, pipeline (warm) "
        f"{f['peer_pipeline_s']:.1f} s, ratio={f['peer_ratio']:.2f}"
    )


def summary_lines(peer: dict[str, Any]) -> list[str]:
    """The peer's section of ``pipeline.txt`` (and ``peer.txt``)."""
    w = peer["workload"]
    lines = [
        f"\n== The real peer: Iceberg create_changelog_view (Iceberg {peer['iceberg']}, {peer['master']}, "
        f"driver memory {peer['driver_memory']}), each side {_runs_told(peer)} alternating",
        f"   {w['rows']:,} rows written by Iceberg Java in {peer['java_write_seconds']:.0f} s; snapshot "
        f"{w['snapshot_id']}: removed {w['removed_files']} files ({w['removed_bytes'] / (1 << 20):.0f} MB), "
        f"added {w['added_files']} ({w['added_bytes'] / (1 << 20):.0f} MB); load average (1, 5, 15 min) "
        f"{peer['load_average_at_start']} at the start, {peer.get('load_average_at_end')} at the end",
    ]
    if peer.get("server_java_options"):
        lines.append(
            f"   the pipeline's Connect server JVM: {peer['server_java_options']} (it only coordinates); "
            "the peer's JVM: Spark's defaults"
        )
    for index, (mine, theirs) in enumerate(zip(peer["pipeline"], peer["peer"], strict=True), 1):
        lines.append(
            f"   run {index}: pipeline {mine['wall_seconds']:.1f} s ({_phases(mine['phase_seconds'])}), "
            f"create_changelog_view {theirs['seconds']:.1f} s (call {theirs['call_seconds']:.1f}, "
            f"write {theirs['write_seconds']:.1f}; {theirs['rows']:,} rows)"
        )
    for name, check in peer["checks"].items():
        lines.append(f"   {name}: {'OK' if check.get('equal') else 'FAILED'} {check}")
    lines.append(peer_line(peer))
    return lines


def _runs_told(peer: dict[str, Any]) -> str:
    warmup = peer.get("warmup_runs")
    if warmup is None:
        return f"{peer['warm_runs']} runs, the last timed"
    return f"{warmup} warm-up + {peer['warm_runs'] - warmup} timed runs, the median compared"


def _phases(seconds: dict[str, float]) -> str:
    return ", ".join(f"{name} {value:.1f}" for name, value in seconds.items() if value >= 0.05)


def _copy_catalog(source: Path, target: Path) -> None:
    """A consistent copy of the SQLite catalog (its WAL included) for the peer's session alone."""
    target.unlink(missing_ok=True)
    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)


def run_peer(
    bench: Any,
    rows: int,
    *,
    appends: int,
    driver_memory: str,
    sql_conf: dict[str, str],
    same_rows: Callable[[pa.Table, pa.Table], dict[str, Any]],
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Write the source with Iceberg Java, then both sides warm, alternating; figures and checks."""
    import java_source
    import pyarrow.parquet as pq
    import workload as wl
    from connect_run import warm_server
    from pipeline_run import sink_changes
    from sparkrun import MASTER

    from cdc_devtools.iceberg_java import IcebergJava

    java = IcebergJava(
        wl.CATALOG_NAME,
        bench.work / "catalog.db",
        (bench.work / "warehouse").as_uri(),
        master=MASTER,
        driver_memory=driver_memory,
        conf=sql_conf,
    )
    log(f"peer: Iceberg Java writes {rows:,} rows and the copy-on-write snapshot (MERGE INTO)")
    started = time.perf_counter()
    made = java_source.build(bench.catalog, java, TABLE, rows, appends, bench.work / "java-staging")
    peer: dict[str, Any] = {
        "iceberg": "1.10.2 on Spark 3.5.9",
        "master": MASTER,
        "driver_memory": driver_memory,
        "warm_runs": WARMUP_RUNS + TIMED_RUNS,
        "warmup_runs": WARMUP_RUNS,
        "load_average_at_start": [round(v, 2) for v in os.getloadavg()],
        "java_write_seconds": round(time.perf_counter() - started, 3),
        "workload": wl.describe_workload(made),
        "pipeline": [],
        "peer": [],
        "checks": {},
    }
    if not bench.write_task_size:  # alone: as build_workloads sizes it for the main snapshot
        bench.write_task_size = max(1 << 20, (made.removed_bytes + made.added_bytes) // 8 + 1)
    peer_catalog = bench.work / "peer-catalog.db"
    _copy_catalog(bench.work / "catalog.db", peer_catalog)
    log("peer: a warm Spark Connect server for the pipeline, a warm Iceberg Java session for the peer")
    events = bench.work / "events" / "spark-connect-peer"
    with (
        warm_server(bench.work, "spark-connect-peer", driver_memory, events) as server,
        replace(java, sqlite=peer_catalog).serve(bench.logs / "iceberg-java-peer.log") as session,
    ):
        peer["server_java_options"] = server.java_options  # what the server ran with, not a default
        for index in range(1, WARMUP_RUNS + TIMED_RUNS + 1):
            log(
                f"peer, run {index} of {WARMUP_RUNS + TIMED_RUNS}: pipeline (connect, file://), then create_changelog_view"
            )
            run = bench.pipeline(f"peer-pipeline-{index}", made, "file", connect_url=server.url)
            peer["pipeline"].append(
                {
                    "wall_seconds": run["wall_seconds"],
                    "phase_seconds": run["phase_seconds"],
                    "rows": run["breakdown"]["rows"],
                    # per task: where the write and read phases' seconds go (read ranges' balance too)
                    "tasks": run["breakdown"]["tasks"],
                    "connect": run["breakdown"].get("connect"),
                }
            )
            out = bench.work / f"peer-view-{index}"
            view = f"peer_changes_{index}"
            call = changelog_call(wl.CATALOG_NAME, made.table, made.parent_id, made.snapshot_id, view)
            answer = session.run([{"sql": call}, {"query": f"SELECT * FROM {view}", "out": str(out)}])
            peer["peer"].append(
                {
                    "seconds": round(peer_seconds(answer), 3),
                    "call_seconds": answer[0]["seconds"],
                    "write_seconds": answer[1]["write_seconds"],
                    "rows": answer[1]["rows"],
                }
            )
            ours = sink_changes(bench.catalog, run["sink"], made.snapshot_id, wl.COLUMNS)
            theirs = view_rows(pq.read_table(out), wl.COLUMNS)
            peer["checks"][f"peer_run{index}_vs_pipeline"] = same_rows(ours, theirs)
            del ours, theirs
    peer["load_average_at_end"] = [round(v, 2) for v in os.getloadavg()]
    return peer


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=5_000_000, help="N (default 5 M)")
    parser.add_argument("--appends", type=int, default=5, help="INSERTs that write the N rows")
    args = parser.parse_args()
    import shutil

    from harness import NATIVE_DRIVER_MEMORY, RESULTS, SPARK_SQL_CONF, Bench, log, same_rows

    from cdc_devtools.iceberg_java import missing

    why = missing()
    if why is not None:
        raise SystemExit(f"the peer needs Iceberg Java: {why}")
    work = ROOT / ".cdc" / "bench-peer"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    bench = Bench(work, quick=False)
    peer = run_peer(
        bench,
        args.rows,
        appends=args.appends,
        driver_memory=NATIVE_DRIVER_MEMORY,
        sql_conf=SPARK_SQL_CONF,
        same_rows=same_rows,
        log=log,
    )
    # Only the bench's own size may overwrite the committed figures.
    out_dir = RESULTS if args.rows == 5_000_000 else work / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "peer.json").write_text(json.dumps(peer, indent=2, default=str) + "\n")
    lines = summary_lines(peer)
    (out_dir / "peer.txt").write_text(
        "\n".join(["# python bench/peer.py", *lines]).replace("\n\n", "\n") + "\n"
    )
    print("\n".join(lines))
    print(f"\nresults: {out_dir}/peer.{{json,txt}}")
    if not all(check.get("equal", False) for check in peer["checks"].values()):
        print("peer: CHECK FAILED: the pipeline and create_changelog_view disagree; see peer.json 'checks'")
        sys.exit(1)


if __name__ == "__main__":
    main()

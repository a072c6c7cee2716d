"""Freshness under the scheduler with the event trigger: source commit to sink commit, nobody triggering.

Airflow's API server, scheduler, DAG processor and **triggerer** on 127.0.0.1
(:class:`~cdc_devtools.scheduler.LocalAirflow`, LocalExecutor with 2 slots),
the Spark phases on a local Spark Connect server (``local[2]``), a SQLite
catalog. Two tables in the config (so the catalog poll is shared by two); the
table measured gets ``commits`` one-row copy-on-write updates at random
intervals (uniform in ``gaps`` seconds, seeded); no run is triggered by hand
and the clock (``@daily``) never fires during the bench: every run comes from
the source asset's watcher (:mod:`iceberg_cdc.airflow.triggers.catalog_snapshots`)
or chains from one. Figures:

* **freshness** per source snapshot: from the source snapshot's commit
  (``timestamp-ms``) to the sink commit holding its changes (the sink
  snapshot's ``timestamp-ms``), p50 and p95;
* **the poll's cost**: catalog calls per minute per table, as the triggerer's
  shared poll reports them (one SQL query per poll for every table of the
  catalog).

Run alone (about 8 minutes)::

    .venv/bin/python bench/freshness.py

ends with ``freshness: p50 X s, p95 Y s (...)`` and ``poll: ... calls per minute per table``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import re
import statistics
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

import yaml  # noqa: E402
from percentiles import nearest_rank  # noqa: E402

from cdc_devtools.airflow_env import airflow_env  # noqa: E402
from iceberg_cdc.sink.table import find_commit, read_watermark  # noqa: E402

_POLL_LINE = re.compile(r"calls in (\d+) s for (\d+) table\(s\): ([\d.]+) calls per minute per table")


def wait_caught_up(catalog, source: str, sink: str, airflow, dag_id: str, timeout: float) -> None:
    """Until the sink's watermark is the source's current snapshot; a failed run or the timeout raises."""
    deadline = time.monotonic() + timeout
    while True:
        airflow.check_running()
        target = catalog.load_table(source).current_snapshot().snapshot_id
        mark = read_watermark(catalog.load_table(sink), source) if catalog.table_exists(sink) else None
        if mark is not None and mark.snapshot_id == target:
            return
        failed = [r["dag_run_id"] for r in airflow.runs(dag_id) if r["state"] == "failed"]
        if failed:
            raise RuntimeError(f"runs of {dag_id} failed: {failed}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{source} not caught up in {timeout:.0f} s")
        time.sleep(0.5)


def _poll_reports(log_dir: Path) -> list[dict[str, float]]:
    """The shared poll's cost lines, from every log the Airflow components wrote."""
    found = []
    for path in log_dir.rglob("*"):
        if path.is_file():
            with contextlib.suppress(OSError):
                for match in _POLL_LINE.finditer(path.read_text(errors="replace")):
                    found.append(
                        {"seconds": float(match[1]), "tables": float(match[2]), "per_table": float(match[3])}
                    )
    return found


def freshness_figures(
    work: Path,
    s3,
    logs: Path,
    *,
    commits: int = 10,
    rows: int = 10_000,
    poll_interval: float = 5.0,
    gaps: tuple[float, float] = (5.0, 45.0),
    seed: int = 21,
) -> dict[str, Any]:
    import workload as wl
    from latency import _one_row_update

    from cdc_devtools.connect_server import LocalSparkConnectServer
    from cdc_devtools.scheduler import LocalAirflow

    catalog = wl.open_catalog(work)
    with contextlib.suppress(Exception):
        s3.client().create_bucket(Bucket="freshness-shuffle")
    measured = wl.build_one_row_update(catalog, "fresh", rows)
    idle = wl.build_one_row_update(catalog, "fresh_idle", 100)
    tables = []
    for workload in (measured, idle):
        sink = f"{workload.table}_changes"
        wl.start_sink_at_parent(catalog, workload, sink)
        tables.append({"source": workload.table, "sink": sink, "schedule": "@daily"})
    raw = {
        "catalog": wl.catalog_properties(work),
        "shuffle": {"uri": "s3://freshness-shuffle/events", "partitions": 64, **s3.properties},
        "spark": {"parallel_jobs": 1, "mode": "connect"},
        "tables": tables,
        "events": {"poll_interval": poll_interval},
    }
    path = work / "freshness.yaml"
    path.write_text(yaml.safe_dump(raw))
    dag_id = "cdc__" + measured.table.replace(".", "__")
    idle_dag = "cdc__" + idle.table.replace(".", "__")
    sink = f"{measured.table}_changes"
    rng = random.Random(seed)
    results: dict[str, Any] = {
        "commits": commits,
        "rows": rows,
        "poll_interval": poll_interval,
        "gaps": list(gaps),
        "seed": seed,
        "snapshots": [],
    }
    logs.mkdir(parents=True, exist_ok=True)
    component_logs = logs / "airflow-freshness"
    with LocalSparkConnectServer(work / "spark-connect-freshness", master="local[2]") as server:
        env = airflow_env(work / "airflow-freshness", path, spark_master="local[2]", connect_url=server.url)
        # Airflow with docs/operating.md's small-snapshot settings, as bench/latency.py runs it.
        with LocalAirflow(env, component_logs, parallelism=2, triggerer=True, low_latency=True) as airflow:
            for dag in (dag_id, idle_dag):
                airflow.wait_for_dag(dag)
                airflow.unpause(dag)  # the first poll reports each table's current snapshot
            for source, dag in ((measured.table, dag_id), (idle.table, idle_dag)):
                wait_caught_up(catalog, source, f"{source}_changes", airflow, dag, timeout=600)
            airflow.wait_until_idle(dag_id, timeout=600)
            before = {r["dag_run_id"] for r in airflow.runs(dag_id)}
            table = catalog.load_table(measured.table)
            started = time.time()
            for index in range(commits):
                time.sleep(rng.uniform(*gaps))
                snapshot_id = _one_row_update(table, 1 + index, f"fresh{index}")
                results["snapshots"].append({"snapshot_id": str(snapshot_id)})
            wait_caught_up(catalog, measured.table, sink, airflow, dag_id, timeout=900)
            runs = [r for r in airflow.wait_until_idle(dag_id, timeout=900) if r["dag_run_id"] not in before]
            results["seconds"] = round(time.time() - started, 1)
            results["runs"] = {
                "total": len(runs),
                "by_type": {t: sum(r["run_type"] == t for r in runs) for t in {r["run_type"] for r in runs}},
                "failed": [r["dag_run_id"] for r in runs if r["state"] != "success"],
            }
            time.sleep(max(0.0, 65 - (time.time() - started)))  # at least one poll report (every 60 s)
    source_table = catalog.load_table(measured.table)
    sink_table = catalog.load_table(sink)
    for entry in results["snapshots"]:
        snapshot_id = int(entry["snapshot_id"])
        committed = find_commit(sink_table, measured.table, snapshot_id)
        if committed is None:
            raise RuntimeError(f"snapshot {snapshot_id} is not in {sink}")
        made = source_table.metadata.snapshot_by_id(snapshot_id).timestamp_ms
        entry["freshness_seconds"] = round((committed.timestamp_ms - made) / 1000, 2)
    seconds = [e["freshness_seconds"] for e in results["snapshots"]]
    results["p50"] = nearest_rank(seconds, 0.50)
    results["p95"] = nearest_rank(seconds, 0.95)
    results["mean"] = round(statistics.fmean(seconds), 2)
    reports = _poll_reports(component_logs) + _poll_reports(work / "airflow-freshness" / "logs")
    results["poll_reports"] = reports
    results["calls_per_minute_per_table"] = (
        round(statistics.fmean(r["per_table"] for r in reports), 2) if reports else None
    )
    results["tables_polled"] = len(tables)
    return results


def freshness_lines(results: dict[str, Any]) -> list[str]:
    """``freshness: p50 X s, p95 Y s`` and the poll's cost."""
    from cdc_devtools.scheduler import low_latency_label

    runs = results["runs"]
    kinds = ", ".join(f"{count} {kind}" for kind, count in sorted(runs["by_type"].items()))
    lines = [
        f"freshness: p50 {results['p50']:.1f} s, p95 {results['p95']:.1f} s (source commit to sink commit, "
        f"{results['commits']} one-row commits {results['gaps'][0]:.0f}-{results['gaps'][1]:.0f} s apart, event "
        f"trigger polling every {results['poll_interval']:.0f} s, no manual trigger, {low_latency_label()}; "
        f"{runs['total']} runs: {kinds})"
    ]
    per_table = results["calls_per_minute_per_table"]
    if per_table is not None:
        lines.append(
            f"poll: {per_table:.1f} catalog calls per minute per table (one SQL query per poll shared by "
            f"{results['tables_polled']} tables, every {results['poll_interval']:.0f} s; measured by the triggerer)"
        )
    else:
        lines.append("poll: no cost report found in the triggerer's logs")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=ROOT / ".cdc" / "bench-freshness")
    parser.add_argument("--commits", type=int, default=10)
    parser.add_argument("--poll-interval", type=float, default=5.0)
    args = parser.parse_args()
    import shutil

    from cdc_devtools.local_s3 import LocalS3Server

    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    with LocalS3Server() as s3:
        results = freshness_figures(
            args.work, s3, args.work / "logs", commits=args.commits, poll_interval=args.poll_interval
        )
    out = ROOT / "bench" / "results"
    (out / "freshness.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = freshness_lines(results)
    (out / "freshness.txt").write_text("\n".join(["# python bench/freshness.py", *lines]) + "\n")
    print("\n".join(lines))
    return 0 if not results["runs"]["failed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Small-snapshot latency: one real ``airflow dags test`` DAG run after a one-row update.

The run is the DAG as deployed (Airflow task runners, mapped Spark tasks on
``local[2]``, shuffle on the local S3 server), so its time is what a user
waits for a one-row change to reach the sink. Where the seconds go comes
from Airflow's own metadata database (each task instance's start and end)
and from the sink commit's ``cdc.seconds.*`` figures (the work inside the
Spark jobs).

Both Spark modes, side by side (:func:`compare_modes`): ``submit`` (one
``spark-submit`` per phase group) and ``connect`` (the phases on a local
Spark Connect server, ``local[2]``, started once before the runs; its start
is reported apart, as a deployment pays it once). Run alone::

    .venv/bin/python bench/latency.py            # about 2-3 minutes

ends with ``latency: one-row snapshot submit X s, connect Y s (...)``, the
scheduler's ``latency: ... under the scheduler`` and ``backlog:`` lines, and
where a one-row run's seconds go, per task (:mod:`runcost`: start-up, Spark /
Connect overhead, work) for the warm ``dags test`` run and the last run under
the scheduler; all of it also in ``bench/results/latency.{txt,json}``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

import yaml  # noqa: E402
from runcost import dags_test_breakdown, scheduler_breakdown, table_lines  # noqa: E402

from cdc_devtools.airflow_env import VENV_BIN, airflow_env, dags_test, ensure_airflow_db  # noqa: E402
from iceberg_cdc.sink.table import read_watermark  # noqa: E402


def _task_instances(db: Path, dag_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    with sqlite3.connect(db) as connection:
        run = connection.execute(
            "select run_id, start_date, end_date, state from dag_run where dag_id = ? "
            "order by start_date desc limit 1",
            (dag_id,),
        ).fetchone()
        rows = connection.execute(
            "select task_id, map_index, state, start_date, end_date, duration from task_instance "
            "where dag_id = ? and run_id = ? order by start_date",
            (dag_id, run[0]),
        ).fetchall()
    tasks = [
        {"task": t if m < 0 else f"{t}[{m}]", "state": s, "start": b, "end": e, "seconds": d}
        for t, m, s, b, e, d in rows
    ]
    return {"run_id": run[0], "start": run[1], "end": run[2], "state": run[3]}, tasks


def _is_spark_task(task: str) -> bool:
    return task.startswith(("shuffle_write", "shuffle_read", "changelog_insert"))


def _epoch(stamp: str) -> float:
    """Airflow's metadata database keeps UTC times without a zone."""
    moment = datetime.fromisoformat(stamp)
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def process_start_seconds(env: dict[str, str]) -> float:
    """How long the ``airflow`` command takes to start and exit doing nothing much (``version``)."""
    started = time.perf_counter()
    subprocess.run([str(VENV_BIN / "airflow"), "version"], env=env, capture_output=True, check=True)
    return round(time.perf_counter() - started, 3)


def one_row_latency(
    home: Path, config_path: Path, dag_id: str, log_path: Path, *, connect_url: str | None = None
) -> dict[str, Any]:
    """Run the DAG once; its wall time and where the seconds went (``connect_url``: the Connect server)."""
    env = airflow_env(home, config_path, spark_master="local[2]", connect_url=connect_url)
    setup_started = time.perf_counter()
    ensure_airflow_db(env)
    setup_seconds = time.perf_counter() - setup_started
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.time()
    with open(log_path, "w") as log:
        code = dags_test(env, dag_id, {"trigger_next": False}, log)
    finished = time.time()
    if code != 0:
        raise RuntimeError(f"airflow dags test {dag_id} exited with {code}; see {log_path}")
    run, tasks = _task_instances(home / "airflow.db", dag_id)
    first = min(_epoch(t["start"]) for t in tasks if t["start"])
    last = max(_epoch(t["end"]) for t in tasks if t["end"])
    timed = [t for t in tasks if t["seconds"]]
    return {
        "wall_seconds": round(finished - started, 3),
        "db_setup_seconds": round(setup_seconds, 3),
        "dag_run": run,
        # Before the first task: the airflow CLI starting, parsing the DAG folder, creating the run.
        "startup_seconds": round(first - started, 3),
        "first_task_to_last_task_seconds": round(last - first, 3),
        "after_last_task_seconds": round(finished - last, 3),
        "tasks": [{k: t[k] for k in ("task", "state", "seconds")} for t in timed],
        "spark_task_seconds": round(sum(t["seconds"] for t in timed if _is_spark_task(t["task"])), 3),
        "other_task_seconds": round(sum(t["seconds"] for t in timed if not _is_spark_task(t["task"])), 3),
        "airflow_cli_start_seconds": process_start_seconds(env),
        "log": str(log_path),
        # Per task: start-up, Spark/Connect overhead, work (bench/runcost.py).
        "runcost": dags_test_breakdown(home, dag_id, log_path),
    }


# --- both modes, side by side --------------------------------------------------------------------


def mode_config(work: Path, table: str, sink: str, s3_properties: dict[str, str], mode: str) -> Path:
    """The bench catalog, the shuffle on the local S3 server, and ``spark.mode``."""
    import workload as wl

    raw = {
        "catalog": wl.catalog_properties(work),
        "shuffle": {"uri": f"s3://latency-shuffle/{mode}", "partitions": 64, **s3_properties},
        "spark": {"parallel_jobs": 1, "mode": mode},
        "tables": [{"source": table, "sink": sink}],
    }
    path = work / f"latency-{mode}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def compare_modes(
    work: Path,
    s3,
    logs: Path,
    *,
    rows: int = 10_000,
    submit_runs: int = 1,
    connect_runs: int = 2,
    home: Path | None = None,
) -> dict[str, Any]:
    """One-row update latency in submit mode, then in connect mode, in this one invocation.

    Each run has its own table (``rows`` rows, one copy-on-write snapshot
    updating one row) so every run processes exactly one snapshot. The
    Connect server starts once, before its runs: the first run after the start
    also pays the server's first Python workers; later runs show the steady state.
    """
    import workload as wl

    from cdc_devtools.connect_server import LocalSparkConnectServer

    catalog = wl.open_catalog(work)
    with contextlib.suppress(Exception):  # already there when called twice on one server
        s3.client().create_bucket(Bucket="latency-shuffle")
    home = home or work / "airflow"
    results: dict[str, Any] = {"rows": rows, "submit": [], "connect": []}

    def one(mode: str, index: int, connect_url: str | None) -> dict[str, Any]:
        name = f"tiny_{mode}_{index}"
        workload = wl.build_one_row_update(catalog, name, rows)
        sink = f"{workload.table}_changes"
        wl.start_sink_at_parent(catalog, workload, sink)
        path = mode_config(work, workload.table, sink, dict(s3.properties), mode)
        dag_id = "cdc__" + workload.table.replace(".", "__")
        run = one_row_latency(home, path, dag_id, logs / f"latency-{name}.log", connect_url=connect_url)
        summary = _sink_summary(catalog, sink, workload.snapshot_id)
        run["changes"] = _change_counts(catalog, sink, workload.snapshot_id)
        run["commit_summary_seconds"] = dict(summary.seconds)
        return run

    for index in range(submit_runs):
        results["submit"].append(one("submit", index, None))
    started = time.perf_counter()
    with LocalSparkConnectServer(work / "spark-connect", master="local[2]") as server:
        results["connect_server_start_seconds"] = round(time.perf_counter() - started, 3)
        for index in range(connect_runs):
            results["connect"].append(one("connect", index, server.url))
    return results


def _change_counts(catalog, sink: str, snapshot_id: int) -> dict[str, int]:
    from collections import Counter

    from pyiceberg.expressions import EqualTo

    rows = catalog.load_table(sink).scan(row_filter=EqualTo("_commit_snapshot_id", snapshot_id)).to_arrow()
    return dict(Counter(rows.column("_change_type").to_pylist()))


def _sink_summary(catalog, sink: str, snapshot_id: int):
    """The pipeline's record of its commit of ``snapshot_id`` (empty when there is none)."""
    from iceberg_cdc.sink.summary import CommitSummary

    for snapshot in catalog.load_table(sink).snapshots():
        record = CommitSummary.from_summary(
            snapshot.summary.additional_properties if snapshot.summary else {}
        )
        if record.source_snapshot_id == snapshot_id:
            return record
    return CommitSummary()


def summary_lines(results: dict[str, Any]) -> list[str]:
    """Human lines, ending with the ``latency:`` line."""
    lines = []
    for mode in ("submit", "connect"):
        for index, run in enumerate(results[mode]):
            label = mode if mode == "submit" else f"connect run {index + 1}"
            lines.append(
                f"{label:>14}: {run['wall_seconds']:.1f} s wall, changes {run['changes']} (before the first task {run['startup_seconds']:.1f} s, "
                f"tasks {run['first_task_to_last_task_seconds']:.1f} s, after {run['after_last_task_seconds']:.1f} s); "
                + ", ".join(f"{t['task']} {t['seconds']:.1f}" for t in run["tasks"])
            )
    lines.append(latency_line(results["submit"][0]["wall_seconds"], results))
    return lines


def runcost_lines(results: dict[str, Any]) -> list[str]:
    """The per-task tables: the warm connect run of ``airflow dags test``, the last run under the scheduler."""
    lines: list[str] = []
    if results.get("connect"):
        lines += table_lines(
            results["connect"][-1]["runcost"], "one-row snapshot, airflow dags test (connect, warm)"
        )
    scheduler = results.get("scheduler")
    if scheduler and scheduler.get("latency"):
        lines += table_lines(
            scheduler["latency"][-1]["runcost"], "one-row snapshot under the scheduler (connect)"
        )
    return lines


def latency_line(submit_seconds: float, connect: dict[str, Any]) -> str:
    """``latency: one-row snapshot X s (submit), Y s (connect, ...)``."""
    runs = connect["connect"]
    return (
        f"latency: one-row snapshot {submit_seconds:.1f} s (submit), {runs[-1]['wall_seconds']:.1f} s (connect, "
        f"warm server; first run after the server's start {runs[0]['wall_seconds']:.1f} s; server start "
        f"{connect['connect_server_start_seconds']:.1f} s)"
    )


# --- under the scheduler ---------------------------------------------------------------------------


def _stamp(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _one_row_update(table, row_id: int, status: str) -> int:
    """A copy-on-write snapshot that changes one row's status."""
    import pyarrow as pa

    from cdc_devtools.cow import cow_merge

    row = table.scan(row_filter=f"id == {row_id}").to_arrow()
    field = row.schema.get_field_index("status")
    updated = row.set_column(field, "status", pa.array([status] * row.num_rows, row.schema.field(field).type))
    snapshot_id = cow_merge(table, upserts=updated)
    if snapshot_id is None:
        raise RuntimeError(f"the update of row {row_id} of {table.name()} changed nothing")
    return snapshot_id


def scheduler_figures(
    work: Path,
    s3,
    logs: Path,
    *,
    rows: int = 10_000,
    backlog: int = 30,
    latency_runs: int = 2,
    parallelism: int = 2,
    low_latency: bool = True,
    in_process_below: str | None = None,
) -> dict[str, Any]:
    """One-row latency and a backlog's catch-up under Airflow's scheduler, in connect mode.

    Airflow's API server, scheduler and DAG processor run on 127.0.0.1 with a
    LocalExecutor of ``parallelism`` slots (:class:`~cdc_devtools.scheduler.LocalAirflow`),
    the Spark phases on a local Spark Connect server (``local[2]``), both
    started before the clock runs. Two tables, their DAGs unscheduled (runs
    come from triggers only):

    * **latency**: a one-row copy-on-write update, then a run triggered over
      the REST API (``trigger_next`` off); seconds from the trigger request to
      the run's end as Airflow records it (and to the end of its commit task,
      when the change is in the sink). ``latency_runs`` times, on a new
      one-row update each: the first run after the start pays cold caches;
    * **backlog**: ``backlog`` one-row updates pending; one run is triggered,
      and each run triggers the next while more are pending (chained runs);
      seconds from the trigger to the end of the last run.

    ``low_latency``: Airflow with the small-snapshot settings of
    docs/operating.md (:data:`cdc_devtools.scheduler.LOW_LATENCY`); off: Airflow's defaults.
    ``in_process_below``: the config's ``spark.in_process_below`` (default: the product's; ``0``: every
    group on Spark, as before small groups ran in the task's process).
    """
    import workload as wl

    from cdc_devtools.connect_server import LocalSparkConnectServer
    from cdc_devtools.scheduler import LocalAirflow

    catalog = wl.open_catalog(work)
    with contextlib.suppress(Exception):  # already there when called twice on one server
        s3.client().create_bucket(Bucket="latency-shuffle")
    tiny = wl.build_one_row_update(catalog, "sched_tiny", rows)
    chain = wl.build_one_row_update(catalog, "sched_backlog", rows)
    chain_table = catalog.load_table(chain.table)
    for index in range(1, backlog):
        _one_row_update(chain_table, index, f"v{index}")
    tables = []
    for workload in (tiny, chain):
        sink = f"{workload.table}_changes"
        wl.start_sink_at_parent(catalog, workload, sink)
        tables.append({"source": workload.table, "sink": sink, "schedule": None})
    raw = {
        "catalog": wl.catalog_properties(work),
        "shuffle": {"uri": "s3://latency-shuffle/scheduler", "partitions": 64, **s3.properties},
        "spark": {
            "parallel_jobs": 1,
            "mode": "connect",
            **({} if in_process_below is None else {"in_process_below": in_process_below}),
        },
        "tables": tables,
        # Runs come from the REST trigger and chaining only (bench/freshness.py measures event runs).
        "events": {"enabled": False},
    }
    path = work / "latency-scheduler.yaml"
    path.write_text(yaml.safe_dump(raw))
    tiny_dag, chain_dag = ("cdc__" + w.table.replace(".", "__") for w in (tiny, chain))
    results: dict[str, Any] = {
        "rows": rows,
        "backlog": backlog,
        "parallelism": parallelism,
        "low_latency": low_latency,
        "in_process_below": in_process_below,
        "latency": [],
    }
    logs.mkdir(parents=True, exist_ok=True)
    with LocalSparkConnectServer(work / "spark-connect-scheduler", master="local[2]") as server:
        env = airflow_env(work / "airflow-scheduler", path, spark_master="local[2]", connect_url=server.url)
        started = time.perf_counter()
        with LocalAirflow(
            env, logs / "airflow-scheduler", parallelism=parallelism, low_latency=low_latency
        ) as airflow:
            for dag_id in (tiny_dag, chain_dag):
                airflow.wait_for_dag(dag_id)
                airflow.unpause(dag_id)  # no schedule: nothing runs until triggered
            results["airflow_start_seconds"] = round(time.perf_counter() - started, 3)
            source = catalog.load_table(tiny.table)
            for index in range(latency_runs):
                if index:
                    _one_row_update(source, index, f"again{index}")
                triggered_at = time.time()
                run = airflow.trigger(tiny_dag, {"trigger_next": False})
                done = airflow.wait_for_runs(tiny_dag, [run["dag_run_id"]], timeout=900, poll=0.2)
                final = next(r for r in done if r["dag_run_id"] == run["dag_run_id"])
                if final["state"] != "success":
                    raise RuntimeError(f"run {run['dag_run_id']} of {tiny_dag} {final['state']}; see {logs}")
                tasks = airflow.task_instances(tiny_dag, run["dag_run_id"])
                commit = next(t for t in tasks if t["task_id"] == "commit")
                results["latency"].append(
                    {
                        "run_id": run["dag_run_id"],
                        "runcost": scheduler_breakdown(
                            Path(env["AIRFLOW_HOME"]), tiny_dag, run["dag_run_id"]
                        ),
                        "seconds": round(_stamp(final["end_date"]) - triggered_at, 3),
                        # When the change is in the sink: the run's last tasks come after it.
                        "to_commit_seconds": round(_stamp(commit["end_date"]) - triggered_at, 3),
                        "queued_to_start_seconds": round(
                            _stamp(final["start_date"]) - _stamp(final["queued_at"]), 3
                        ),
                        "tasks": [
                            {"task": t["task_id"], "state": t["state"], "seconds": t["duration"]}
                            for t in tasks
                            if t["duration"]
                        ],
                    }
                )
            triggered_at = time.time()
            airflow.trigger(chain_dag)
            runs = airflow.wait_until_idle(chain_dag, timeout=3600)
            failed = [r["dag_run_id"] for r in runs if r["state"] != "success"]
            mark = read_watermark(catalog.load_table(f"{chain.table}_changes"), chain.table)
            current = catalog.load_table(chain.table).current_snapshot().snapshot_id
            if failed or mark is None or mark.snapshot_id != current:
                raise RuntimeError(f"the backlog did not catch up (failed runs {failed}); see {logs}")
            results["backlog_run"] = {
                "seconds": round(max(_stamp(r["end_date"]) for r in runs) - triggered_at, 3),
                "runs": len(runs),
                "chained_runs": sum(r["dag_run_id"].startswith("chained__") for r in runs),
            }
    return results


def scheduler_lines(results: dict[str, Any]) -> list[str]:
    """``latency: ... under the scheduler X s (connect)`` and ``backlog: ... caught up in X s``."""
    runs = results["latency"]
    backlog = results["backlog_run"]
    first = f"; first run after the start {runs[0]['seconds']:.1f} s" if len(runs) > 1 else ""
    from cdc_devtools.scheduler import low_latency_label

    settings = low_latency_label() if results.get("low_latency", True) else "Airflow's default settings"
    return [
        f"latency: one-row snapshot under the scheduler {runs[-1]['seconds']:.1f} s (connect, trigger to "
        f"success; in the sink after {runs[-1]['to_commit_seconds']:.1f} s; LocalExecutor "
        f"{results['parallelism']} slots, {settings}{first})",
        f"backlog: {results['backlog']} one-row snapshots caught up in {backlog['seconds']:.1f} s (connect, "
        f"chained runs: {backlog['runs']} runs, {backlog['seconds'] / max(1, backlog['runs']):.1f} s per snapshot)",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--connect-runs", type=int, default=2)
    parser.add_argument(
        "--scheduler-only",
        action="store_true",
        help="only the figures under Airflow's scheduler (one-row latency, a backlog of chained runs)",
    )
    parser.add_argument("--backlog", type=int, default=30, help="one-row snapshots in the backlog")
    parser.add_argument(
        "--in-process-below",
        default=None,
        help="spark.in_process_below for the tables (default: the product's; 0: every phase group on Spark)",
    )
    parser.add_argument(
        "--airflow-defaults",
        action="store_true",
        help="run Airflow with its default settings, not docs/operating.md's small-snapshot settings",
    )
    args = parser.parse_args()
    from cdc_devtools.local_s3 import LocalS3Server

    work = ROOT / ".cdc" / "latency"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    with LocalS3Server(log_path=work / "s3.log") as s3:
        if args.scheduler_only:
            results = {}
        else:
            results = compare_modes(work, s3, work / "logs", rows=args.rows, connect_runs=args.connect_runs)
        results["scheduler"] = scheduler_figures(
            work,
            s3,
            work / "logs",
            rows=args.rows,
            backlog=args.backlog,
            low_latency=not args.airflow_defaults,
            in_process_below=args.in_process_below,
        )
    (work / "latency.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    lines = [
        *([] if args.scheduler_only else summary_lines(results)),
        *scheduler_lines(results["scheduler"]),
        *runcost_lines(results),
    ]
    out = ROOT / "bench" / "results"
    (out / "latency.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    command = " ".join(["python bench/latency.py", *sys.argv[1:]])
    (out / "latency.txt").write_text("\n".join([f"# {command}", *lines]) + "\n")
    print("\n".join(lines))
    print(f"details: {work / 'latency.json'}; results: {out / 'latency.txt'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Small-snapshot latency: one real ``airflow dags test`` DAG run after a one-row update.

The run is the DAG as deployed (Airflow task runners, mapped
SparkSubmitOperator tasks on ``local[2]``, shuffle on the local S3 server),
so its time is what a user waits for a one-row change to reach the sink.
Where the seconds go comes from Airflow's own metadata database (each task
instance's start and end) and from the sink commit's ``cdc.seconds.*``
figures (the work inside the Spark applications).
"""

from __future__ import annotations

import sqlite3
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from iceberg_cdc.devtools.airflow_env import VENV_BIN, airflow_env, dags_test, ensure_airflow_db


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


def _epoch(stamp: str) -> float:
    """Airflow's metadata database keeps UTC times without a zone."""
    moment = datetime.fromisoformat(stamp)
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def process_start_seconds(env: dict[str, str]) -> float:
    """How long the ``airflow`` command takes to start and exit doing nothing much (``version``)."""
    started = time.perf_counter()
    subprocess.run([str(VENV_BIN / "airflow"), "version"], env=env, capture_output=True, check=True)
    return round(time.perf_counter() - started, 3)


def one_row_latency(home: Path, config_path: Path, dag_id: str, log_path: Path) -> dict[str, Any]:
    """Run the DAG once; its wall time and where the seconds went."""
    env = airflow_env(home, config_path, spark_master="local[2]")
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
        "spark_task_seconds": round(sum(t["seconds"] for t in timed if t["task"].startswith("shuffle_")), 3),
        "other_task_seconds": round(
            sum(t["seconds"] for t in timed if not t["task"].startswith("shuffle_")), 3
        ),
        "airflow_cli_start_seconds": process_start_seconds(env),
        "log": str(log_path),
    }

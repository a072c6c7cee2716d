"""``make stack`` for real: the demo table caught up by Celery workers on hosts of their own, then stopped.

``scripts/stack.py`` (what ``make stack`` runs) starts in a folder of the
test's; the test waits for its ``stack.json``, unpauses the demo table's DAG
over the REST API (the stack does too; either is enough), and waits until the
sink's watermark is the source's current snapshot and every run of the DAG
is final. Then:

* every run succeeded, and every task that ran was executed by a Celery
  worker host (``hostname`` 127.0.0.2 or 127.0.0.3, queue ``default``), both
  of them, each writing its task logs on its own disk -- the control host
  wrote none;
* the changelog, replayed from nothing, is the source's current rows;
* ``make stack-stop`` (``--stop``) ends the stack's process and leaves none of
  the processes it had started (pids and start times from ``pids.json``).

Several minutes (the stack's start, then five snapshots through the
scheduler): ``make test-stack`` runs it; ``make test`` deselects the ``stack``
marker.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cdc_devtools.airflow_api import AirflowApi
from cdc_devtools.airflow_env import REPO
from cdc_devtools.children import die_with_parent
from cdc_devtools.process_tree import alive
from cdc_devtools.replay import assert_changelog_replays
from cdc_devtools.stack import missing_packages
from cdc_devtools.stack_hosts import WORKER_ADDRESSES
from cdc_devtools.sync import table_status
from iceberg_cdc.config import load_config
from iceberg_cdc.pipeline.runtime import load_catalog_from_config

pytestmark = [
    pytest.mark.stack,
    pytest.mark.e2e,
    pytest.mark.skipif(bool(missing_packages()), reason="; ".join(missing_packages())),
]

SCRIPT = REPO / "scripts" / "stack.py"
DAG = "cdc__shop__orders"
START_SECONDS = 300
CATCH_UP_SECONDS = 1200


def _wait_for_state(root: Path, process: subprocess.Popen, log: Path) -> dict:
    deadline = time.monotonic() + START_SECONDS
    while not (root / "stack.json").exists():
        if process.poll() is not None:
            pytest.fail(f"make stack exited with {process.returncode}:\n{log.read_text()[-4000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"make stack not healthy in {START_SECONDS} s:\n{log.read_text()[-4000:]}")
        time.sleep(1)
    return json.loads((root / "stack.json").read_text())


def _caught_up(api: AirflowApi, config_path: str) -> list[dict]:
    """Until the sink's watermark is the source's current snapshot and no run of the DAG is open."""
    config = load_config(config_path)
    deadline = time.monotonic() + CATCH_UP_SECONDS
    while True:
        runs = api.runs(DAG)
        if table_status(config, config.tables[0])[1] == 0 and all(
            r["state"] in ("success", "failed") for r in runs
        ):
            return runs
        if time.monotonic() > deadline:
            pytest.fail(
                f"not caught up in {CATCH_UP_SECONDS} s: {[(r['dag_run_id'], r['state']) for r in runs]}"
            )
        time.sleep(5)


def _stopped(pids: dict[str, list]) -> list[str]:
    """The recorded processes still alive as the same process (pid and start time)."""
    from cdc_devtools.stack import _start_time

    return [
        f"{name} ({pid})" for name, (pid, start) in pids.items() if alive(pid) and _start_time(pid) == start
    ]


@pytest.mark.timeout(START_SECONDS + CATCH_UP_SECONDS + 300)
def test_the_stack_runs_the_demo_table_on_celery_workers_and_stops_clean(tmp_path: Path) -> None:
    root, log = tmp_path / "stack", tmp_path / "make-stack.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, str(SCRIPT), "--dir", str(root)],
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent(),
        )
    started = time.monotonic()
    pids: dict[str, list] = {}
    try:
        state = _wait_for_state(root, process, log)
        up = time.monotonic() - started
        pids = json.loads((root / "pids.json").read_text())
        api = AirflowApi(state["airflow_url"], state["login"]["user"], state["login"]["password"])
        api.wait_for_dag(DAG)
        api.unpause(DAG)
        runs = _caught_up(api, state["config"])
        print(f"stack healthy after {up:.0f} s; caught up after {time.monotonic() - started:.0f} s")
        assert runs and all(r["state"] == "success" for r in runs), [
            (r["dag_run_id"], r["state"]) for r in runs
        ]

        # (a) Celery workers ran every task, both of them, each on its own disk.
        ran = [
            ti
            for run in runs
            for ti in api.task_instances(DAG, run["dag_run_id"])
            if ti["state"] == "success"
        ]
        assert {ti["hostname"] for ti in ran} == set(WORKER_ADDRESSES), {ti["hostname"] for ti in ran}
        assert {ti["queue"] for ti in ran} == {"default"}
        for name, host in state["hosts"].items():
            task_logs = list(Path(host["task_logs"]).glob(f"dag_id={DAG}/**/*.log"))
            assert bool(task_logs) == (name != "control"), (name, task_logs)

        # (b) The changelog replays to the source's current rows.
        catalog = load_catalog_from_config(load_config(state["config"]))
        table = load_config(state["config"]).tables[0]
        # Four ordinals for five snapshots: the last rewrites 300 rows without changing one.
        replayed = assert_changelog_replays(catalog.load_table(table.source), catalog.load_table(table.sink))
        assert replayed == 4, replayed
    finally:
        # (c) make stack-stop: the stack's process ends, and nothing it started is left.
        stop = subprocess.run(
            [sys.executable, str(SCRIPT), "--stop", "--dir", str(root)],
            capture_output=True,
            text=True,
            timeout=180,
        )
        process.wait(timeout=120)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert process.returncode == 0, log.read_text()[-4000:]
    assert pids and not _stopped(pids), _stopped(pids)
    assert not [name for name in ("stack.pid", "pids.json", "stack.json") if (root / name).exists()]

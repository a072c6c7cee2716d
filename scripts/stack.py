"""make stack: the production topology on this machine (cdc_devtools/stack.py), until Ctrl-C or make stack-stop.

Starts PostgreSQL (Airflow's metadata and the Iceberg catalog), Redis (the
Celery broker), the local S3 server, a Spark standalone cluster with a Spark
Connect server on it, and Airflow with CeleryExecutor: API server, scheduler,
DAG processor and triggerer on a control host, and two Celery workers, each
on a host of its own (its own folder, HOME, TMPDIR, copies of the DAG file
and the config, and loopback address). Then it seeds make demo's table
``shop.orders`` (five snapshots, with make demo's two mirrors) in the
PostgreSQL catalog, prints the URLs, the login and where each log is, and
unpauses the table's DAG and its mirrors' once parsed: the runs start right
away, executed by the Celery workers, their Spark jobs on the cluster.

Everything lives in ``.cdc/stack/`` (``--dir``), rebuilt on every start;
``stack.json`` there says where everything is once the stack is healthy.
Ctrl-C, SIGTERM or ``make stack-stop`` (``--stop``) stop everything it
started; ``--stop`` also kills, by the pids recorded in ``pids.json``,
whatever a stack whose process died left behind. A second ``make stack``
while one runs is refused.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any

from airflow_ui import unpause_when_parsed
from demo import demo_mirrors, start_demo

from cdc_devtools.children import StopSignals
from cdc_devtools.local_postgres import LocalPostgres
from cdc_devtools.local_s3 import LocalS3Server
from cdc_devtools.pidfile import AlreadyRunning, pid_file, stop_running
from cdc_devtools.stack import STACK_DIR, Stack, clear, sweep
from iceberg_cdc.config import load_config

MARKER = Path(__file__).name  # in the command line of a running make stack
STOP = StopSignals("make stack")


def seed(s3: LocalS3Server, folder: Path, catalog_uri: str, spark: dict[str, Any], pg: LocalPostgres) -> Path:
    """make demo's table and mirrors, in the stack's catalog, its Spark section pointing at the cluster."""
    folder.mkdir(parents=True, exist_ok=True)
    config_path, _, _ = start_demo(s3, folder, mirrors=demo_mirrors(pg), catalog_uri=catalog_uri, spark=spark)
    return config_path


def dag_ids(config_path: str) -> tuple[list[str], list[str]]:
    """The tables' DAGs, and their mirrors'."""
    config = load_config(config_path)
    tables = [table.dag_id for table in config.tables]
    return tables, [table.mirror_dag_id(m) for table in config.tables for m in table.mirrors]


def banner(state: dict[str, Any], root: Path) -> str:
    """Where everything is: URLs, login, the hosts and each log."""
    login = state["login"]
    hosts = "\n".join(
        f"    {name:<9} {host['address']:<10} {host['root']}  (task logs: {host['task_logs']})"
        for name, host in state["hosts"].items()
    )
    logs = "\n".join(f"    {name:<26} {path}" for name, path in state["logs"].items())
    return (
        f"\n  make stack is up ({state['seconds_to_healthy']} s to healthy)\n"
        f"  Airflow UI:      {state['airflow_url']}  (CDC view: {state['airflow_url']}/plugin/cdc)\n"
        f"  Login:           {login['user']} / {login['password']}\n"
        f"  Spark master UI: {state['spark_master_ui']}  (master {state['spark_master']}, "
        f"Connect {state['spark_connect']})\n"
        f"  Catalog:         {state['postgres']['catalog']}  (JDBC: {state['postgres']['jdbc']})\n"
        f"  S3:              {state['s3_endpoint']};  broker: {state['redis']}\n"
        f"  Config:          {state['config']} (each host has its own copy)\n"
        f"  Hosts:\n{hosts}\n  Logs:\n{logs}\n"
        f"  Everything is in {root} ({root / 'stack.json'}). "
        "Ctrl-C to stop (or make stack-stop from another shell).\n"
    )


def _unpause(state: dict[str, Any]) -> None:
    """The table's DAG and its mirrors', once parsed: the catch-up starts without a click."""

    def run() -> None:
        try:
            tables, mirrors = dag_ids(state["config"])
            url, password = state["airflow_url"], state["login"]["password"]
            unpause_when_parsed(
                url, password, tables, note="its runs catch up with the source, one per snapshot"
            )
            unpause_when_parsed(url, password, mirrors)
        except Exception as exc:  # the stack still works; the user can unpause by hand
            print(f"\n  could not unpause the DAGs ({exc}); unpause them in the UI\n", flush=True)

    threading.Thread(target=run, name="unpause", daemon=True).start()


def run(root: Path, port: int | None) -> int:
    clear(root)
    stack = Stack(root, seed, port)
    try:
        state = stack.start()
        print(banner(state, root), flush=True)
        _unpause(state)
        while True:
            stack.check_running()
            time.sleep(1)
    except KeyboardInterrupt:
        print("\nstopping the stack ...", flush=True)
        return 0
    except RuntimeError as error:
        print(f"\nmake stack: {error}", file=sys.stderr, flush=True)
        return 1
    finally:
        stack.stop()
        print("make stack: stopped everything it started", flush=True)


def stop(root: Path) -> int:
    """make stack-stop: the running stack takes its Ctrl-C path; then whatever is left is killed by pid."""
    stopped, message = stop_running(root / "stack.pid", MARKER)
    print(message)
    left = sweep(root)
    if left:
        print(f"killed what a stack left behind: {', '.join(left)}")
    return 0 if stopped or left else 1


def main() -> int:
    STOP.install()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, help="the Airflow API server's port (default: a free one)")
    parser.add_argument(
        "--dir", type=Path, default=STACK_DIR, help=f"the stack's folder (default {STACK_DIR})"
    )
    parser.add_argument(
        "--stop", action="store_true", help="stop the stack running in --dir (make stack-stop)"
    )
    args = parser.parse_args()
    root = args.dir.resolve()
    if args.stop:
        return stop(root)
    try:
        with pid_file(root / "stack.pid", MARKER, stop_command="make stack-stop"):
            return run(root, args.port)
    except AlreadyRunning as running:
        print(f"make stack: {running}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""A real Airflow under its scheduler on 127.0.0.1, for tests, benchmarks and ``make airflow``.

``airflow dags test`` runs one DAG run in one process; what a deployment does
-- the scheduler creating and ordering runs, backfills with their own
``max_active_runs``, runs triggered over the REST API, chained runs, a
LocalExecutor with few slots -- needs the real components. :class:`LocalAirflow`
starts them from an Airflow environment (:func:`~cdc_devtools.airflow_env.airflow_env`)::

    with LocalAirflow(env, work_dir) as airflow:
        airflow.wait_for_dag(dag_id)
        airflow.unpause(dag_id)
        run = airflow.trigger(dag_id, {"snapshot_id": 42})
        airflow.wait_for_runs(dag_id, [run["dag_run_id"]])
        airflow.task_states(dag_id, run["dag_run_id"])

* API server (one worker), scheduler and DAG processor (plus, optionally, a
  triggerer and the task log server), each its own process group, all bound
  to 127.0.0.1; the API server on a free port unless one is given;
* a LocalExecutor with ``parallelism`` slots (default 2, for a 2-core
  machine), one DAG-parsing process;
* login on, as ``make airflow`` has it: the simple auth manager with one admin
  user whose password this harness writes to Airflow's passwords file
  (:func:`~cdc_devtools.airflow_env.login_env`); every request goes to the REST
  API v2 with that user's token (the client,
  :class:`~cdc_devtools.airflow_api.AirflowApi`, is shared with ``make stack``'s
  test), backfills through the ``airflow backfill create`` CLI as an operator types it;
* :meth:`stop` (also on ``__exit__``, and at interpreter exit) stops every
  process it started and every process they started, by process group and
  then by pid: nothing outlives it, even when a test fails.

Airflow is only run here, never imported: this module imports with the
library alone.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import socket
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

from cdc_devtools.airflow_api import AirflowApi, healthy
from cdc_devtools.airflow_env import LOGIN_USER, PASSWORDS_FILE_NAME, VENV_BIN, ensure_airflow_db, login_env
from cdc_devtools.children import die_with_parent
from cdc_devtools.process_tree import alive, descendants, stop_processes

HOST = "127.0.0.1"

# Airflow's task log server (the app the scheduler and triggerer would start on every
# interface), on 127.0.0.1 (or $CDC_LOG_SERVER_HOST: make stack's worker hosts have their own
# loopback address), for the worker and triggerer log ports given as arguments.
LOG_SERVER = """
import asyncio, os, sys
import uvicorn
from airflow.utils.serve_logs.log_server import get_app

async def main():
    app = get_app()
    servers = [
        uvicorn.Server(uvicorn.Config(app, host=os.environ.get("CDC_LOG_SERVER_HOST", "127.0.0.1"), port=int(port),
                                     log_config=None, access_log=False))
        for port in sys.argv[1:]
    ]
    await asyncio.gather(*(server.serve() for server in servers))

asyncio.run(main())
"""


# The ``airflow`` CLI, with SQLite transactions that take the write lock when they begin. The
# scheduler commits every second; a CLI transaction that read before it writes (backfill create
# does) would otherwise fail at once with "database is locked" (a stale read snapshot cannot be
# upgraded to a write in WAL mode, whatever the busy timeout). BEGIN IMMEDIATE waits instead.
AIRFLOW_CLI = """
import sqlite3, sys
from sqlalchemy import event
from sqlalchemy.engine import Engine

@event.listens_for(Engine, "connect")
def _autocommit_driver(dbapi_connection, record):
    if isinstance(dbapi_connection, sqlite3.Connection):
        dbapi_connection.isolation_level = None

@event.listens_for(Engine, "begin")
def _begin_immediate(connection):
    if connection.dialect.name == "sqlite":
        connection.exec_driver_sql("BEGIN IMMEDIATE")

from airflow.__main__ import main
sys.argv[0] = "airflow"
sys.exit(main())
"""


def port_free(port: int, host: str = HOST) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


# The task log servers follow the API server's port: 8080 -> 8793 and 8794 (Airflow's defaults).
LOG_PORT_OFFSET = 713


def log_server_ports(port: int) -> tuple[int, int]:
    """The worker's and the triggerer's log server ports for an API server on ``port``.

    ``port + 713`` and ``port + 714`` when free, else the next free ones above:
    two ``make airflow`` on different ``PORT``s never share a log server.
    """
    found: list[int] = []
    candidate = port + LOG_PORT_OFFSET
    while len(found) < 2:
        if candidate > 65535:
            raise RuntimeError(
                f"no free port above {port + LOG_PORT_OFFSET} on {HOST} for the task log servers"
            )
        if candidate != port and port_free(candidate):
            found.append(candidate)
        candidate += 1
    return found[0], found[1]


# Airflow settings for small snapshots (docs/operating.md, "Small snapshots under the scheduler"):
# the scheduler loops again after 0.1 s instead of 1 s when idle (one loop per task hop; about 20 %
# of a core when idle here, 2.5 % at 1 s), and a task's supervisor checks every second, not every
# 5 s, for a process that exited after closing its sockets (an executor slot stayed busy until then).
LOW_LATENCY = {
    "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.1",
    "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "1",
}


def low_latency_label() -> str:
    """The settings of :data:`LOW_LATENCY` as a bench line names them (``scheduler_idle_sleep_time 0.1 s, ...``)."""
    return ", ".join(f"{name.rsplit('__', 1)[1].lower()} {value} s" for name, value in LOW_LATENCY.items())


def machine_env(
    env: dict[str, str], port: int, *, parallelism: int | None = None, low_latency: bool = False
) -> dict[str, str]:
    """Settings for one small machine, everything on 127.0.0.1 (``env`` is changed and returned).

    ``parallelism``: LocalExecutor slots (default: the machine's cores);
    ``low_latency``: :data:`LOW_LATENCY` where ``env`` does not set them.
    """
    if low_latency:
        for name, value in LOW_LATENCY.items():
            env.setdefault(name, value)
    slots = parallelism or os.cpu_count() or 2
    env.update(
        {
            "CDC_SENSOR_MODE": "reschedule",
            "AIRFLOW__API__HOST": HOST,
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__WORKERS": "1",
            # Tasks reach Airflow through the execution API; it must follow the port.
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://{HOST}:{port}/execution/",
            # LocalExecutor: one worker process per parallel task slot.
            "AIRFLOW__CORE__PARALLELISM": str(slots),
            "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": str(slots),
            "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": str(min(2, slots)),
            # Tasks record this host name; the API server fetches running tasks' logs from it.
            "AIRFLOW__CORE__HOSTNAME_CALLABLE": "urllib.request.localhost",
        }
    )
    if not {"AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT", "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT"} <= set(
        env
    ):
        worker, trigger = log_server_ports(port)
        env.setdefault("AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT", str(worker))
        env.setdefault("AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT", str(trigger))
    database = env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "")
    if database.startswith("sqlite") and "?" not in database:
        # Scheduler, DAG processor, API server and CLI commands (a backfill) write one SQLite file:
        # wait for a lock up to a minute instead of sqlite's 5 s, which a backfill create outlasts.
        env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"{database}?timeout=60"
    return env


def components(
    env: dict[str, str], port: int, *, triggerer: bool = True, log_server: bool = True
) -> dict[str, list[str]]:
    """The command of each Airflow component, by name."""
    airflow = str(VENV_BIN / "airflow")
    commands = {
        "api-server": [airflow, "api-server", "--host", HOST, "--port", str(port), "--workers", "1"],
        "scheduler": [airflow, "scheduler", "--skip-serve-logs"],
        "dag-processor": [airflow, "dag-processor"],
    }
    if triggerer:
        commands["triggerer"] = [airflow, "triggerer", "--skip-serve-logs"]
    if log_server:
        commands["log-server"] = [
            str(VENV_BIN / "python"),
            "-c",
            LOG_SERVER,
            env["AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"],
            env["AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT"],
        ]
    return commands


class LocalAirflow(AirflowApi):
    """Airflow's components on 127.0.0.1 for one AIRFLOW_HOME (``env``), stopped by pid."""

    def __init__(
        self,
        env: dict[str, str],
        work_dir: Path,
        *,
        port: int | None = None,
        parallelism: int = 2,
        triggerer: bool = False,
        log_server: bool = False,
        low_latency: bool = False,
    ) -> None:
        self.work_dir = Path(work_dir)
        self.port = port or free_port()
        self.env = machine_env(dict(env), self.port, parallelism=parallelism, low_latency=low_latency)
        # Every component must sign and check the execution API's tokens with one secret.
        self.env.setdefault("AIRFLOW__API_AUTH__JWT_SECRET", secrets.token_hex(16))
        self.env.setdefault("AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION", "True")
        # Login on: one admin user with a password only this harness (and the file) knows.
        super().__init__(f"http://{HOST}:{self.port}", LOGIN_USER, secrets.token_urlsafe(12))
        self.passwords_file = self.work_dir / PASSWORDS_FILE_NAME
        login_env(self.env, self.passwords_file, self.user)
        if not log_server:
            self.env["AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"] = str(free_port())
        self.triggerer = triggerer
        self.log_server = log_server
        self.processes: dict[str, subprocess.Popen] = {}

    @property
    def where(self) -> str:
        return str(self.work_dir)

    def log_path(self, name: str) -> Path:
        return self.work_dir / f"{name}.log"

    # --- life cycle ------------------------------------------------------------------------------

    def start(self, timeout: float = 180.0) -> LocalAirflow:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.passwords_file.write_text(json.dumps({self.user: self.password}) + "\n")
        ensure_airflow_db(self.env)
        atexit.register(self.stop)
        try:
            commands = components(self.env, self.port, triggerer=self.triggerer, log_server=self.log_server)
            for name, command in commands.items():
                with open(self.log_path(name), "ab") as log:
                    self.processes[name] = subprocess.Popen(
                        command,
                        env=self.env,
                        cwd=self.work_dir,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        preexec_fn=die_with_parent(),
                    )
            deadline = time.monotonic() + timeout
            while not healthy(f"{self.url}/api/v2/monitor/health"):
                self.check_running()
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the Airflow API server did not answer in {timeout:.0f} s; see {self.work_dir}"
                    )
                time.sleep(0.5)
        except BaseException:
            self.stop()
            raise
        return self

    def check_running(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                tail = self.log_path(name).read_text(errors="replace")[-3000:]
                raise RuntimeError(f"airflow {name} exited with {process.returncode}:\n{tail}")

    def stop(self) -> None:
        processes, self.processes = list(self.processes.values()), {}
        stop_processes(processes)
        atexit.unregister(self.stop)

    def __enter__(self) -> LocalAirflow:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def backfill(
        self,
        dag_id: str,
        from_date: str,
        to_date: str,
        *,
        max_active_runs: int | None = None,
        conf: dict[str, Any] | None = None,
        extra: Iterable[str] = (),
    ) -> subprocess.CompletedProcess:
        """``airflow backfill create`` as an operator types it; the CLI's result (not checked)."""
        command = [
            *self.cli(), "backfill", "create", "--dag-id", dag_id,
            "--from-date", from_date, "--to-date", to_date,
        ]  # fmt: skip
        if max_active_runs is not None:
            command += ["--max-active-runs", str(max_active_runs)]
        if conf is not None:
            command += ["--dag-run-conf", json.dumps(conf)]
        command += list(extra)
        return subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=300)

    def cli(self) -> list[str]:
        """The ``airflow`` command (on SQLite, with transactions that queue for the write lock)."""
        if self.env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "").startswith("sqlite"):
            return [str(VENV_BIN / "python"), "-c", AIRFLOW_CLI]
        return [str(VENV_BIN / "airflow")]

    def pids(self) -> set[int]:
        """The processes started here and all their descendants, alive now."""
        found = set()
        for process in self.processes.values():
            if process.poll() is None:
                found.add(process.pid)
            found |= descendants(process.pid)
        return {pid for pid in found if alive(pid)}

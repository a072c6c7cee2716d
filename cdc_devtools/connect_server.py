"""A Spark Connect server on 127.0.0.1 from the installed pyspark, for the demo, ``make sync`` and tests.

``spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer``
(the server's jar ships in the pyspark wheel) in the foreground, in its own
process group, so stopping it by process id stops the JVM and the Python
workers it started. It runs Spark ``local[2]`` (configurable) and keeps it
warm: a DAG run's phases then cost a client session (about a second) and a
job each, instead of a JVM start per phase.

As with :class:`~cdc_devtools.spark_cluster.LocalSparkCluster`, the
server starts from a clean environment (no ``PYTHONPATH``, no config file, no
AWS variables): its Python workers import the package only from the archive
each client session adds (``addArtifacts``) and get storage credentials only
inside the pickled task functions, as on a shared server.

:func:`ensure_connect_server` reuses a server that answers, or starts one;
:func:`connect_server_for` does so for a config in ``spark.mode: connect``
and points the Airflow environment's ``spark_connect`` connection at it
(``make demo``, ``make sync``, ``make airflow``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from cdc_devtools.airflow_env import connect_connection, connection_env_var
from cdc_devtools.children import die_with_parent
from cdc_devtools.local_s3 import free_port
from cdc_devtools.spark_cluster import SPARK_HOME, daemon_env
from iceberg_cdc.pipeline.worker_heap import WORKER_ENV

if TYPE_CHECKING:
    from iceberg_cdc.config import CdcConfig

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
DEFAULT_PORT = 15002
# The server's JVM only coordinates: the pipeline's rows are decoded, compared and written in
# Python workers (mapInArrow). Its JIT's second tier (C2) kept compiling through the first
# dozen runs and took cores from those workers; the first tier alone halved the JVM's CPU and
# cut a warm 5 M-row run by about a tenth (docs/benchmarks.md). A server that also runs SQL
# that computes in the JVM wants Spark's default (``java_options=""``): C1 alone made Iceberg's
# create_changelog_view twice as slow.
COORDINATOR_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"


def host_port(url: str) -> tuple[str, int]:
    """``sc://host:port/;params`` -> (host, port); the port defaults to Spark Connect's 15002."""
    parsed = urlparse(url if "://" in url else f"sc://{url}")
    return parsed.hostname or "127.0.0.1", parsed.port or DEFAULT_PORT


def port_open(url: str, timeout: float = 1.0) -> bool:
    """Whether something accepts TCP connections at the URL's host and port."""
    host, port = host_port(url)
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=timeout):
        return True
    return False


def session_answers(url: str) -> bool:
    """Whether a Spark Connect client session on ``url`` opens and runs a trivial query."""
    from pyspark.sql import SparkSession

    try:
        spark = SparkSession.builder.remote(url).create()
    except Exception:
        return False
    try:
        return spark.range(1).count() == 1
    except Exception:
        return False
    finally:
        with contextlib.suppress(Exception):
            spark.stop()


def reachable(url: str) -> bool:
    """A Spark Connect server answers on ``url`` (a cheap port check first)."""
    return port_open(url) and session_answers(url)


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt in the block (main thread, default handler only), so cleanup runs."""
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@dataclass
class LocalSparkConnectServer:
    """``with LocalSparkConnectServer(tmp) as server: server.url`` -- started, then stopped by pid."""

    work_dir: Path
    master: str = "local[2]"
    port: int = field(default_factory=free_port)
    driver_memory: str = "2g"
    ui_port: int | None = None  # the server's Spark UI (with its Connect tab) on this port; off by default
    conf: dict[str, str] = field(default_factory=dict)
    java_options: str = COORDINATOR_JAVA_OPTIONS  # the driver JVM's; "" for the JVM's defaults
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.work_dir / "spark-connect.log"

    def command(self) -> list[str]:
        conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            # The Python workers run this venv's interpreter (pyarrow, pyiceberg, boto3 ...); the
            # Connect server reads $PYSPARK_PYTHON, other code paths the conf.
            "spark.pyspark.python": sys.executable,
            "spark.pyspark.driver.python": sys.executable,
            "spark.ui.enabled": "true" if self.ui_port else "false",
            **({"spark.ui.port": str(self.ui_port)} if self.ui_port else {}),
            "spark.ui.showConsoleProgress": "false",
            # Clients share one session per package version and day (pipeline/connect_app.py):
            # keep it (and its warm Python workers) through quiet hours.
            "spark.connect.session.manager.defaultSessionTimeout": "25h",
            # Applied to the JVM because it is on spark-submit's command line (client mode).
            **({"spark.driver.extraJavaOptions": self.java_options} if self.java_options else {}),
            **self.conf,
        }
        command = [
            str(SPARK_HOME / "bin" / "spark-submit"),
            "--class", SERVER_CLASS,
            "--name", "Spark Connect server (iceberg-cdc, local)",
            "--master", self.master,
            "--driver-memory", self.driver_memory,
        ]  # fmt: skip
        for key, value in conf.items():
            command += ["--conf", f"{key}={value}"]
        return command

    def start(self, timeout: float = 120.0) -> LocalSparkConnectServer:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        env = daemon_env(self.work_dir)
        # The server starts Python workers with $PYSPARK_PYTHON (not spark.pyspark.python).
        env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = sys.executable
        env.update(WORKER_ENV)  # the Python workers keep their memory between tasks
        log = open(self.log_path, "wb")  # noqa: SIM115 - owned by the child
        self.process = subprocess.Popen(
            self.command(),
            env=env,
            cwd=self.work_dir,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )
        log.close()
        # The JVM runs in its own session: Ctrl-C reaches only this process. Whatever ends the wait --
        # Ctrl-C, SIGTERM, an error -- stops the server before it goes on, or the JVM would outlive us.
        with _sigterm_interrupts():
            try:
                return self._wait_until_up(timeout)
            except BaseException:
                self.stop()
                raise

    def _wait_until_up(self, timeout: float) -> LocalSparkConnectServer:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code = self.process.returncode
                raise RuntimeError(f"the Spark Connect server exited with code {code}; see {self.log_path}")
            if port_open(self.url, timeout=0.5) and session_answers(self.url):
                return self
            time.sleep(0.5)
        raise RuntimeError(f"Spark Connect server not up after {timeout:.0f} s; see {self.log_path}")

    def stop(self) -> None:
        """SIGTERM the server's process group by pid, then SIGKILL what is left."""
        process, self.process = self.process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=20)
        # Python workers the JVM forked stay in its group: make sure none outlives it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)

    def __enter__(self) -> LocalSparkConnectServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def ensure_connect_server(
    url: str | None, work_dir: Path, *, master: str = "local[2]"
) -> tuple[str, LocalSparkConnectServer | None]:
    """``(url, server)``: ``url`` when a server answers there, else a local server started here.

    A given ``url`` on this machine that nothing answers yet gets the local
    server on its port; ``server`` is ``None`` when nothing was started (the
    caller stops what it started, and only that).
    """
    if url and reachable(url):
        return url, None
    port = None
    if url:
        host, port = host_port(url)
        if host not in ("127.0.0.1", "localhost"):
            raise RuntimeError(
                f"no Spark Connect server answers on {url}; start it there, or leave the URL out to "
                "start a local one"
            )
    server = LocalSparkConnectServer(work_dir, master=master, **({"port": port} if port else {}))
    server.start()
    return server.url, server


def connection_url(value: str) -> str | None:
    """``sc://host:port`` of an ``AIRFLOW_CONN_*`` value (JSON or URI form), or ``None``."""
    try:
        document = json.loads(value)
    except ValueError:
        parsed = urlparse(value)
        host, port = parsed.hostname, parsed.port
    else:
        if not isinstance(document, dict):
            return None
        parsed = urlparse(str(document.get("host") or ""))
        host = parsed.hostname if parsed.scheme else str(document.get("host") or "")
        port = document.get("port") or parsed.port
    if not host:
        return None
    return f"sc://{host}:{port or DEFAULT_PORT}"


def configured_url(config: CdcConfig, env: dict[str, str]) -> str | None:
    """Where the DAG's tasks will look for the server: ``spark.connect_url``, else the connection in ``env``."""
    if config.spark.connect_url:
        return config.spark.connect_url
    value = env.get(connection_env_var(config.spark.connect_conn_id))
    return connection_url(value) if value else None


@contextlib.contextmanager
def connect_server_for(config: CdcConfig, env: dict[str, str], work_dir: Path) -> Iterator[str | None]:
    """With ``spark.mode: connect``: a reachable server (started here when none answers), for the block.

    The server the config or ``env`` names is reused when it answers; else a
    local one starts (on the named local port, or a free one) and stops when
    the block ends. ``env`` (an Airflow environment) gets the
    ``spark_connect`` connection pointing at it unless ``spark.connect_url``
    names it. Yields the URL, or ``None`` in ``submit`` mode.
    """
    if config.spark.mode != "connect":
        yield None
        return
    wanted = configured_url(config, env)
    url, server = ensure_connect_server(wanted, work_dir)
    if server is None:
        print(f"Spark Connect: using the server on {url}", flush=True)
    else:
        print(f"Spark Connect: started a local server on {url} (log: {server.log_path})", flush=True)
    if not config.spark.connect_url:
        env[connection_env_var(config.spark.connect_conn_id)] = connect_connection(url)
    try:
        yield url
    finally:
        if server is not None:
            server.stop()

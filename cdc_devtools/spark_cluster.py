"""A Spark standalone cluster on 127.0.0.1 from the installed pyspark: one master, N workers.

For the cluster-mode end-to-end test and for trying the DAG against a real
``spark://`` master on one machine. Each daemon is ``spark-class`` in the
foreground, in its own process group, so stopping it by process id stops the
JVM and everything it launched (executors included).

The daemons get a clean environment: no ``PYTHONPATH``, no ``CDC_CONFIG``, no
AWS variables. Executors therefore see only what the Spark application ships
them (``--py-files``, task closures) — as on a real cluster, where the driver's
local files are out of reach.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import pyspark

from cdc_devtools.children import die_with_parent
from cdc_devtools.local_s3 import free_port

SPARK_HOME = Path(pyspark.__file__).resolve().parent
_KEEP_ENV = ("PATH", "JAVA_HOME", "LANG", "LC_ALL", "TMPDIR", "HOME")


def daemon_env(work_dir: Path) -> dict[str, str]:
    """The daemons' environment: the basics, Spark's own settings, nothing of the driver's."""
    env = {k: os.environ[k] for k in _KEEP_ENV if k in os.environ}
    env.update(
        {
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(work_dir / "logs"),
            "SPARK_LOCAL_DIRS": str(work_dir / "local"),
            "SPARK_NO_DAEMONIZE": "1",
        }
    )
    return env


def _signal_group(process: subprocess.Popen, sig: signal.Signals) -> None:
    """Signal the daemon's whole process group (its executors too), even if the daemon is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)


@dataclass
class LocalSparkCluster:
    """``with LocalSparkCluster(tmp) as cluster: cluster.master_url`` — started, then stopped by pid."""

    work_dir: Path
    workers: int = 1
    cores_per_worker: int = 2
    memory_per_worker: str = "2g"
    # The master's and workers' own JVM heap (SPARK_DAEMON_MEMORY; Spark's default is 1g each):
    # they only schedule, and make stack runs three of them beside Airflow on a shared machine.
    daemon_memory: str | None = None
    master_port: int = field(default_factory=free_port)
    webui_port: int = field(default_factory=free_port)
    processes: list[subprocess.Popen] = field(default_factory=list, repr=False)

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    def worker_dir(self, index: int) -> Path:
        return self.work_dir / f"worker-{index}"

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.work_dir / f"{name}.log", "wb")  # noqa: SIM115 - owned by the child
        env = daemon_env(self.work_dir)
        if name.startswith("worker-"):
            # Each worker (a host of its own) keeps its scratch files apart from the other's.
            env["SPARK_LOCAL_DIRS"] = str(self.worker_dir(int(name.split("-")[1])) / "local")
        if self.daemon_memory:
            env["SPARK_DAEMON_MEMORY"] = self.daemon_memory
        process = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args],
            env=env,
            cwd=self.work_dir,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )
        log.close()
        self.processes.append(process)
        return process

    def state(self) -> dict:
        """The master's status document (workers, running and completed applications)."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"http://127.0.0.1:{self.webui_port}/json/", timeout=2) as response:
            return json.load(response)

    def start(self, timeout: float = 90.0) -> LocalSparkCluster:
        self._spawn(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host", "127.0.0.1",
                "--port", str(self.master_port),
                "--webui-port", str(self.webui_port),
            ],
        )  # fmt: skip
        for index in range(self.workers):
            self.worker_dir(index).mkdir(parents=True, exist_ok=True)
            self._spawn(
                f"worker-{index}",
                [
                    "org.apache.spark.deploy.worker.Worker", self.master_url,
                    "--host", "127.0.0.1",
                    "--webui-port", str(free_port()),
                    "--cores", str(self.cores_per_worker),
                    "--memory", self.memory_per_worker,
                    "--work-dir", str(self.worker_dir(index)),
                ],
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [p for p in self.processes if p.poll() is not None]
            if dead:
                self.stop()
                raise RuntimeError(f"a Spark daemon exited early; see the logs in {self.work_dir}")
            try:
                if self.state().get("aliveworkers", 0) >= self.workers:
                    return self
            except (OSError, ValueError):
                # Not up yet: no listener, or (seen under load) a UI whose /json/ handler is not
                # attached yet answers with an HTML page.
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"Spark cluster not up after {timeout:.0f} s; see the logs in {self.work_dir}")

    def stop(self) -> None:
        """SIGTERM each daemon's process group by pid, then SIGKILL what is left."""
        for process in reversed(self.processes):
            _signal_group(process, signal.SIGTERM)
        for process in reversed(self.processes):
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait(timeout=15)
        self.processes.clear()

    def __enter__(self) -> LocalSparkCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

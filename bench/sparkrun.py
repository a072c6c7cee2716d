"""spark-submit as the DAG runs it, timed; and Spark's event log read back for per-stage figures.

The pipeline's phases are submitted as the DAG submits them: the same
application, ``--py-files`` archive and ``--conf``
(``iceberg_cdc.pipeline.submit_conf``, shared with the DAG factory
without importing Airflow). Every application of the benchmark (pipeline phases, the
Spark-native baseline, the floor) runs on the same master, ``local[2]``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from iceberg_cdc.pipeline.submit_conf import submit_conf

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
MASTER = "local[2]"
PHASE_APPLICATION = ROOT / "spark_jobs" / "cdc_phase.py"


@dataclass
class Submit:
    """One spark-submit: its wall time (process start to exit) and where its log is."""

    name: str
    seconds: float
    log: str
    event_dir: str | None = None
    stages: list[dict] = field(default_factory=list)


def spark_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The venv's bin first on PATH: spark-submit finds its Spark home through ``python``."""
    env = dict(os.environ)
    # A Spark Connect session opened in this process (the warm-server runs) leaves these set; a
    # spark-submit application started after it must not become a Connect client.
    for name in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE"):
        env.pop(name, None)
    env["PATH"] = os.pathsep.join([str(VENV_BIN), env.get("PATH", "")])
    env["PYSPARK_PYTHON"] = sys.executable
    env.update(extra or {})
    return env


def dag_conf() -> dict[str, str]:
    """``--conf`` of the DAG's SparkSubmitOperator with an empty ``spark.conf``."""
    return submit_conf()


def event_log_conf(directory: Path) -> dict[str, str]:
    """One uncompressed event log file per application, for stage timings and shuffle bytes."""
    directory.mkdir(parents=True, exist_ok=True)
    return {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": directory.as_uri(),
        "spark.eventLog.compress": "false",
        "spark.eventLog.rolling.enabled": "false",
    }


def spark_submit(
    name: str,
    application: Path,
    args: list[str],
    *,
    logs: Path,
    conf: dict[str, str] | None = None,
    py_files: str | None = None,
    driver_memory: str | None = None,
    env: dict[str, str] | None = None,
    event_dir: Path | None = None,
) -> Submit:
    """Run one application to completion; a non-zero exit raises with the log's tail."""
    conf = dict(conf or {})
    if event_dir is not None:
        conf.update(event_log_conf(event_dir))
    command = [str(VENV_BIN / "spark-submit"), "--master", MASTER, "--name", name]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    if py_files:
        command += ["--py-files", py_files]
    if driver_memory:
        command += ["--driver-memory", driver_memory]
    command += [str(application), *args]
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{name.replace(' ', '_').replace('/', '-')}.log"
    started = time.perf_counter()
    with open(log, "wb") as out:
        code = subprocess.run(
            command, env=env or spark_env(), stdout=out, stderr=subprocess.STDOUT
        ).returncode
    seconds = time.perf_counter() - started
    if code != 0:
        tail = log.read_text(errors="replace")[-4000:]
        raise RuntimeError(f"spark-submit {name!r} exited with {code}; log {log}:\n{tail}")
    submit = Submit(name, round(seconds, 3), str(log), str(event_dir) if event_dir else None)
    if event_dir is not None:
        submit.stages = read_stages(event_dir)
    return submit


_METRICS = {
    "internal.metrics.executorRunTime": "run_ms",
    "internal.metrics.executorCpuTime": "cpu_ns",
    "internal.metrics.jvmGCTime": "gc_ms",
    "internal.metrics.input.bytesRead": "input_bytes",
    "internal.metrics.output.bytesWritten": "output_bytes",
    "internal.metrics.shuffle.write.bytesWritten": "shuffle_write_bytes",
    "internal.metrics.shuffle.read.remoteBytesRead": "shuffle_read_remote_bytes",
    "internal.metrics.shuffle.read.localBytesRead": "shuffle_read_local_bytes",
    "internal.metrics.memoryBytesSpilled": "spilled_memory_bytes",
    "internal.metrics.diskBytesSpilled": "spilled_disk_bytes",
    "internal.metrics.peakExecutionMemory": "peak_execution_memory",
}


def read_stages(
    event_dir: Path, *, in_progress: bool = False, since_ms: int | None = None, until_ms: int | None = None
) -> list[dict]:
    """Completed stages of every application logged in ``event_dir``: seconds, tasks, I/O, shuffle.

    ``in_progress``: also the log of an application still running (a Spark
    Connect server), whose last line may be cut; ``since_ms`` / ``until_ms``:
    only stages submitted in that window (epoch milliseconds), one client
    job's stages on a shared server.
    """
    stages = []
    for path in sorted(Path(event_dir).iterdir()):
        if not path.is_file() or (path.suffix == ".inprogress" and not in_progress):
            continue
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue  # the running application's last line, half written
            if event.get("Event") != "SparkListenerStageCompleted":
                continue
            info = event["Stage Info"]
            submitted = info["Submission Time"]
            if (since_ms is not None and submitted < since_ms) or (
                until_ms is not None and submitted > until_ms
            ):
                continue
            metrics = {
                _METRICS[a["Name"]]: int(a["Value"])
                for a in info.get("Accumulables", [])
                if a.get("Name") in _METRICS and str(a.get("Value", "")).lstrip("-").isdigit()
            }
            stages.append(
                {
                    "stage": info["Stage ID"],
                    "name": info["Stage Name"].split(" at ")[0],
                    "tasks": info["Number of Tasks"],
                    "seconds": round((info["Completion Time"] - submitted) / 1000, 3),
                    **metrics,
                }
            )
    return stages

"""The pipeline and the Spark-native job side by side on one warm Spark Connect server.

The submit comparison (``run.py``) pays a JVM start per Spark application:
two for the pipeline (write, read), one for the Spark-native job. With
``spark.mode: connect`` the pipeline's phases run on a long-running Spark
Connect server instead, so the fair comparison for that mode is both sides
on the same warm server:

* one local server (``devtools/connect_server.py``, ``local[2]``, the
  Spark-native job's driver memory, an event log for per-stage figures),
  started once; its start is reported apart (a deployment pays it once);
* the pipeline, its groups run by ``connect_app.run_group`` exactly as the
  DAG's ``SparkConnectPhaseOperator`` runs them (``pipeline_run.py``), shuffle
  on ``file://``; the Spark-native changelog (``spark_native.native``, the
  DataFrame API only) as one client job on its own session, Spark's shuffle;
* warm-up: each side runs twice, alternating (pipeline, Spark-native,
  pipeline, Spark-native), on the same data; the first runs warm the
  server's JIT and the pipeline's Python workers, the second are the
  comparison. Both are reported;
* then the pipeline once more without cancelling carryover before the
  shuffle (every row shuffled: the path before issue 22, for the ratio
  before and after in one run), and once with the shuffle on the local S3
  server (warm).

Every run's rows are checked against the submit pipeline's sink rows.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sparkrun import MASTER, event_log_conf, read_stages

WARM_RUNS = 2  # each side: the first warms the server, the last is the comparison


def _native(
    bench: Any, url: str, label: str, workload: Any, events: Path, conf: dict[str, str]
) -> dict[str, Any]:
    import pyarrow.parquet as pq
    from spark_native import run_on_connect

    out = bench.work / f"{label}-out"
    result = run_on_connect(url, workload.removed, workload.added, str(out), ["id"], conf)
    since, until = result.pop("job_window_ms")
    result["stages"] = read_stages(events, in_progress=True, since_ms=since, until_ms=until)
    result["shuffle_write_bytes"] = sum(s.get("shuffle_write_bytes", 0) for s in result["stages"])
    result["fixed_seconds"] = round(result["wall_seconds"] - result["job_seconds"], 3)
    result["rows_written"] = pq.ParquetDataset(out).read().num_rows
    result["out"] = str(out)
    return result


@contextmanager
def warm_server(
    work: Path, name: str, driver_memory: str, events: Path, *, java_options: str | None = None
) -> Iterator[Any]:
    """A local Spark Connect server (``MASTER``, an event log) for the block; stopped, and this
    process's Connect settings dropped, after it. ``java_options``: the driver JVM's (``None``:
    the local server's coordinator default, ``""``: the JVM's own)."""
    from cdc_devtools.connect_server import LocalSparkConnectServer
    from iceberg_cdc.pipeline import connect_app

    jvm = {} if java_options is None else {"java_options": java_options}
    server = LocalSparkConnectServer(
        work / name, master=MASTER, driver_memory=driver_memory, conf=event_log_conf(events), **jvm
    )
    server.start()
    try:
        yield server
    finally:
        connect_app.close_sessions()
        server.stop()
        # Opening a Connect session set these in this process; later Spark runs must not see them.
        for variable in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE"):
            os.environ.pop(variable, None)


def run_connect(
    bench: Any,
    workloads: dict[str, Any],
    results: dict[str, Any],
    *,
    driver_memory: str,
    sql_conf: dict[str, str],
    same_rows: Callable[[Any, Any], dict[str, Any]],
    log: Callable[[str], None],
    no_cancel: dict[str, Any] | None = None,
) -> None:
    """Fill ``results["connect"]`` and its checks; the server is stopped before returning."""
    import pyarrow.parquet as pq
    import workload as wl
    from pipeline_run import sink_changes

    main = workloads["main"]
    expected = sink_changes(bench.catalog, results["pipeline"]["file"]["sink"], main.snapshot_id, wl.COLUMNS)
    events = bench.work / "events" / "spark-connect"
    log(f"warm Spark Connect: starting a local server ({MASTER}, driver memory {driver_memory})")
    started = time.perf_counter()
    checks = results["checks"]
    # This server also runs the Spark-native job, which computes in the JVM: both sides get the
    # JVM's default JIT here (the coordinator setting would slow the native side, not ours).
    with warm_server(bench.work, "spark-connect", driver_memory, events, java_options="") as server:
        connect: dict[str, Any] = {
            "master": MASTER,
            "driver_memory": driver_memory,
            "server_start_seconds": round(time.perf_counter() - started, 3),
            "warm_runs": WARM_RUNS,
            "pipeline": {"file": []},
            "spark_native": [],
        }
        for index in range(1, WARM_RUNS + 1):
            log(f"warm Spark Connect, run {index} of {WARM_RUNS}: pipeline (file://), then Spark-native")
            run = bench.pipeline(f"connect-{index}", main, "file", connect_url=server.url)
            connect["pipeline"]["file"].append(run)
            got = sink_changes(bench.catalog, run["sink"], main.snapshot_id, wl.COLUMNS)
            checks[f"connect_pipeline_run{index}_vs_file"] = same_rows(expected, got)
            native = _native(bench, server.url, f"connect-native-{index}", main, events, sql_conf)
            native_rows = pq.ParquetDataset(native.pop("out")).read()
            connect["spark_native"].append(native)
            checks[f"connect_spark_native_run{index}_vs_pipeline"] = same_rows(expected, native_rows)
            del native_rows
        log("warm Spark Connect: pipeline without cancelling carryover before the shuffle (as before)")
        run = bench.pipeline("connect-no-cancel", main, "file", connect_url=server.url, extra=no_cancel)
        connect["pipeline"]["no_cancel"] = run
        got = sink_changes(bench.catalog, run["sink"], main.snapshot_id, wl.COLUMNS)
        checks["connect_pipeline_no_cancel_vs_file"] = same_rows(expected, got)
        log("warm Spark Connect: pipeline, shuffle on the local S3 server")
        run = bench.pipeline("connect-s3", main, "s3", connect_url=server.url)
        connect["pipeline"]["s3"] = run
        got = sink_changes(bench.catalog, run["sink"], main.snapshot_id, wl.COLUMNS)
        checks["connect_pipeline_s3_vs_file"] = same_rows(expected, got)
    connect["server_log"] = str(server.log_path)
    results["connect"] = connect


def connect_line(results: dict[str, Any]) -> str:
    """``bench (warm Spark Connect): pipeline X s, spark-native Y s, ratio=R``."""
    h = results["headline"]
    return (
        f"bench (warm Spark Connect): pipeline {h['connect_pipeline_s']:.1f} s, "
        f"spark-native {h['connect_spark_native_s']:.1f} s, ratio={h['connect_ratio']:.2f}"
    )

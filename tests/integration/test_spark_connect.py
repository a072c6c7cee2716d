"""The DAG in ``spark.mode: connect``: its Spark tasks are clients of one warm Spark Connect server.

One local Spark Connect server for the module (``local[2]``, from a clean
environment: its Python workers get the package only from the archive each
session adds, and the storage credentials only inside the pickled task
functions). ``airflow dags test`` runs the DAG with the ``spark_connect``
connection pointing at it, as the provider's hook reads it. In order:

1. an insert-only snapshot and a copy-on-write MERGE with updates, partition
   moves, deletes and inserts: the replay invariant holds on both, and the
   storage secret shows in no log, nor in the server's UI (Connect tab, SQL
   plans);
2. duplicate keys: the task fails with the pipeline's AmbiguousUpdateError
   message first, not a gRPC error around a Python traceback; nothing moves.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import urllib.request
import uuid
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from cdc_devtools.airflow_env import connect_connection, connection_env_var
from cdc_devtools.connect_server import COORDINATOR_JAVA_OPTIONS, LocalSparkConnectServer
from cdc_devtools.cow import cow_merge
from cdc_devtools.local_s3 import free_port
from cdc_devtools.orders import BY_REGION, SCHEMA, rows
from cdc_devtools.replay import assert_replay
from tests.support.airflow_pipeline import AirflowPipeline
from tests.support.iceberg_tables import cow_rewrite, live_files
from tests.support.scenario import Scenario

pytestmark = [pytest.mark.s3, pytest.mark.e2e]
# The unit-error run continues the table the insert-and-merge runs built.
HISTORY = Scenario(__name__)

# moto takes any key: a distinctive one, to look for in every log and page the run leaves.
SECRET = "cdc-connect-secret-4f1c9a7e"


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> LocalSparkConnectServer:
    work = tmp_path_factory.mktemp("spark-connect")
    with LocalSparkConnectServer(work, master="local[2]", ui_port=free_port()) as running:
        process = running.process
        yield running
    assert process is not None and process.poll() is not None, "server stopped by pid"


@pytest.fixture(scope="module")
def pipeline(moto_server, server, tmp_path_factory) -> AirflowPipeline:
    tmp = tmp_path_factory.mktemp("connect-e2e")
    pipeline = AirflowPipeline(tmp, moto_server, SCHEMA, partition_spec=BY_REGION, spark={"mode": "connect"})
    pipeline.config["catalog"]["s3.secret-access-key"] = SECRET
    pipeline.config_path.write_text(yaml.safe_dump(pipeline.config))
    pipeline.env[connection_env_var("spark_connect_default")] = connect_connection(server.url)
    pipeline.env["CDC_TASK_RETRIES"] = "0"
    return pipeline


def server_pages(server: LocalSparkConnectServer) -> str:
    """The server UI's Connect tab and every SQL execution's plan, as text."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    base = f"http://127.0.0.1:{server.ui_port}"

    def get(path: str) -> str:
        with opener.open(base + path, timeout=10) as response:
            return response.read().decode("utf-8", "replace")

    apps = json.loads(get("/api/v1/applications"))
    pages = [get("/connect/"), get("/SQL/")]
    for app in apps:
        pages.append(get(f"/api/v1/applications/{app['id']}/sql?details=true&planDescription=true"))
    return "\n".join(pages)


@HISTORY.step("insert and merge")
def test_insert_only_and_merge_through_spark_connect(pipeline: AirflowPipeline, server):
    source = pipeline.source
    source.append(rows(range(0, 60), "us"))
    inserted = source.current_snapshot().snapshot_id
    assert pipeline.run() == 0, pipeline.log_tail()
    log = pipeline.last_log.read_text()
    assert "Spark Connect session on 127.0.0.1" in log and "spark-submit" not in log
    assert assert_replay(source, pipeline.sink(), inserted, ["id"]) == Counter({"INSERT": 60})

    updated = rows(range(0, 20), ["eu"] * 5 + ["us"] * 15, status="shipped")  # 5 move us -> eu
    merged = cow_merge(
        source, upserts=pa.concat_tables([updated, rows(range(100, 105), "eu")]), delete_keys=range(40, 50)
    )
    assert pipeline.run() == 0, pipeline.log_tail()
    assert pipeline.watermark().snapshot_id == merged
    assert assert_replay(source, pipeline.sink(), merged, ["id"]) == Counter(
        {"UPDATE_BEFORE": 20, "UPDATE_AFTER": 20, "DELETE": 10, "INSERT": 5}
    )
    assert pipeline.shuffle_objects() == [] and not pipeline.lease_exists()

    for path in [*pipeline.logs.iterdir(), server.log_path]:
        assert SECRET not in path.read_text(errors="replace"), f"the secret is in {path}"
    pages = server_pages(server)
    assert "cdc_write_units" in pages, "the SQL plans were read"
    assert SECRET not in pages, "the secret shows in the Spark Connect server's UI"


@HISTORY.step("unit error", after=("insert and merge",))
def test_unit_error_shows_the_pipelines_message_first(pipeline: AirflowPipeline):
    source = pipeline.source
    mark = pipeline.watermark()
    before = source.scan().to_arrow()
    kept = [i for i in before.column("id").to_pylist() if i != 3]
    after = pa.concat_tables(
        [
            before.filter(pa.compute.is_in(before.column("id"), pa.array(kept))),
            rows([3], "us", "a"),
            rows([3], "us", "b"),
        ]
    )
    snapshot = cow_rewrite(source, live_files(source), after.cast(before.schema))
    code = pipeline.run()
    log = pipeline.last_log.read_text()
    assert code != 0, log[-3000:]
    assert "DagRun failed" in log, log[-3000:]
    assert pipeline.watermark() == mark, "a failed run must not move the watermark"
    assert pipeline.shuffle_objects() == [] and not pipeline.lease_exists(), "cleanup ran"
    message = re.search(r"AmbiguousUpdateError: (.*)", log)
    assert message and "id=3" in message.group(1), log[-4000:]
    first_error = min(
        log.index(word)
        for word in ("AmbiguousUpdateError", "PythonException", "Traceback", "grpc")
        if word in log
    )
    assert log.index("AmbiguousUpdateError") == first_error, log[first_error - 500 : first_error + 2000]
    # The failure Airflow reports for the task is the pipeline's exception itself.
    assert re.search(r"iceberg_cdc\.errors\.AmbiguousUpdateError: .*id=3", log), log[-4000:]
    assert snapshot != mark.snapshot_id


def test_a_closed_shared_session_gives_way_to_the_next(server, tmp_path):
    """The server closed today's shared session (it timed out): clients move on to the next id."""
    from iceberg_cdc.pipeline import connect_app, connect_sessions

    digest = f"test-{uuid.uuid4().hex}"
    closed = connect_sessions._new_session(
        connect_app.with_session_id(server.url, connect_app.shared_session_id(digest, 0))
    )
    assert closed.range(1).count() == 1
    closed.stop()  # releases it: the server keeps a tombstone, the id cannot be reopened
    module = tmp_path / "cdc_probe.py"
    module.write_text("VALUE = 1\n")
    try:
        spark = connect_app.session(server.url, str(module), digest)
        assert spark.client._session_id == connect_app.shared_session_id(digest, 1)
        assert spark.range(2).count() == 2
    finally:
        connect_app.forget_session(server.url)


WORKER_ENV_PROBE = """
def worker_env(batches):
    import os
    import pyarrow as pa

    for _ in batches:
        yield pa.RecordBatch.from_pydict({"value": [os.environ.get("MIMALLOC_PURGE_DELAY", "unset")]})
"""


def test_the_servers_python_workers_keep_their_memory(server):
    """The local server starts its Python workers with WORKER_ENV (Arrow's allocator keeps freed memory)."""
    from pyspark.sql import SparkSession

    namespace = {"__name__": "__main__"}  # pickled by value: the worker cannot import this module
    exec(WORKER_ENV_PROBE, namespace)
    spark = SparkSession.builder.remote(server.url).create()
    try:
        rows = spark.range(0, 2, 1, 2).mapInArrow(namespace["worker_env"], "value string").collect()
    finally:
        spark.stop()
    assert [row.value for row in rows] == ["-1", "-1"]


def test_the_servers_jvm_runs_the_jits_first_tier_only(server):
    """spark-submit gives the client-mode driver JVM the coordinator's options (COORDINATOR_JAVA_OPTIONS)."""
    assert server.process is not None
    group = os.getpgid(server.process.pid)
    jvms = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                words = (entry / "cmdline").read_bytes().decode().split("\0")
                if os.getpgid(int(entry.name)) == group and "SparkConnectServer" in " ".join(words):
                    jvms.append(words)
    assert len(jvms) == 1 and Path(jvms[0][0]).name == "java", jvms
    assert COORDINATOR_JAVA_OPTIONS in jvms[0]


EXIT_PROBE = """
import atexit, sys
from pyspark.sql.connect.client import core

def probe(self):  # pyspark's exit hook sends this command; a closed client never does
    print("ml-cache-cleanup sent", flush=True)

core.SparkConnectClient._cleanup_ml_cache = probe
from iceberg_cdc.pipeline import connect_sessions
if sys.argv[2] == "forked":
    atexit._clear()  # what Airflow's task process does after its fork (supervisor._fork_main)
spark = connect_sessions.session(sys.argv[1], digest="exit-probe")
print("rows", spark.range(3).count(), flush=True)
"""


@pytest.mark.parametrize("start", ["plain", "forked"])
def test_a_task_process_exits_without_pyspark_exit_command(server, start):
    """The client is closed before pyspark's exit hook, which would send a command the server answers slowly.

    A Spark 4.2 server took about 5 s to answer that ML-cache clean-up, and
    an Airflow task process holds its executor slot until it exits.
    """
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", EXIT_PROBE, server.url, start], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rows 3" in done.stdout
    assert "ml-cache-cleanup sent" not in done.stdout


FORK_PROBE = """
import subprocess, sys, threading
import cdc_devtools.children as children  # before gRPC, as every module that starts children imports it
from pyspark.sql import SparkSession

spark = SparkSession.builder.remote(sys.argv[1]).create()
done = threading.Event()

def queries():
    while not done.is_set():
        spark.range(100).selectExpr("sum(id)").collect()

worker = threading.Thread(target=queries)
worker.start()
for _ in range(100):
    subprocess.run(["true"], preexec_fn=children.die_with_parent(), check=True)
done.set()
worker.join()
print("forked 100", flush=True)
"""


def test_children_fork_without_grpcs_fork_handlers(server):
    """A process that used a Connect client forks its children past gRPC's fork handlers.

    Those handlers run in fork() (a preexec_fn forces fork) and once waited for good in a test
    worker starting a Connect server: with them on, gRPC logs from ``fork_posix.cc`` while
    another thread is in a call.
    """
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}  # the import sets it
    done = subprocess.run(
        [sys.executable, "-c", FORK_PROBE, server.url], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "forked 100" in done.stdout
    assert "fork_posix" not in done.stderr, done.stderr[-3000:]

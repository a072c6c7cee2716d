"""The ``mirror_join`` phase on real Spark: spark-submit (local) and a local Spark Connect server.

The mirror's steps run in process as the mirror DAG's tasks would; each
group of ``join_args`` runs as the DAG's mapped Spark task runs it: a
``spark-submit`` of the pipeline's entry point with the package shipped by
``--py-files``, or :func:`iceberg_cdc.pipeline.connect_app.run_group` on a
warm Spark Connect server. The mirror lives on the moto S3 server (the
executors read and write it themselves) in a SQLite catalog, and after every
apply it must hold exactly the source's rows, read by pyiceberg and DuckDB.
"""

from __future__ import annotations

import os
import random
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml

from cdc_devtools.connect_server import LocalSparkConnectServer
from cdc_devtools.inline_pipeline import SOURCE, InlinePipeline
from cdc_devtools.local_s3 import free_port
from cdc_devtools.replay import multiset
from cdc_devtools.spark_cluster import SPARK_HOME
from iceberg_cdc.airflow.operators.spark import spark_application
from iceberg_cdc.mirror.iceberg import phase as mirror_phase
from iceberg_cdc.pipeline import connect_app
from iceberg_cdc.pipeline.pyfiles import package_zip
from iceberg_cdc.pipeline.submit_conf import submit_conf
from tests.support.duckdb_reader import read_iceberg
from tests.support.history import HistoryShape, HistoryTable
from tests.support.mirror_harness import MirrorHarness, MirrorTarget

pytestmark = [pytest.mark.s3, pytest.mark.e2e]

SHAPE = HistoryShape(columns=("string", "double", "timestamptz"), identifier=("id",), partitioning="bucket")


def _pipeline(tmp_path, s3_client, s3_properties) -> InlinePipeline:
    bucket = f"mirror-spark-{uuid.uuid4().hex[:10]}"
    s3_client.create_bucket(Bucket=bucket)
    return InlinePipeline(
        tmp_path,
        catalog={"warehouse": f"s3://{bucket}/wh", **s3_properties},
        shuffle={"uri": f"s3://{bucket}/shuffle", "write_task_size": "8KB", **s3_properties},
    )


def _history(pipeline: InlinePipeline, format_version: int, mode: str) -> tuple[HistoryTable, MirrorHarness]:
    history = HistoryTable(pipeline.create_source(SHAPE.schema(), partition_spec=SHAPE.spec()), SHAPE)
    target = MirrorTarget("mirror.orders", mode=mode, format_version=format_version)
    return history, MirrorHarness(pipeline.config, SOURCE, target, ("id",))


def _applies(
    history: HistoryTable, harness: MirrorHarness, s3_properties, run_units, count: int = 2
) -> list[dict]:
    rng = random.Random(11)
    history.append(rng, 80)
    results = []
    for _ in range(count):
        state = history.state()
        net = harness.net_changes(rng, state, history.table.current_snapshot().snapshot_id)
        results.append(harness.apply(net, state, run_units=run_units))
        mirror = harness.mirror()
        names = state.column_names
        assert multiset(mirror.scan().to_arrow(), names) == multiset(state, names)
        assert multiset(read_iceberg(mirror.metadata_location, s3_properties), names) == multiset(
            state, names
        )
        history.merge(rng, update=0.2, move=0.0, noop=0.1, delete=0.1, inserts=10, reinserts=3)
    return results


def test_mirror_join_through_spark_submit(tmp_path, s3_client, s3_properties):
    pipeline = _pipeline(tmp_path, s3_client, s3_properties)
    config_path = tmp_path / "cdc.yaml"
    config_path.write_text(yaml.safe_dump(pipeline.raw))
    history, harness = _history(pipeline, 3, "merge-on-read")
    env = {**os.environ, "CDC_CONFIG": str(config_path), "SPARK_HOME": str(SPARK_HOME)}
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(Path(__file__).parents[2] / "plugins"), env.get("PYTHONPATH")])
    )
    groups_run = []

    def spark_submit(planned: dict) -> None:
        for args in planned["join_args"]:
            command = [str(SPARK_HOME / "bin" / "spark-submit"), "--master", "local[2]"]
            for key, value in submit_conf().items():
                command += ["--conf", f"{key}={value}"]
            command += ["--py-files", package_zip(), spark_application(), *args]
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
            groups_run.append(args)

    results = _applies(history, harness, s3_properties, spark_submit)
    assert groups_run and all(a[:2] == ["--phase", "mirror_join"] for a in groups_run)
    assert results[-1]["committed"]["rows.replaced"] > 0  # the second apply found rows to replace on Spark


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    with LocalSparkConnectServer(
        tmp_path_factory.mktemp("mirror-connect"), master="local[2]", ui_port=free_port()
    ) as running:
        yield running


def test_mirror_join_on_spark_connect(tmp_path, s3_client, s3_properties, connect_server):
    pipeline = _pipeline(tmp_path, s3_client, s3_properties)
    history, harness = _history(pipeline, 2, "copy-on-write")

    # The process driving a group knows the mirror's phase as the Connect operator makes it known.
    mirror_phase.register()

    def on_connect(planned: dict) -> None:
        for group, label in enumerate(planned["labels"]):
            connect_app.run_group(
                connect_server.url, harness.ctx.runtime, planned["plan"], "mirror_join", group, label=label
            )

    results = _applies(history, harness, s3_properties, on_connect)
    assert results[-1]["committed"]["files.removed"] > 0  # copy-on-write rewrote files on Spark

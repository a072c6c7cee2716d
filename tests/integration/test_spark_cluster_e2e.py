"""The DAG on a real Spark standalone cluster: a master and a worker on 127.0.0.1.

The DAG's Spark connection points at ``spark://127.0.0.1:<port>``; Airflow
(``airflow dags test``) submits each phase in client mode, and the worker's
executors — separate JVMs and Python workers started from a clean
environment (no ``PYTHONPATH``, no ``CDC_CONFIG``) — get the package only
through ``--py-files`` and reach S3 (moto over HTTP) themselves. The history
comes from the random history generator with fixed seeds: an insert-only
snapshot, then a copy-on-write MERGE with updates, partition moves, deletes and
inserts. The replay invariant must hold on both, and the master and worker
are stopped by their process ids when the module ends.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from cdc_devtools.replay import assert_replay
from cdc_devtools.spark_cluster import LocalSparkCluster
from tests.support.airflow_pipeline import AirflowPipeline
from tests.support.history import HistoryShape, HistoryTable

pytestmark = [pytest.mark.s3, pytest.mark.e2e]

SHAPE = HistoryShape(
    columns=("string", "decimal", "timestamptz", "list"), identifier=("id",), partitioning="region"
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> LocalSparkCluster:
    with LocalSparkCluster(tmp_path_factory.mktemp("spark-cluster"), cores_per_worker=2) as running:
        daemons = list(running.processes)
        yield running
    assert all(process.poll() is not None for process in daemons), "master and worker stopped by pid"


@pytest.fixture(scope="module")
def pipeline(cluster, moto_server, tmp_path_factory) -> AirflowPipeline:
    return AirflowPipeline(
        tmp_path_factory.mktemp("cluster-e2e"),
        moto_server,
        SHAPE.schema(),
        partition_spec=SHAPE.spec(),
        spark_master=cluster.master_url,
        spark={
            "executor_memory": "1g",
            "conf": {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"},
        },
    )


def _applications(cluster: LocalSparkCluster) -> list[Path]:
    return sorted(cluster.worker_dir(0).glob("app-*"))


def test_insert_then_merge_with_deletes_on_the_cluster(cluster: LocalSparkCluster, pipeline: AirflowPipeline):
    history = HistoryTable(pipeline.source, SHAPE)
    rng = random.Random(20261122)

    (inserted,) = history.append(rng, 120)
    assert pipeline.run() == 0, pipeline.log_tail()
    assert assert_replay(pipeline.source, pipeline.sink(), inserted, ["id"]) == Counter({"INSERT": 120})

    (merged,) = history.merge(rng, update=0.2, move=0.5, noop=0.2, delete=0.1, inserts=5, reinserts=0)
    assert pipeline.run() == 0, pipeline.log_tail()
    counts = assert_replay(pipeline.source, pipeline.sink(), merged, ["id"])
    assert counts["DELETE"] == 12 and counts["INSERT"] == 5 and counts["UPDATE_BEFORE"] > 0
    assert pipeline.watermark().snapshot_id == merged
    assert pipeline.shuffle_objects() == [] and not pipeline.lease_exists()

    # Every phase ran as an application of the cluster, on the worker's executors.
    completed = [app["name"] for app in cluster.state()["completedapps"]]
    assert sorted(name.rsplit(" ", 2)[-2] for name in completed) == ["insert", "read", "write"], completed
    applications = _applications(cluster)
    assert len(applications) == 3
    # Built once per package version, not per task: one archive in the cache after three submissions.
    archives = [p.name for p in Path(pipeline.env["CDC_PACKAGE_CACHE"]).glob("*.zip")]
    assert len(archives) == 1 and archives[0].startswith("iceberg_cdc-"), archives
    # Executors had no PYTHONPATH: they imported the package from the --py-files archive Spark shipped them.
    for app in applications:
        assert list(app.glob(f"*/{archives[0]}")), f"{app} did not receive {archives[0]}"

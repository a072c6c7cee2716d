"""One chain per table under the real scheduler: a chained run's id names the snapshot it processed.

Airflow's API server, scheduler, DAG processor and triggerer on 127.0.0.1
(:class:`~cdc_devtools.scheduler.LocalAirflow`, LocalExecutor, 2 slots), Spark
Connect ``local[2]``, moto S3, a SQLite catalog. The table runs on an hourly
clock *and* the source's events, so unpausing it starts two runs at once (the
clock's catch-up run of the last tick and the watcher's event run) -- the two
starters that used to start two chains, whose predicted ids named snapshots
the other chain had already taken.

Several snapshots are committed while the DAG is paused, then it is unpaused
and nothing is triggered by hand. Measured: every snapshot is processed by
exactly one run, every ``chained__s<id>`` run processed snapshot ``<id>``, and
the runs that processed nothing say which chained run they left it to.
"""

from __future__ import annotations

import time

import pytest
import yaml

from cdc_devtools.orders import SCHEMA, rows
from cdc_devtools.replay import assert_replay
from cdc_devtools.scheduler import LocalAirflow
from iceberg_cdc.run.story import chained_snapshot
from tests.support.airflow_pipeline import DAG_ID, AirflowPipeline

pytestmark = [pytest.mark.s3, pytest.mark.e2e]

TIMEOUT = 1500.0  # a run is ~13 task processes: minutes each on a loaded 2-core machine
PENDING = 3


@pytest.fixture(scope="module")
def pipeline(moto_server, spark_connect, tmp_path_factory) -> AirflowPipeline:
    pipeline = AirflowPipeline(
        tmp_path_factory.mktemp("chain-e2e"), moto_server, SCHEMA, connect=spark_connect
    )
    pipeline.config["tables"][0]["schedule"] = "@hourly"  # a catch-up run of the last tick at unpause
    pipeline.config["events"] = {"poll_interval": "2s"}  # and the watcher's event run
    pipeline.config_path.write_text(yaml.safe_dump(pipeline.config))
    pipeline.env["CDC_TASK_RETRIES"] = "0"
    return pipeline


def test_unpausing_with_pending_snapshots_runs_one_chain_whose_ids_name_what_was_processed(
    pipeline, tmp_path
):
    snapshots = []
    for batch in range(PENDING):
        pipeline.source.append(rows(range(batch * 10, batch * 10 + 10)))
        snapshots.append(pipeline.source.current_snapshot().snapshot_id)

    with LocalAirflow(pipeline.env, tmp_path / "airflow", parallelism=2, triggerer=True) as airflow:
        airflow.wait_for_dag(DAG_ID)
        airflow.unpause(DAG_ID)
        deadline = time.monotonic() + TIMEOUT
        while True:
            airflow.check_running()
            mark = pipeline.watermark() if pipeline.catalog.table_exists("shop.orders_changes") else None
            if mark is not None and mark.snapshot_id == snapshots[-1]:
                break
            failed = [r["dag_run_id"] for r in airflow.runs(DAG_ID) if r["state"] == "failed"]
            assert not failed, f"failed runs: {failed}"
            if time.monotonic() > deadline:
                seen = [(r["dag_run_id"], r["state"], r.get("note")) for r in airflow.runs(DAG_ID)]
                pytest.fail(
                    f"{PENDING} snapshots not processed in {TIMEOUT:.0f} s (watermark {mark}): {seen}"
                )
            time.sleep(5)
        runs = airflow.wait_until_idle(DAG_ID, timeout=TIMEOUT, quiet=15.0)

        assert all(r["state"] == "success" for r in runs), runs
        starters = {r["run_type"] for r in runs if not r["dag_run_id"].startswith("chained__")}
        assert starters <= {"scheduled", "asset_triggered"}, runs
        processed: dict[int, str] = {}
        for run in runs:
            run_id = run["dag_run_id"]
            detected = airflow.xcom(DAG_ID, run_id, "detect")
            snapshot = int(detected["snapshot_id"]) if detected.get("snapshot_id") else None
            named = chained_snapshot(run_id)
            if run_id.startswith("chained__"):
                assert named is not None and snapshot == named, f"{run_id} processed {snapshot}"
            if snapshot is None:
                # A second starter that found the chain live says so (or nothing was pending at all).
                reason = detected.get("reason") or ""
                assert reason.startswith("left to the chain: run chained__") or not reason, (run_id, reason)
                continue
            assert snapshot not in processed, f"{snapshot} processed by {processed[snapshot]} and {run_id}"
            processed[snapshot] = run_id

    assert sorted(processed) == sorted(snapshots), processed  # one run per snapshot, each exactly once
    chained = [run_id for run_id in processed.values() if run_id.startswith("chained__")]
    assert len(chained) == PENDING - 1, processed  # one chain: the first run, then its chained runs
    for snapshot_id in snapshots:
        assert_replay(pipeline.source, pipeline.sink(), snapshot_id, ["id"])

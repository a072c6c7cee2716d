"""Small snapshots' phases in the Airflow task's own process (``spark.in_process_below``), end to end.

Real S3 (moto over HTTP), a SQLite catalog, ``airflow dags test``. The Spark
connection points at a master nothing listens on, so a phase that tried Spark
would fail the run: every phase group of these snapshots must run in the task
process. An insert-only snapshot, then a copy-on-write MERGE with partition
moves (shuffle): the replay invariant holds, the story says ``in process``,
and nothing is left on the shuffle store.
"""

from __future__ import annotations

import re
from collections import Counter

import pyarrow as pa
import pytest

from cdc_devtools.cow import cow_merge
from cdc_devtools.orders import BY_REGION, SCHEMA, rows
from cdc_devtools.replay import assert_replay
from tests.support.airflow_pipeline import AirflowPipeline

pytestmark = [pytest.mark.s3, pytest.mark.e2e]


@pytest.fixture(scope="module")
def pipeline(moto_server, tmp_path_factory) -> AirflowPipeline:
    return AirflowPipeline(
        tmp_path_factory.mktemp("in-process"),
        moto_server,
        SCHEMA,
        partition_spec=BY_REGION,
        spark_master="spark://127.0.0.1:9",  # nothing listens there: Spark would fail the run
        spark={"in_process_below": "64MB"},
    )


def note_of(log: str) -> str:
    """The run's note, as the plugin's listener wrote it when the run ended."""
    found = re.findall(r"note of \S+: (.*?) \[iceberg_cdc\]", log)
    assert found, log[-3000:]
    return found[-1]


def test_small_snapshots_run_their_phases_in_the_task_process(pipeline: AirflowPipeline):
    source = pipeline.source
    source.append(rows(range(0, 40), "us"))
    inserted = source.current_snapshot().snapshot_id
    assert pipeline.run() == 0, pipeline.log_tail()
    log = pipeline.last_log.read_text()
    assert "insert 1/1: 1 tasks, 1 files" in log and "runs in this process, no Spark job" in log, log[-3000:]
    assert "spark-submit" not in log, "no Spark job was started"
    assert assert_replay(source, pipeline.sink(), inserted, ["id"]) == Counter({"INSERT": 40})
    assert re.search(r"\+40 -0 ±0 updates, insert [\d.]+ s in process$", note_of(log)), note_of(log)

    updated = rows(range(0, 10), ["eu"] * 4 + ["us"] * 6, status="shipped")  # 4 move us -> eu
    merged = cow_merge(source, upserts=pa.concat_tables([updated, rows([200], "eu")]), delete_keys=[30, 31])
    assert pipeline.run() == 0, pipeline.log_tail()
    log = pipeline.last_log.read_text()
    assert "spark-submit" not in log
    assert len(re.findall(r"(write|read) 1/1: .* runs in this process, no Spark job", log)) == 2, log[-3000:]
    assert re.search(r"write [\d.]+ s in process / read [\d.]+ s in process$", note_of(log)), note_of(log)
    assert pipeline.watermark().snapshot_id == merged
    assert assert_replay(source, pipeline.sink(), merged, ["id"]) == Counter(
        {"UPDATE_BEFORE": 10, "UPDATE_AFTER": 10, "DELETE": 2, "INSERT": 1}
    )
    assert pipeline.shuffle_objects() == [] and not pipeline.lease_exists()

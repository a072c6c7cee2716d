"""End to end: real S3 (moto over HTTP), a SQLite catalog, airflow dags test, spark-submit.

One table history, one DAG run per step, in order (the tests share the
module's state; each DAG run costs ~20-60 s, mostly JVM starts). Each test
declares the step it continues (:class:`tests.support.scenario.Scenario`):
run alone or after a failed predecessor it fails at once saying so.

1. insert-only snapshot (no shuffle)
2. copy-on-write MERGE with partition moves, deletes and inserts (shuffle)
3. replace (compaction) snapshot: skipped, watermark moves
4. a run that fails (Spark unreachable), then the retry: nothing lost or duplicated
5. an idle run: nothing changes
6. a manual reprocess, a manual run of an unknown snapshot
7. a merge-on-read upsert (equality deletes and new rows in one commit)
8. the table upgraded to format v3, and a MERGE written as deletion vectors

Every step checks the replay invariant for the snapshot it processed.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from pyiceberg.manifest import FileFormat

from cdc_devtools.airflow_env import dags_test
from cdc_devtools.cow import cow_merge, table_state
from cdc_devtools.format_v3 import upgrade_to_v3
from cdc_devtools.mor import mor_merge
from cdc_devtools.mor_state import snapshot_entries
from cdc_devtools.orders import BY_REGION, SCHEMA, rows
from cdc_devtools.replay import assert_replay, changes_of
from cdc_devtools.sync import sync
from tests.support.airflow_pipeline import DAG_ID, AirflowPipeline
from tests.support.iceberg_tables import live_files, replace_files
from tests.support.scenario import Scenario

pytestmark = [pytest.mark.s3, pytest.mark.e2e]
# Every test but the unknown-snapshot one continues the history of the one before it.
HISTORY = Scenario(__name__)


class Pipeline(AirflowPipeline):
    def __init__(self, tmp: Path, s3) -> None:
        super().__init__(tmp, s3, SCHEMA, partition_spec=BY_REGION)

    def changes_of(self, snapshot_id: int) -> pa.Table:
        return changes_of(self.sink(), snapshot_id)

    def assert_replay(self, snapshot_id: int) -> Counter:
        """state(parent) - removed + added == state(snapshot); returns the change type counts."""
        return assert_replay(self.source, self.sink(), snapshot_id, ["id"])


@pytest.fixture(scope="module")
def pipeline(moto_server, tmp_path_factory) -> Pipeline:
    return Pipeline(tmp_path_factory.mktemp("e2e"), moto_server)


@HISTORY.step("inserts")
def test_insert_only_snapshot(pipeline: Pipeline):
    pipeline.source.append(rows(range(0, 60), "us"))
    pipeline.source.append(rows(range(60, 100), "eu"))  # a second pending snapshot
    first = pipeline.source.snapshots()[0].snapshot_id
    assert pipeline.run() == 0, pipeline.last_log.read_text()[-3000:]
    assert pipeline.watermark().snapshot_id == first
    assert pipeline.assert_replay(first) == Counter({"INSERT": 60})
    assert pipeline.shuffle_objects() == [] and not pipeline.lease_exists()
    second = pipeline.source.current_snapshot().snapshot_id
    assert pipeline.run() == 0, pipeline.last_log.read_text()[-3000:]
    assert pipeline.assert_replay(second) == Counter({"INSERT": 40})


@HISTORY.step("merge", after=("inserts",))
def test_copy_on_write_merge_with_partition_moves(pipeline: Pipeline):
    updated = rows(range(0, 20), ["eu"] * 5 + ["us"] * 15, status="shipped")  # 5 move us -> eu
    snapshot = cow_merge(
        pipeline.source,
        upserts=pa.concat_tables([updated, rows(range(100, 105), "eu")]),
        delete_keys=range(60, 70),
    )
    assert pipeline.run() == 0, pipeline.last_log.read_text()[-3000:]
    assert pipeline.watermark().snapshot_id == snapshot
    assert pipeline.assert_replay(snapshot) == Counter(
        {"UPDATE_BEFORE": 20, "UPDATE_AFTER": 20, "DELETE": 10, "INSERT": 5}
    )
    commit = [
        s
        for s in pipeline.sink().snapshots()
        if s.summary.additional_properties.get("cdc.source-snapshot-id") == str(snapshot)
    ]
    summary = commit[0].summary.additional_properties
    assert int(summary["cdc.carryover-rows"]) == 2 * (100 - 20 - 10)  # every untouched row was rewritten
    assert int(summary["cdc.shuffle-bytes"]) > 0
    assert pipeline.shuffle_objects() == [] and not pipeline.lease_exists()


@HISTORY.step("replace", after=("merge",))
def test_replace_snapshot_is_skipped(pipeline: Pipeline):
    files = live_files(pipeline.source)
    before = len(pipeline.sink().snapshots())
    snapshot = replace_files(pipeline.source, files, pipeline.source.scan().to_arrow())
    assert pipeline.run() == 0, pipeline.last_log.read_text()[-3000:]
    assert pipeline.watermark().snapshot_id == snapshot
    assert len(pipeline.sink().snapshots()) == before
    assert pipeline.changes_of(snapshot).num_rows == 0


@HISTORY.step("failed run", after=("replace",))
def test_failed_run_then_retry_loses_and_duplicates_nothing(pipeline: Pipeline):
    mark = pipeline.watermark()
    snapshot = cow_merge(pipeline.source, delete_keys=[1, 2, 3])
    broken = {
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "nowhere-master"}),
        "CDC_TASK_RETRIES": "0",  # retrying cannot reach a master that does not exist
    }
    code = pipeline.run(env_overrides=broken)
    log = pipeline.last_log.read_text()
    # `airflow dags test` exits non-zero when the DAG run failed: a run that ends green here lost the error
    assert code != 0, log[-3000:]
    assert "DagRun failed" in log, log[-3000:]
    assert pipeline.watermark() == mark, "a failed run must not move the watermark"
    assert pipeline.changes_of(snapshot).num_rows == 0
    assert pipeline.shuffle_objects() == [], "cleanup runs after a failure"
    assert not pipeline.lease_exists(), "cleanup releases the lease after a failure"
    assert pipeline.run() == 0, pipeline.last_log.read_text()[-3000:]
    assert pipeline.watermark().snapshot_id == snapshot
    assert pipeline.assert_replay(snapshot) == Counter({"DELETE": 3})


@HISTORY.step("idle run", after=("failed run",))
def test_idle_run_changes_nothing(pipeline: Pipeline):
    sink = pipeline.sink()
    snapshots, mark = len(sink.snapshots()), pipeline.watermark()
    assert pipeline.run() == 0, pipeline.last_log.read_text()[-3000:]
    assert len(pipeline.sink().snapshots()) == snapshots
    assert pipeline.watermark() == mark
    assert sync(str(pipeline.config_path), str(pipeline.home)) == 0  # nothing pending: no run at all
    assert len(pipeline.sink().snapshots()) == snapshots
    total = pipeline.sink().scan().to_arrow()
    # two appends, the MERGE and the delete carry rows; the replace snapshot carries none
    assert np.unique(total.column("_commit_snapshot_id").to_numpy()).size == 4


@HISTORY.step("reprocess", after=("idle run",))
def test_manual_reprocess_replaces_one_snapshots_rows(pipeline: Pipeline):
    merge = next(
        int(s.summary.additional_properties["cdc.source-snapshot-id"])
        for s in pipeline.sink().snapshots()
        if s.summary.additional_properties.get("cdc.carryover-rows", "0") != "0"
    )
    before_rows = pipeline.sink().scan().to_arrow().num_rows
    mark = pipeline.watermark()
    with open(pipeline.logs / "manual.log", "w") as out:
        code = dags_test(pipeline.env, DAG_ID, {"snapshot_id": merge, "trigger_next": False}, out)
    assert code == 0, (pipeline.logs / "manual.log").read_text()[-3000:]
    assert pipeline.sink().scan().to_arrow().num_rows == before_rows, "replaced, not duplicated"
    assert pipeline.assert_replay(merge) == Counter(
        {"UPDATE_BEFORE": 20, "UPDATE_AFTER": 20, "DELETE": 10, "INSERT": 5}
    )
    assert pipeline.watermark() == mark, "a reprocess never moves the watermark backwards"


def test_manual_run_of_an_unknown_snapshot_fails_clearly(pipeline: Pipeline):
    with open(pipeline.logs / "bad-manual.log", "w") as out:
        code = dags_test(pipeline.env, DAG_ID, {"snapshot_id": 12345, "trigger_next": False}, out)
    log = (pipeline.logs / "bad-manual.log").read_text()
    assert code != 0, log[-3000:]
    assert "12345" in log and "ancestry" in log
    assert not pipeline.lease_exists(), "a failed detect releases the lease"


@HISTORY.step("merge-on-read", after=("reprocess",))
def test_merge_on_read_snapshot_through_spark(pipeline: Pipeline):
    """A Flink-style upsert (equality deletes + new rows in one commit) through spark-submit."""
    live = pipeline.source.scan().to_arrow().sort_by("id")
    ids = live.column("id").to_pylist()
    changed = rows(ids[:4], ["ap", "ap", "eu", "us"], status="upserted")  # some move region
    gone = ids[4:7]
    snapshot = mor_merge(pipeline.source, upserts=changed, delete_keys=gone, deletes="equality")
    assert pipeline.run() == 0, pipeline.last_log.read_text()[-3000:]
    assert pipeline.watermark().snapshot_id == snapshot
    assert pipeline.assert_replay(snapshot) == Counter({"UPDATE_BEFORE": 4, "UPDATE_AFTER": 4, "DELETE": 3})


@HISTORY.step("deletion vectors", after=("merge-on-read",))
def test_deletion_vectors_through_spark(pipeline: Pipeline):
    """The table upgraded to format v3, then a MERGE as Spark writes it there: deletion vectors on S3."""
    pipeline.source = upgrade_to_v3(pipeline.source)
    live = table_state(pipeline.source, pipeline.source.current_snapshot().snapshot_id).sort_by("id")
    ids = live.column("id").to_pylist()
    changed = rows(ids[10:13], ["eu", "us", "us"], status="merged")
    snapshot = mor_merge(pipeline.source, upserts=changed, delete_keys=ids[13:15], deletes="position")
    dvs = [
        e for e in snapshot_entries(pipeline.source, snapshot) if e.data_file.file_format == FileFormat.PUFFIN
    ]
    assert dvs, "the MERGE wrote deletion vectors"
    assert pipeline.run() == 0, pipeline.last_log.read_text()[-3000:]
    assert pipeline.watermark().snapshot_id == snapshot
    assert pipeline.assert_replay(snapshot) == Counter({"UPDATE_BEFORE": 3, "UPDATE_AFTER": 3, "DELETE": 2})

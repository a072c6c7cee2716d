"""The in-process runner: a DAG run's steps and the Spark tasks' functions, on a real catalog."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest
from pyiceberg.schema import Schema

from cdc_devtools.cow import cow_merge
from cdc_devtools.inline_pipeline import SOURCE, InlinePipeline
from cdc_devtools.orders import BY_REGION, SCHEMA, rows
from cdc_devtools.replay import assert_replay


def test_history_through_every_path(tmp_path):
    pipeline = InlinePipeline(tmp_path)
    source = pipeline.create_source(SCHEMA, partition_spec=BY_REGION)
    source.append(rows(range(100), "us"))
    merge = cow_merge(
        source,
        upserts=pa.concat_tables([rows(range(10), ["eu"] * 3 + ["us"] * 7, "shipped"), rows([500], "eu")]),
        delete_keys=[50, 51],
    )
    runs = pipeline.catch_up()
    assert [r.action for r in runs] == ["insert", "shuffle"]
    assert pipeline.watermark().snapshot_id == merge
    assert assert_replay(pipeline.source, pipeline.sink, merge, ["id"]) == Counter(
        {"UPDATE_BEFORE": 10, "UPDATE_AFTER": 10, "DELETE": 2, "INSERT": 1}
    )
    assert runs[1].committed["carryover_rows"] == 2 * (100 - 12)
    assert runs[1].cleanup["lease_released"] and runs[1].cleanup["shuffle_objects_deleted"] > 0
    assert pipeline.run().action == "caught_up"


def test_a_table_without_identifier_columns_runs_in_whole_row_mode(tmp_path):
    """No identifier fields and none configured: the whole row is the key (DELETE / INSERT only)."""
    pipeline = InlinePipeline(tmp_path)
    schema = Schema(*SCHEMA.fields)  # the same columns, no identifier fields
    source = pipeline.create_source(schema, partition_spec=BY_REGION)
    source.append(rows(range(20), "us"))
    merge = cow_merge(source, upserts=rows(range(3), "us", "shipped"), delete_keys=[7])
    runs = pipeline.catch_up()
    assert [r.action for r in runs] == ["insert", "shuffle"]
    assert assert_replay(pipeline.source, pipeline.sink, merge, []) == Counter({"DELETE": 4, "INSERT": 3})


def test_a_snapshot_run_twice_in_a_row_fails_at_once(tmp_path, monkeypatch):
    """A watermark that does not move stops the loop at the second run, not 10,000 runs later."""
    from cdc_devtools import inline_run
    from iceberg_cdc.errors import CdcError

    pipeline = InlinePipeline(tmp_path)
    pipeline.create_source(SCHEMA, partition_spec=BY_REGION).append(rows(range(5), "us"))
    first = inline_run.run_snapshot(pipeline.config, SOURCE)
    assert first.action == "insert"
    runs = Counter()

    def stuck(config, source, **_):
        runs["again"] += 1
        return first

    monkeypatch.setattr(inline_run, "run_snapshot", stuck)
    with pytest.raises(CdcError, match=rf"snapshot {first.snapshot_id} ran again .*watermark did not move"):
        pipeline.catch_up()
    assert runs["again"] == 2

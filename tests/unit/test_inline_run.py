"""The in-process runner: a DAG run's steps and the Spark tasks' functions, on a real catalog."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa

from cdc_devtools.cow import cow_merge
from cdc_devtools.orders import BY_REGION, SCHEMA, rows
from cdc_devtools.replay import assert_replay
from tests.support.inline_pipeline import InlinePipeline


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

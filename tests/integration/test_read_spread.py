"""A small shuffle is read by ``shuffle.min_read_ranges`` tasks (Spark's minPartitionNum), changes exact."""

from __future__ import annotations

from collections import Counter

import pytest

from cdc_devtools.cow import cow_merge
from cdc_devtools.inline_pipeline import InlinePipeline
from cdc_devtools.orders import BY_REGION, SCHEMA, rows


@pytest.mark.parametrize("min_read_ranges", [1, 3])
def test_min_read_ranges_sets_the_read_tasks_of_a_small_shuffle(tmp_path, min_read_ranges):
    p = InlinePipeline(
        tmp_path,
        shuffle={
            "partitions": 16,
            "target_partition_size": "32KB",  # the shuffle (about 23 KB) is below it: one range unless spread
            "min_read_ranges": min_read_ranges,
        },
    )
    p.create_source(SCHEMA, partition_spec=BY_REGION)
    p.source.append(rows(range(2000), region=["us", "eu"] * 1000))
    assert [r.action for r in p.catch_up()] == ["insert"]
    cow_merge(p.source, upserts=rows(range(0, 2000, 2), region="eu", status="moved"))  # 1,000 move
    run = p.run()
    assert run.action == "shuffle"
    assert len(run.units["read"]) == min_read_ranges
    assert sum(u["stats"]["rows_read"] for u in run.units["read"]) == 2000  # each moved row: 2
    changes = p.sink.scan(row_filter=f"_commit_snapshot_id == {run.snapshot_id}").to_arrow()
    assert Counter(changes.column("_change_type").to_pylist()) == {
        "UPDATE_BEFORE": 1000,
        "UPDATE_AFTER": 1000,
    }

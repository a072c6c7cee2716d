"""Small phase groups in the task's own process: when, how it is recorded, and what the story says."""

from __future__ import annotations

import json

import pytest

from cdc_devtools.cow import cow_merge
from cdc_devtools.inline_pipeline import InlinePipeline
from cdc_devtools.orders import BY_REGION, SCHEMA, rows
from iceberg_cdc.config import parse_config
from iceberg_cdc.pipeline import in_process
from iceberg_cdc.pipeline.in_process import (
    IN_PROCESS,
    InProcessUnitRunner,
    in_process_phases,
    in_process_reason,
    run_if_small,
)
from iceberg_cdc.pipeline.plan import SnapshotPlan
from iceberg_cdc.run import steps
from iceberg_cdc.run.story import story
from iceberg_cdc.units import MiB

DETECTED = {
    "source": "shop.orders",
    "sink": "shop.orders_changes",
    "run_id": "r1",
    "epoch": 1,
    "lease_ttl": 60,
    "action": "shuffle",
    "snapshot_id": "42",
    "operation": "overwrite",
    "ordinal": 7,
}


@pytest.mark.parametrize(
    ("phase", "size", "below", "here"),
    [
        ("write", 10, 32 * MiB, True),
        ("read", 32 * MiB - 1, 32 * MiB, True),
        ("insert", 0, 1, True),
        ("write", 32 * MiB, 32 * MiB, False),  # at the threshold: Spark
        ("read", 10, 0, False),  # 0: always Spark
        ("write", None, 32 * MiB, False),  # size unknown: Spark
        ("iceberg_mirror_join", 10, 32 * MiB, False),  # a registered phase: Spark
    ],
)
def test_only_groups_known_to_be_small_run_in_process(phase, size, below, here):
    reason = in_process_reason(phase, size, below)
    assert (reason is not None) is here
    if here:
        assert "below spark.in_process_below" in reason


def test_the_threshold_is_a_size_and_zero_turns_it_off():
    base = {
        "catalog": {"name": "c"},
        "shuffle": {"uri": "s3://b/p"},
        "tables": [{"source": "a.b", "sink": "a.c"}],
    }
    assert parse_config(base).spark.in_process_below == MiB
    assert parse_config({**base, "spark": {"in_process_below": "8MB"}}).spark.in_process_below == 8 * MiB
    assert parse_config({**base, "spark": {"in_process_below": 0}}).spark.in_process_below == 0
    connect = {"mode": "connect", "connect_url": "sc://h:1", "in_process_below": "1MiB"}
    assert parse_config({**base, "spark": connect}).spark.in_process_below == MiB


def test_phases_whose_every_group_ran_in_process():
    records = [
        {"phase": "detect", "seconds": 0.1},
        {"phase": "write", "group": 0, "runner": IN_PROCESS},
        {"phase": "write", "group": 1, "runner": IN_PROCESS},
        {"phase": "read", "group": 0, "runner": IN_PROCESS},
        {"phase": "read", "group": 1, "runner": "spark"},  # one group on Spark: the phase did not
        {"phase": "coalesce", "seconds": 0.1},
    ]
    assert in_process_phases(records) == ("write",)
    assert in_process_phases([{"phase": "insert", "group": 0}]) == ()  # records from before: Spark


def test_the_story_says_which_phases_ran_in_process():
    committed = {
        "committed": True,
        "inserts": 1,
        "seconds": {"write": 0.12, "read": 2.5},
        "in_process": ["write"],
    }
    assert (
        story(DETECTED, committed)
        == "snapshot 42 (overwrite, #7): +1 -0 ±0 updates, write 0.1 s in process / read 2.5 s"
    )


def test_a_cancelled_runner_stops_before_its_next_unit(monkeypatch):
    calls = []
    runner = InProcessUnitRunner()

    def unit(plan, runtime, task):
        calls.append(task)
        runner.cancel()  # the heartbeat lost the lease while this unit ran
        return {"task": task}

    monkeypatch.setitem(in_process.PHASE_FUNCTIONS, "write", unit)
    with pytest.raises(InterruptedError, match="lost the table's lease"):
        runner.map_units("write", None, None, ["a", "b"])
    assert calls == ["a"]


def test_a_small_snapshot_runs_here_and_a_big_one_is_left_to_spark(tmp_path):
    """run_if_small on a real plan: the lease held by detect, the group recorded as run in process."""
    pipeline = InlinePipeline(tmp_path)
    source = pipeline.create_source(SCHEMA, partition_spec=BY_REGION)
    source.append(rows(range(50), "us"))
    pipeline.run()
    cow_merge(source, upserts=rows(range(5), "eu", "shipped"), delete_keys=[9])
    ctx = steps.Context.of(pipeline.config, "shop.orders")
    detected = steps.detect(ctx, "run-1")
    try:
        store = ctx.runtime.store()
        plan = SnapshotPlan.load(store, detected.plan)
        size = plan.groups[0].bytes
        assert run_if_small(ctx.runtime, detected.plan, "write", 0, below=size) is None  # at the size: Spark
        assert not store.list(plan.paths.stats("write-0000"))
        done = run_if_small(ctx.runtime, detected.plan, "write", 0, below=size + 1, label="write 1/1")
        assert done is not None and len(done.results) == len(plan.groups[0].task_ids)
        record = json.loads(store.get(plan.paths.stats("write-0000")))
        assert record["runner"] == IN_PROCESS
        missing, failed = steps.missing_map_outputs(ctx, detected)
        assert not set(plan.groups[0].task_ids) & set(missing) and not failed, (
            "the group's map outputs are there"
        )
    finally:
        steps.cleanup(ctx, detected, "run-1")

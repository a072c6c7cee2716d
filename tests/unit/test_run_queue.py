"""At most one ordinary run queues behind a busy table; the others end at once, taking no lease."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import yaml

from cdc_devtools.inline_pipeline import SOURCE, InlinePipeline
from cdc_devtools.orders import BY_REGION, SCHEMA, rows
from iceberg_cdc.run.queue import run_ahead

OWN = "asset_triggered__2026-12-07T10:00:05+00:00"


@pytest.mark.parametrize(
    ("others", "ahead"),
    [
        ({}, None),
        # a chained run not yet past detect: it was started for the next snapshot
        ({"chained__s42__x": {"queued"}}, "chained__s42__x"),
        ({"chained__s42__x": {"success"}}, None),  # it took its snapshot already
        # an ordinary run sorting before this one and still waiting for the table
        (
            {"asset_triggered__2026-12-07T10:00:00+00:00": {"up_for_reschedule"}},
            "asset_triggered__2026-12-07T10:00:00",
        ),
        ({"asset_triggered__2026-12-07T10:00:00+00:00": {"running"}}, "asset_triggered__2026-12-07T10:00:00"),
        ({"asset_triggered__2026-12-07T10:00:00+00:00": {"success"}}, None),  # holds the table or is done
        (
            {"asset_triggered__2026-12-07T10:00:09+00:00": {"queued"}},
            None,
        ),  # after this one: it leaves instead
        ({"scheduled__2026-12-07T09:00:00+00:00": {"none"}}, None),  # sorts after "asset_triggered__"
        ({"manual__2026-12-07T09:00:00+00:00": {"queued"}}, None),  # may be a reprocess: never waited on
        ({"backfill__2026-12-07T09:00:00+00:00": {"queued"}}, None),
    ],
)
def test_which_run_an_ordinary_run_leaves_the_table_to(others, ahead):
    reason = run_ahead(OWN, {OWN: {"running"}, **others})
    if ahead is None:
        assert reason is None
    else:
        assert reason is not None and ahead in reason


def test_of_any_set_of_queued_ordinary_runs_exactly_one_goes_on():
    runs = {
        "asset_triggered__2026-12-07T10:00:01+00:00": {"up_for_reschedule"},
        "asset_triggered__2026-12-07T10:00:02+00:00": {"queued"},
        "scheduled__2026-12-07T10:00:00+00:00": {"running"},
        "manual__2026-12-07T10:00:00+00:00": {"running"},
    }
    going_on = [run for run in runs if run_ahead(run, runs) is None]
    assert going_on == ["asset_triggered__2026-12-07T10:00:01+00:00"]  # a manual run without conf leaves too


class FakeTaskInstance:
    """The Task SDK calls detect makes about other runs."""

    def __init__(self, states: dict[str, dict[str, str | None]]) -> None:
        self.states = states
        self.try_number = 1

    def get_task_states(self, **kwargs):
        return self.states

    def get_dagrun_state(self, dag_id, run_id):
        return "running"

    def get_first_reschedule_date(self, context):
        return None


def test_detect_leaves_the_table_to_a_run_ahead_without_taking_the_lease(tmp_path, monkeypatch):
    from airflow.sdk import DAG

    from iceberg_cdc.airflow.operators.detect import DetectOperator
    from iceberg_cdc.run import steps

    pipeline = InlinePipeline(tmp_path)
    pipeline.create_source(SCHEMA, partition_spec=BY_REGION).append(rows(range(5), "us"))
    config = tmp_path / "cdc.yaml"
    config.write_text(yaml.safe_dump(pipeline.raw))
    monkeypatch.setenv("CDC_CONFIG", str(config))
    with DAG("cdc__shop__orders", schedule=None):
        detect = DetectOperator(task_id="detect", source=SOURCE)
    ahead = "asset_triggered__2026-12-07T10:00:00+00:00"
    ti = FakeTaskInstance({ahead: {"detect": "up_for_reschedule"}, OWN: {"detect": "running"}})
    context = {"params": {}, "ti": ti, "dag_run": SimpleNamespace(run_type="asset_triggered"), "run_id": OWN}

    left = detect.execute(context)
    assert left["action"] == "caught_up" and ahead in left["reason"] and left["epoch"] == 0
    ctx = steps.Context.of(pipeline.config, SOURCE)
    assert ctx.lease().current() is None, "no lease was taken"
    assert steps.cleanup(ctx, left, OWN) == {
        "shuffle_objects_deleted": 0,
        "lease_released": False,
        "staged_kept": False,
    }

    # The run ahead has taken its snapshot: this run queues and processes the next one itself.
    ti.states[ahead] = {"detect": "success"}
    taken = detect.execute(context)
    assert taken["action"] == "insert" and taken["epoch"] >= 1
    steps.cleanup(ctx, taken, OWN)

    # A reprocess run (snapshot_id) never leaves: it was asked for.
    ti.states[ahead] = {"detect": "queued"}
    manual = {**context, "params": {"snapshot_id": taken["snapshot_id"]}, "run_id": "manual__x"}
    reprocess = detect.execute(manual)
    assert reprocess["action"] == "insert" and reprocess["manual"] and reprocess["epoch"] >= 1
    steps.cleanup(ctx, reprocess, "manual__x")

"""Backfills, manual runs and range reprocesses under the real scheduler, judged by the replay invariant.

``airflow dags test`` runs one DAG run at a time, so it never shows what a
deployment does with several: here Airflow's API server, scheduler and DAG
processor run on 127.0.0.1 (:class:`~cdc_devtools.scheduler.LocalAirflow`,
a LocalExecutor with 2 slots) and the DAG's Spark tasks are clients of one
local Spark Connect server (``local[2]``); moto S3 over HTTP, a SQLite
catalog. In order, on one table:

1. unpausing the DAG makes one scheduled run: it processes the first snapshot;
2. ``airflow backfill create`` over three dates with the default
   ``max_active_runs`` (10: the three runs start together) while three
   snapshots are pending (an append, and MERGEs with updates, partition moves
   and deletes): every run succeeds, each processes one pending snapshot, in
   order, exactly once; no two runs' work overlaps; no run chains (every run
   of the DAG is the scheduled one or the backfill's); replay holds for every
   snapshot and the sink folded from empty equals the table;
3. a backfill with ``snapshot_id`` in its conf fails in detect with the
   documented message, committing nothing;
4. a manual run over the REST API with ``{"snapshot_id": <past id>}``
   replaces that snapshot's rows (no duplicates) and does not chain;
5. ``{"snapshot_id": A, "through_snapshot_id": B}`` reprocesses A..B, one run
   per snapshot, in order, chained, rows replaced; a reversed range is refused
   naming the fix.

Finally every process Airflow started is gone.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from datetime import datetime
from types import SimpleNamespace

import pyarrow as pa
import pytest
import yaml

from cdc_devtools.cow import cow_merge
from cdc_devtools.orders import BY_REGION, SCHEMA, rows
from cdc_devtools.process_tree import alive
from cdc_devtools.replay import assert_replay, changes_of
from cdc_devtools.scheduler import LocalAirflow
from tests.support.airflow_pipeline import DAG_ID, AirflowPipeline
from tests.support.fault_runs import verdict
from tests.support.scenario import Scenario

pytestmark = [pytest.mark.s3, pytest.mark.e2e]
# Each test continues the history of the one before it (the module docstring lists them in order).
HISTORY = Scenario(__name__)

RUN_TIMEOUT = 600.0


@pytest.fixture(scope="module")
def pipeline(moto_server, spark_connect, tmp_path_factory) -> AirflowPipeline:
    tmp = tmp_path_factory.mktemp("scheduler-e2e")
    pipeline = AirflowPipeline(tmp, moto_server, SCHEMA, partition_spec=BY_REGION, connect=spark_connect)
    # Monthly: unpausing makes one scheduled run (this month's), and a backfill gets one run a month.
    pipeline.config["tables"][0]["schedule"] = "@monthly"
    pipeline.config_path.write_text(yaml.safe_dump(pipeline.config))
    pipeline.env["CDC_TASK_RETRIES"] = "0"
    return pipeline


@pytest.fixture(scope="module")
def airflow(pipeline: AirflowPipeline, tmp_path_factory):
    local = LocalAirflow(pipeline.env, tmp_path_factory.mktemp("airflow-components"), parallelism=2)
    with local:
        local.wait_for_dag(DAG_ID)
        yield local
        started = local.pids()
    assert started, "the components were running"
    leftovers = [pid for pid in started if alive(pid)]
    assert not leftovers, f"processes left after stop: {leftovers}"


@pytest.fixture(scope="module")
def state() -> SimpleNamespace:
    """What the ordered tests of this module hand on to each other."""
    return SimpleNamespace(snapshots=[], run_ids=set())


def judged(pipeline: AirflowPipeline):
    return verdict(SimpleNamespace(source=pipeline.source, sink=pipeline.sink()))


def new_runs(airflow: LocalAirflow, state: SimpleNamespace) -> list[dict]:
    """Runs of the DAG not seen by an earlier step (all final), oldest first; remembered as seen."""
    runs = airflow.wait_until_idle(DAG_ID, timeout=RUN_TIMEOUT)
    fresh = [r for r in runs if r["dag_run_id"] not in state.run_ids]
    state.run_ids |= {r["dag_run_id"] for r in fresh}
    return fresh


def detected(airflow: LocalAirflow, run: dict) -> dict:
    """Detect's XCom, with its snapshot id back as an int (the XCom carries it as a string of digits)."""
    found = airflow.xcom(DAG_ID, run["dag_run_id"], "detect")
    if found.get("snapshot_id") is not None:
        found["snapshot_id"] = int(found["snapshot_id"])
    return found


def stamp(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def work_interval(airflow: LocalAirflow, run: dict) -> tuple[float, float]:
    """From the run's first task after detect to its commit's end: inside its hold on the table."""
    tis = airflow.task_instances(DAG_ID, run["dag_run_id"])
    starts = [stamp(t["start_date"]) for t in tis if t["task_id"] != "detect" and t["start_date"]]
    commit = next(t for t in tis if t["task_id"] == "commit")
    return min(starts), stamp(commit["end_date"])


@HISTORY.step("unpause")
def test_unpausing_runs_the_first_snapshot(pipeline: AirflowPipeline, airflow: LocalAirflow, state):
    pipeline.source.append(rows(range(0, 40), "us"))
    first = pipeline.source.current_snapshot().snapshot_id
    state.snapshots.append(first)
    airflow.unpause(DAG_ID)
    deadline = time.monotonic() + 60
    while not airflow.runs(DAG_ID):
        assert time.monotonic() < deadline, "unpausing made no scheduled run"
        time.sleep(1)
    runs = new_runs(airflow, state)
    assert [(r["run_type"], r["state"]) for r in runs] == [("scheduled", "success")]
    assert pipeline.watermark().snapshot_id == first
    assert assert_replay(pipeline.source, pipeline.sink(), first, ["id"]) == Counter({"INSERT": 40})


@HISTORY.step("backfill", after=("unpause",))
def test_backfill_processes_every_pending_snapshot_once_in_order(
    pipeline: AirflowPipeline, airflow: LocalAirflow, state
):
    source = pipeline.source
    source.append(rows(range(40, 60), "eu"))
    pending = [source.current_snapshot().snapshot_id]
    moved = rows(range(0, 10), ["eu"] * 3 + ["us"] * 7, status="shipped")  # 3 move us -> eu
    pending.append(
        cow_merge(
            source, upserts=pa.concat_tables([moved, rows(range(100, 104), "eu")]), delete_keys=range(50, 55)
        )
    )
    pending.append(cow_merge(source, upserts=rows([20], "eu", status="moved"), delete_keys=[1, 2]))
    state.snapshots += pending

    created = airflow.backfill(DAG_ID, "2024-01-01T00:00:00", "2024-03-01T00:00:00")
    assert created.returncode == 0, created.stdout + created.stderr
    runs = new_runs(airflow, state)
    airflow.wait_for_backfills(DAG_ID)

    assert {r["run_type"] for r in runs} == {"backfill"}, "a run outside the backfill (a chained run?)"
    assert len(runs) == len(pending), [r["dag_run_id"] for r in runs]
    assert [r["state"] for r in runs] == ["success"] * len(pending)
    found = {r["dag_run_id"]: detected(airflow, r) for r in runs}
    for run in runs:
        states = airflow.task_states(DAG_ID, run["dag_run_id"])
        found_here = found[run["dag_run_id"]]
        assert found_here["action"] in ("insert", "shuffle"), f"{run['dag_run_id']} processed nothing"
        assert states["commit"] == "success" and states["watermark"] == "success", states
        assert states["trigger_next_run"] == "skipped", states
        # Skipped by watermark (airflow/chain.py), not by a task process of its own.
        trigger = next(
            t for t in airflow.task_instances(DAG_ID, run["dag_run_id"]) if t["task_id"] == "trigger_next_run"
        )
        assert not trigger.get("pid") and not trigger.get("hostname"), trigger
    # In order: the runs took the table one after another (lease epochs), oldest snapshot first.
    by_epoch = sorted(found.values(), key=lambda d: d["epoch"])
    assert [d["snapshot_id"] for d in by_epoch] == pending
    assert any(d["action"] == "shuffle" for d in by_epoch), "the shuffle path ran"
    # Never overlapping: each run's work lies inside its hold on the table.
    intervals = sorted(work_interval(airflow, r) for r in runs)
    for (_, end), (start, _) in itertools.pairwise(intervals):
        assert start >= end, f"two runs worked on the table at once: {intervals}"

    assert pipeline.watermark().snapshot_id == pending[-1]
    result = judged(pipeline)
    assert result.exact, result
    assert result.commits == Counter(dict.fromkeys(state.snapshots, 1))
    assert [d for d in pipeline.shuffle_objects()] == [] and not pipeline.lease_exists()


@HISTORY.step("refused backfill", after=("backfill",))
def test_backfill_with_a_snapshot_id_is_refused(pipeline: AirflowPipeline, airflow: LocalAirflow, state):
    sink_snapshots = len(pipeline.sink().snapshots())
    mark = pipeline.watermark()
    created = airflow.backfill(
        DAG_ID, "2024-06-01T00:00:00", "2024-06-01T00:00:00", conf={"snapshot_id": state.snapshots[2]}
    )
    assert created.returncode == 0, created.stdout + created.stderr
    runs = new_runs(airflow, state)
    airflow.wait_for_backfills(DAG_ID)
    assert [(r["run_type"], r["state"]) for r in runs] == [("backfill", "failed")]
    log = airflow.task_log(DAG_ID, runs[0]["dag_run_id"], "detect")
    assert f"snapshot_id={state.snapshots[2]} is not allowed in a backfill" in log, log[-3000:]
    assert '{"snapshot_id": <id>}' in log
    assert len(pipeline.sink().snapshots()) == sink_snapshots and pipeline.watermark() == mark


@HISTORY.step("manual run", after=("refused backfill",))
def test_manual_run_reprocesses_a_past_snapshot_without_chaining(
    pipeline: AirflowPipeline, airflow: LocalAirflow, state
):
    merge = state.snapshots[2]
    sink = pipeline.sink()
    before_rows, before_changes = sink.scan().to_arrow().num_rows, changes_of(sink, merge).num_rows
    mark = pipeline.watermark()
    triggered = airflow.trigger(DAG_ID, {"snapshot_id": merge})
    runs = new_runs(airflow, state)
    assert [r["dag_run_id"] for r in runs] == [triggered["dag_run_id"]], "the reprocess chained"
    assert runs[0]["state"] == "success" and runs[0]["run_type"] == "manual"
    states = airflow.task_states(DAG_ID, triggered["dag_run_id"])
    assert states["commit"] == "success" and states["trigger_next_run"] == "skipped", states
    assert detected(airflow, runs[0])["snapshot_id"] == merge

    sink = pipeline.sink()
    assert sink.scan().to_arrow().num_rows == before_rows, "replaced, not duplicated"
    assert changes_of(sink, merge).num_rows == before_changes
    assert assert_replay(pipeline.source, sink, merge, ["id"]) == Counter(
        {"UPDATE_BEFORE": 10, "UPDATE_AFTER": 10, "DELETE": 5, "INSERT": 4}
    )
    assert pipeline.watermark() == mark
    result = judged(pipeline)
    assert result.exact and max(result.commits.values()) == 1, result


@HISTORY.step("range reprocess", after=("manual run",))
def test_range_reprocess_runs_one_chained_run_per_snapshot(
    pipeline: AirflowPipeline, airflow: LocalAirflow, state
):
    first, through = state.snapshots[2], state.snapshots[3]
    before_rows = pipeline.sink().scan().to_arrow().num_rows
    mark = pipeline.watermark()
    triggered = airflow.trigger(DAG_ID, {"snapshot_id": first, "through_snapshot_id": through})
    runs = new_runs(airflow, state)
    assert [r["state"] for r in runs] == ["success"] * 2, [(r["dag_run_id"], r["state"]) for r in runs]
    assert runs[0]["dag_run_id"] == triggered["dag_run_id"]
    assert [detected(airflow, r)["snapshot_id"] for r in runs] == [first, through]
    assert runs[1]["dag_run_id"].split("__")[:2] == ["reprocess", f"s{through}"]
    assert airflow.task_states(DAG_ID, runs[-1]["dag_run_id"])["trigger_next_run"] == "skipped"
    assert pipeline.sink().scan().to_arrow().num_rows == before_rows, "replaced, not duplicated"
    assert pipeline.watermark() == mark
    result = judged(pipeline)
    assert result.exact and max(result.commits.values()) == 1, result

    reversed_range = airflow.trigger(DAG_ID, {"snapshot_id": through, "through_snapshot_id": first})
    runs = new_runs(airflow, state)
    assert [(r["dag_run_id"], r["state"]) for r in runs] == [(reversed_range["dag_run_id"], "failed")]
    log = airflow.task_log(DAG_ID, reversed_range["dag_run_id"], "detect")
    assert f"through_snapshot_id {first} comes before snapshot_id {through}" in log, log[-3000:]
    assert pipeline.sink().scan().to_arrow().num_rows == before_rows

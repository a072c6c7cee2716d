"""The steps every Spark driver of a phase group shares (spark-submit and Spark Connect alike).

The units run in this process through a stand-in runner, on a real plan
made by detect: figures on success, failure markers for unfinished write
tasks on failure, and a lost lease that cancels the job and is the error.
"""

from __future__ import annotations

import json
import threading
import time

import pyarrow as pa
import pytest

from cdc_devtools.cow import cow_merge
from cdc_devtools.inline_pipeline import SOURCE, InlinePipeline
from cdc_devtools.orders import BY_REGION, SCHEMA, rows
from iceberg_cdc.errors import AmbiguousUpdateError, LeaseLostError, StorageError
from iceberg_cdc.pipeline.groups import PHASE_FUNCTIONS
from iceberg_cdc.pipeline.phase_driver import run_phase_group
from iceberg_cdc.pipeline.plan import SnapshotPlan
from iceberg_cdc.run import steps


class InProcess:
    """Runs the units here, as the in-process runner does; optionally fails or waits to be cancelled."""

    def __init__(self, fail: Exception | None = None, on_start=None) -> None:
        self.fail = fail
        self.on_start = on_start
        self.cancelled = threading.Event()

    def map_units(self, phase, plan, runtime, units):
        if self.on_start is not None:
            self.on_start(plan)
            assert self.cancelled.wait(10), "the heartbeat cancels the job when the lease is lost"
            raise RuntimeError("job cancelled")
        if self.fail is not None:
            raise self.fail
        return [PHASE_FUNCTIONS[phase](plan, runtime, unit) for unit in units]

    def cancel(self) -> None:
        self.cancelled.set()


@pytest.fixture
def planned(tmp_path, monkeypatch):
    """A MERGE snapshot detected (its plan saved, the lease held), ready for its write phase."""
    monkeypatch.setenv("CDC_LEASE_TTL_SECONDS", "1")  # heartbeats every 0.25 s
    pipeline = InlinePipeline(tmp_path)
    source = pipeline.create_source(SCHEMA, partition_spec=BY_REGION)
    source.append(rows(range(40), "us"))
    pipeline.run()
    cow_merge(source, upserts=pa.concat_tables([rows(range(5), "eu", "shipped")]), delete_keys=[30])
    ctx = steps.Context.of(pipeline.config, SOURCE)
    detected = steps.detect(ctx, "run-1", None)
    assert detected.action == "shuffle"
    store = ctx.runtime.store()
    return ctx, store, SnapshotPlan.load(store, detected.plan), detected


def test_success_records_the_groups_figures(planned):
    ctx, store, plan, detected = planned
    run = run_phase_group(ctx.runtime, detected.plan, "write", 0, lambda _: InProcess())
    assert run.units == list(plan.groups[0].task_ids) and len(run.results) == len(run.units)
    stats = json.loads(store.get(plan.paths.stats("write-0000")))
    assert stats["phase"] == "write" and stats["units"] == run.results
    assert not store.list(plan.paths.failed_prefix)


def test_a_failed_write_group_marks_its_unfinished_tasks(planned):
    ctx, store, plan, detected = planned
    error = AmbiguousUpdateError("key (id=3) ...")
    with pytest.raises(AmbiguousUpdateError):
        run_phase_group(ctx.runtime, detected.plan, "write", 0, lambda _: InProcess(fail=error))
    for task_id in plan.groups[0].task_ids:
        marker = json.loads(store.get(plan.paths.failed(task_id)))
        assert marker == {
            "task_id": task_id,
            "error": "iceberg_cdc.errors.AmbiguousUpdateError: key (id=3) ...",
        }
    assert not store.list(plan.paths.stats("write-0000"))


def test_a_lost_lease_cancels_the_job_and_is_the_error(planned):
    ctx, store, plan, detected = planned
    runner = InProcess(on_start=lambda plan: ctx.lease().release(plan.run_id, plan.epoch))
    with pytest.raises(LeaseLostError):
        run_phase_group(ctx.runtime, detected.plan, "write", 0, lambda _: runner)
    assert runner.cancelled.is_set()
    marker = json.loads(store.get(plan.paths.failed(plan.groups[0].task_ids[0])))
    assert "LeaseLostError" in marker["error"]


def test_no_spark_is_started_without_the_lease(planned):
    ctx, _, plan, detected = planned
    ctx.lease().release(plan.run_id, plan.epoch)
    started = []
    with pytest.raises(LeaseLostError):
        run_phase_group(ctx.runtime, detected.plan, "write", 0, lambda p: started.append(p) or InProcess())
    assert started == []


def test_error_line_finds_the_pipeline_error_inside_a_jvm_traceback():
    from iceberg_cdc.errors import AmbiguousUpdateError
    from iceberg_cdc.pipeline.phase_driver import error_line

    wrapped = RuntimeError(
        "An error occurred while calling o42.collectAndServe.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: ...\n"
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "/x/executor_tasks.py", line 200, in run_read_task\n'
        "iceberg_cdc.errors.AmbiguousUpdateError: table shop.orders, snapshot 7: cannot pair updates for "
        "identifier (id=3); set `duplicate_keys: emit_unpaired`\n"
        "\tat org.apache.spark.api.python.BasePythonRunner...\n"
    )
    assert error_line(wrapped) == (
        "AmbiguousUpdateError: table shop.orders, snapshot 7: cannot pair updates for identifier (id=3); "
        "set `duplicate_keys: emit_unpaired`"
    )
    assert error_line(AmbiguousUpdateError("key 3")) == "AmbiguousUpdateError: key 3"
    assert error_line(OSError("disk full")) == "OSError: disk full"


def test_a_spark_error_never_carries_the_runtimes_secrets():
    """The line recorded for the Airflow task goes through the one redaction module (iceberg_cdc.redaction)."""
    from iceberg_cdc.pipeline.phase_driver import error_line
    from iceberg_cdc.pipeline.runtime import Runtime

    secret = "sk-" + "0123456789abcdef"
    runtime = Runtime(
        "file:///tmp/x", {"s3.secret-access-key": secret}, {"s3.session-token": "tok-" + "998877"}
    )
    wrapped = RuntimeError(
        "org.apache.spark.api.python.PythonException: Traceback\n"
        f"iceberg_cdc.errors.StorageError: s3://bucket refused key {secret} with tok-998877\n"
    )
    line = error_line(wrapped, runtime)
    assert secret not in line and "tok-998877" not in line
    assert line.startswith("StorageError: s3://bucket refused key ***")


def test_a_store_error_recording_the_failure_leaves_the_units_error(planned, monkeypatch):
    """Recording a failure meets a store error: logged, and the unit's own error is the task's."""
    from iceberg_cdc.pipeline import phase_driver

    ctx, _, _, detected = planned

    def store_down(*args, **kwargs):
        raise StorageError("the shuffle store is down")

    monkeypatch.setattr(phase_driver, "record_group_error", store_down)
    monkeypatch.setattr(phase_driver, "mark_failed_writes", store_down)
    error = AmbiguousUpdateError("key (id=3) ...")
    with pytest.raises(AmbiguousUpdateError):
        run_phase_group(ctx.runtime, detected.plan, "write", 0, lambda _: InProcess(fail=error))


@pytest.mark.parametrize("where", ["record_group_error", "mark_failed_writes"])
def test_an_unexpected_error_recording_the_failure_is_not_swallowed(planned, monkeypatch, where):
    """A bug in the failure path fails the task as itself (the unit's error chained), never silently."""
    from iceberg_cdc.pipeline import phase_driver

    ctx, _, _, detected = planned

    def bug(*args, **kwargs):
        raise TypeError("a bug in the failure path")

    monkeypatch.setattr(phase_driver, where, bug)
    error = AmbiguousUpdateError("key (id=3) ...")
    with pytest.raises(TypeError, match="failure path") as raised:
        run_phase_group(ctx.runtime, detected.plan, "write", 0, lambda _: InProcess(fail=error))
    assert raised.value.__context__ is error


def test_an_unexpected_heartbeat_error_fails_the_group(planned, monkeypatch):
    """A renewal that fails with a bug stops the heartbeat; the group fails with it instead of running on unrenewed."""
    from iceberg_cdc.coordination.lease import TableLease

    ctx, _, _, detected = planned
    real_renew = TableLease.renew
    calls = []

    def renew(self, *args, **kwargs):
        calls.append(1)
        if len(calls) > 1:  # the driver's own lease check passes; the heartbeat's renewals fail
            raise AttributeError("a bug in the renewal")
        return real_renew(self, *args, **kwargs)

    monkeypatch.setattr(TableLease, "renew", renew)
    started = threading.Event()

    class Slow(InProcess):
        def map_units(self, phase, plan, runtime, units):
            started.set()
            deadline = time.monotonic() + 10
            while len(calls) < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
            return super().map_units(phase, plan, runtime, units)

    with pytest.raises(AttributeError, match="renewal"):
        run_phase_group(ctx.runtime, detected.plan, "write", 0, lambda _: Slow())
    assert started.is_set()

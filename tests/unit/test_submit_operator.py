"""The spark-submit task's failure says the pipeline's error first (``CdcSparkSubmitOperator``).

When spark-submit fails, the operator looks up the error line the phase
driver recorded for its group and raises it in place of the provider's
``Cannot execute: spark-submit ...``: final errors (no retry can fix them)
as ``AirflowFailException``, others as a retryable ``AirflowException``; with
no recorded line, the provider's own exception.

Only the spark-submit call is replaced. The error is recorded by the real
phase driver (``run_phase_group`` with a runner whose units fail) in a real
``file://`` shuffle store, for a snapshot plan made by detect and for a
mirror's apply plan (the ``mirror_join`` phase, whose plan is not a snapshot
plan); the operator reads it back through the config named by the task's
own ``--config`` argument.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from cdc_devtools.cow import cow_merge
from cdc_devtools.inline_pipeline import SOURCE, InlinePipeline
from cdc_devtools.orders import BY_REGION, SCHEMA, rows
from iceberg_cdc.airflow.compat import AirflowException, AirflowFailException
from iceberg_cdc.airflow.operators.spark import CdcSparkSubmitOperator
from iceberg_cdc.coordination.lease import TableLease
from iceberg_cdc.errors import AmbiguousUpdateError, MirrorSchemaError
from iceberg_cdc.mirror.iceberg import phase as mirror_phase
from iceberg_cdc.mirror.iceberg.phase import PHASE as MIRROR_JOIN
from iceberg_cdc.mirror.iceberg.plan import ApplyPlan
from iceberg_cdc.pipeline.phase_driver import run_phase_group
from iceberg_cdc.run import steps

PROVIDER = "Cannot execute: spark-submit --master local ... Error code is: 1."


class Failing:
    """A unit runner whose units raise ``error`` (what a failed Spark job does to the driver)."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def map_units(self, phase, plan, runtime, units):
        raise self.error

    def cancel(self) -> None:
        pass


@pytest.fixture(autouse=True)
def failing_submit(monkeypatch):
    def fail(self, context):
        raise AirflowException(PROVIDER)

    monkeypatch.setattr(SparkSubmitOperator, "execute", fail)


@pytest.fixture
def pipeline(tmp_path) -> tuple[InlinePipeline, str]:
    """A pipeline on a file:// shuffle store and SQLite catalog, and its config file (the task's --config)."""
    pipeline = InlinePipeline(tmp_path)
    config_file = Path(tmp_path) / "cdc.yaml"
    # The operator's Spark path is under test: its tiny groups must not run in the task's process.
    config_file.write_text(
        yaml.safe_dump({**pipeline.raw, "spark": {**pipeline.raw["spark"], "in_process_below": 0}})
    )
    return pipeline, str(config_file)


def _args(config: str, phase: str, plan: str, group: int) -> list[str]:
    return ["--phase", phase, "--plan", plan, "--group", str(group), "--label", f"{phase} {group + 1}",
            "--config", config]  # fmt: skip


def _execute(args: list[str]) -> None:
    CdcSparkSubmitOperator(task_id="phase", application="app.py", application_args=args).execute({})


@pytest.fixture
def snapshot_plan(pipeline, monkeypatch) -> tuple[InlinePipeline, str, str]:
    """A MERGE snapshot detected (its plan saved, the lease held): the config file and the plan key."""
    monkeypatch.setenv("CDC_LEASE_TTL_SECONDS", "30")
    inline, config = pipeline
    source = inline.create_source(SCHEMA, partition_spec=BY_REGION)
    source.append(rows(range(40), "us"))
    inline.run()
    cow_merge(source, upserts=pa.concat_tables([rows(range(5), "eu", "shipped")]), delete_keys=[30])
    ctx = steps.Context.of(inline.config, SOURCE)
    detected = steps.detect(ctx, "run-1", None)
    assert detected.action == "shuffle"
    return inline, config, detected.plan


def test_a_final_error_of_a_snapshot_group_fails_the_task_at_once_error_first(snapshot_plan):
    inline, config, plan = snapshot_plan
    runtime = steps.Context.of(inline.config, SOURCE).runtime
    error = AmbiguousUpdateError("key (id=3) has 2 DELETE rows; set `duplicate_keys: emit_unpaired`")
    with pytest.raises(AmbiguousUpdateError):
        run_phase_group(runtime, plan, "write", 0, lambda _: Failing(error))

    with pytest.raises(AirflowFailException) as raised:
        _execute(_args(config, "write", plan, 0))
    assert str(raised.value).startswith(
        "AmbiguousUpdateError: key (id=3) has 2 DELETE rows; set `duplicate_keys: emit_unpaired`\n"
        "(spark-submit failed"
    )


def test_a_transient_error_of_a_snapshot_group_is_retried_error_first(snapshot_plan):
    inline, config, plan = snapshot_plan
    runtime = steps.Context.of(inline.config, SOURCE).runtime
    with pytest.raises(ConnectionResetError):
        run_phase_group(runtime, plan, "write", 0, lambda _: Failing(ConnectionResetError("reset by peer")))

    with pytest.raises(AirflowException) as raised:
        _execute(_args(config, "write", plan, 0))
    assert not isinstance(raised.value, AirflowFailException)
    assert str(raised.value).startswith("ConnectionResetError: reset by peer\n(spark-submit failed")


def test_a_snapshot_group_that_recorded_nothing_leaves_the_providers_exception(snapshot_plan):
    _, config, plan = snapshot_plan
    with pytest.raises(AirflowException, match=r"^Cannot execute: spark-submit") as raised:
        _execute(_args(config, "write", plan, 0))
    assert not isinstance(raised.value, AirflowFailException)


def _mirror_plan(inline: InlinePipeline) -> tuple[ApplyPlan, str]:
    """A saved two-group mirror apply plan whose run holds the mirror's lease.

    Its phase is registered as the Spark application registers it (spark_entry): the groups are
    run here by ``run_phase_group`` in the test's process, which imports nothing that would.
    """
    mirror_phase.register()
    store = steps.Context.of(inline.config, SOURCE).runtime.store()
    lease_name = "_mirrors/shop.orders/ice"
    held = TableLease(store, lease_name).acquire("mirror-run-1", 60.0)
    plan = ApplyPlan(
        mirror="mirror.orders",
        source=SOURCE,
        lease_name=lease_name,
        run_id="mirror-run-1",
        epoch=held.epoch,
        lease_ttl_seconds=60.0,
        through={"changelog_snapshot_id": 7, "source_snapshot_id": 1, "ordinal": 1},
        key_columns=["id"],
        mode="merge-on-read",
        format_version=2,
        base_snapshot_id=None,
        metadata_json="{}",
        location="file:///nowhere",
        staging_dir="file:///nowhere/data/_staging/mirror-run-1",
        key_count=1,
        upsert_rows=0,
        delete_rows=0,
        units=[],
        groups=[["unit-0"], ["unit-1"]],
    )
    return plan, plan.save(store)


def test_a_final_error_of_a_mirror_group_fails_that_task_at_once_and_not_its_sibling(pipeline):
    inline, config = pipeline
    key = _mirror_plan(inline)[1]
    runtime = steps.Context.of(inline.config, SOURCE).runtime
    error = MirrorSchemaError("mirror mirror.orders has no column id; add it or drop it from key_columns")
    with pytest.raises(MirrorSchemaError):
        run_phase_group(runtime, key, MIRROR_JOIN, 1, lambda _: Failing(error))

    with pytest.raises(AirflowFailException) as raised:
        _execute(_args(config, MIRROR_JOIN, key, 1))
    assert str(raised.value).startswith(
        "MirrorSchemaError: mirror mirror.orders has no column id; add it or drop it from key_columns\n"
        "(spark-submit failed"
    )
    # Group 0 recorded nothing: its task fails with the provider's (retryable) exception, not group 1's line.
    with pytest.raises(AirflowException, match=r"^Cannot execute: spark-submit") as sibling:
        _execute(_args(config, MIRROR_JOIN, key, 0))
    assert not isinstance(sibling.value, AirflowFailException)


def test_a_transient_error_of_a_mirror_group_is_retried_error_first(pipeline):
    inline, config = pipeline
    key = _mirror_plan(inline)[1]
    runtime = steps.Context.of(inline.config, SOURCE).runtime
    with pytest.raises(TimeoutError):
        run_phase_group(runtime, key, MIRROR_JOIN, 0, lambda _: Failing(TimeoutError("read timed out")))

    with pytest.raises(AirflowException) as raised:
        _execute(_args(config, MIRROR_JOIN, key, 0))
    assert not isinstance(raised.value, AirflowFailException)
    assert str(raised.value).startswith("TimeoutError: read timed out\n(spark-submit failed")
    with pytest.raises(AirflowException, match=r"^Cannot execute: spark-submit"):
        _execute(_args(config, MIRROR_JOIN, key, 1))


def test_a_plan_the_task_cannot_read_costs_only_its_lease_renewal(pipeline, caplog):
    """A store or plan error (CdcError) setting up the renewal: spark-submit still runs, with a warning."""
    _, config = pipeline
    with pytest.raises(AirflowException, match=r"^Cannot execute: spark-submit"):
        _execute(_args(config, "write", "shop.orders/no-such/plan.json", 0))
    assert "does not renew its run's lease" in caplog.text


@pytest.mark.parametrize("where", ["renewal", "group error"])
def test_an_unexpected_error_around_spark_submit_fails_the_task_as_itself(snapshot_plan, monkeypatch, where):
    """A bug setting up the renewal, or reading the group's error, is not swallowed."""
    from iceberg_cdc.pipeline import groups, phase_driver

    _, config, plan = snapshot_plan

    def bug(*args, **kwargs):
        raise AttributeError(f"a bug in the {where}")

    if where == "renewal":
        monkeypatch.setattr(groups, "load_phase_plan", bug)
    else:
        monkeypatch.setattr(phase_driver, "read_group_error", bug)
    with pytest.raises(AttributeError, match=where):
        _execute(_args(config, "write", plan, 0))

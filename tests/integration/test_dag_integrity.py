"""The DAG files: they import, build one DAG per table with the contract's ids, and wire the flow."""

from __future__ import annotations

import pytest
import yaml

from iceberg_cdc.airflow.dag_factory import build_dags
from iceberg_cdc.config import parse_config
from tests.support.airflow_versions import dag_bag

CONFIG = {
    "catalog": {"name": "t", "type": "sql", "uri": "sqlite:////tmp/never-opened.db"},
    "shuffle": {"uri": "s3://shuffle/cdc"},
    "tables": [
        {"source": "shop.orders", "sink": "shop.orders_changes", "identifier_columns": ["id"]},
        {"source": "crm.accounts", "sink": "crm.accounts_changes", "schedule": "@daily"},
    ],
}


def upstream(dag, task_id: str) -> set[str]:
    return set(dag.get_task(task_id).upstream_task_ids)


def test_one_dag_per_table_with_contract_ids():
    dags = build_dags(parse_config(CONFIG))
    assert set(dags) == {"cdc__shop__orders", "cdc__crm__accounts"}
    # each table's own schedule, and the default where the config gives none
    assert dags["cdc__crm__accounts"].schedule == "@daily"
    assert dags["cdc__shop__orders"].schedule == "@hourly"


def test_task_graph():
    dag = build_dags(parse_config(CONFIG))["cdc__shop__orders"]
    assert {t.task_id for t in dag.tasks} == {
        "detect",
        "write_jobs",
        "insert_jobs",
        "shuffle_write",
        "barrier",
        "coalesce",
        "shuffle_read",
        "changelog_insert",
        "commit",
        "watermark",
        "trigger_next_run",
        "cleanup",
    }
    assert upstream(dag, "shuffle_write") == {"write_jobs"}
    assert upstream(dag, "barrier") == {"shuffle_write"}
    assert upstream(dag, "coalesce") == {"barrier", "detect"}
    assert upstream(dag, "shuffle_read") == {"coalesce"}
    assert upstream(dag, "changelog_insert") == {"insert_jobs"}
    assert upstream(dag, "commit") == {"shuffle_read", "changelog_insert"}
    assert upstream(dag, "trigger_next_run") == {"watermark"}
    # mapped Spark tasks show the plan's labels
    for task_id in ("shuffle_write", "shuffle_read", "changelog_insert"):
        task = dag.get_task(task_id)
        assert task.is_mapped
        assert "application_args" in task.map_index_template


def test_connect_mode_keeps_the_dags_shape_and_labels():
    """spark.mode: connect swaps only the mapped Spark tasks' operator: same ids, edges and labels."""
    submit = build_dags(parse_config(CONFIG))["cdc__shop__orders"]
    connect = build_dags(parse_config({**CONFIG, "spark": {"mode": "connect"}}))["cdc__shop__orders"]
    assert {t.task_id for t in connect.tasks} == {t.task_id for t in submit.tasks}
    for task in submit.tasks:
        assert upstream(connect, task.task_id) == upstream(submit, task.task_id), task.task_id
    for task_id in ("shuffle_write", "shuffle_read", "changelog_insert"):
        before, after = submit.get_task(task_id), connect.get_task(task_id)
        assert before.operator_name == "CdcSparkSubmitOperator"
        assert after.operator_name == "SparkConnectPhaseOperator" and after.is_mapped
        assert after.map_index_template == before.map_index_template
        assert after.partial_kwargs["conn_id"] == "spark_connect_default"


def test_connect_url_from_the_config_or_the_spark_connect_connection(monkeypatch):
    from iceberg_cdc.airflow.hooks.cdc import CdcHook
    from iceberg_cdc.errors import ConfigError

    def connect_url(config):
        return CdcHook(config).spark_connect_url()

    local = parse_config({**CONFIG, "spark": {"mode": "connect", "connect_url": "sc://127.0.0.1:15002"}})
    assert connect_url(local) == "sc://127.0.0.1:15002"
    config = parse_config({**CONFIG, "spark": {"mode": "connect", "connect_conn_id": "cdc_spark_connect"}})
    monkeypatch.setenv(
        "AIRFLOW_CONN_CDC_SPARK_CONNECT",
        '{"conn_type": "spark_connect", "host": "sc://spark.internal", "port": 15002, "password": "tok"}',
    )
    assert connect_url(config) == "sc://spark.internal:15002/;token=tok"
    monkeypatch.delenv("AIRFLOW_CONN_CDC_SPARK_CONNECT")
    with pytest.raises(ConfigError, match=r"connection 'cdc_spark_connect'.*type spark_connect"):
        connect_url(config)


def test_cleanup_is_a_teardown_that_keeps_failures():
    dag = build_dags(parse_config(CONFIG))["cdc__shop__orders"]
    cleanup = dag.get_task("cleanup")
    assert cleanup.is_teardown
    assert dag.get_task("detect").is_setup
    assert "watermark" in cleanup.upstream_task_ids
    # One chain per table: the chained run exists before cleanup gives the lease back.
    assert "trigger_next_run" in cleanup.upstream_task_ids
    assert str(dag.get_task("commit").trigger_rule) in ("none_failed", "TriggerRule.NONE_FAILED")
    # a failed write task must fail the barrier at once, not leave it polling for outputs
    assert str(dag.get_task("barrier").trigger_rule) in ("all_success", "TriggerRule.ALL_SUCCESS")


def test_guards_and_params():
    dag = build_dags(parse_config(CONFIG))["cdc__shop__orders"]
    # The lease serializes a table's runs; Airflow must let a run start while another one's task is
    # dead, or that run would wait for Airflow's 300 s task heartbeat timeout, not for the lease.
    assert dag.max_active_runs > 1
    assert dag.catchup is False
    assert set(dag.params) == {"snapshot_id", "through_snapshot_id", "trigger_next"}
    assert dag.params["snapshot_id"] is None
    assert dag.params["trigger_next"] == "auto"  # what the form shows is what happens by default


def test_snapshot_ids_in_params_are_exact():
    """The Trigger form and JSON editor send text; API callers may send integers; both arrive exact."""
    from airflow.sdk.definitions.param import ParamsDict

    from iceberg_cdc.errors import ConfigError
    from iceberg_cdc.snapshot_ids import parse

    dag = build_dags(parse_config(CONFIG))["cdc__shop__orders"]
    big = 5200992516889735211  # above 2**53: a browser's number would round it
    for given in (str(big), big, f" {big} "):
        params = ParamsDict(dict(dag.params.items()))
        params["snapshot_id"] = given
        params["through_snapshot_id"] = given
        params.validate()
        assert parse(params["snapshot_id"]) == big
    for name in ("snapshot_id", "through_snapshot_id"):
        param = dag.params.get_param(name)
        schema = param.schema
        # Airflow 3.3's form: a type list without examples is a JSON field (it rounds the digits); examples
        # add a "Start typing to see options" placeholder with no options. Neither: a plain text field.
        assert "type" not in schema and "examples" not in schema, schema
        assert "type the id's digits as iceberg shows them" in param.description.lower()
    # A typo is not refused with a JSON-schema dump by the form: detect refuses it, naming the fix.
    for bad in ("5.2e18", "52009925168897352110", "abc", 1.5, True):
        with pytest.raises(ConfigError, match=r"snapshot_id=.* Give the id as a string of digits") as refused:
            parse(bad, "snapshot_id")
        assert "Nothing was run" in str(refused.value)
    for choice in ("auto", "yes", "no", True, False, None):
        params = ParamsDict(dict(dag.params.items()))
        params["trigger_next"] = choice
        params.validate()


def test_commit_emits_the_sink_asset_only_through_its_alias():
    """A declared Asset outlet gets an event on every success (an idle run's too): commit declares an alias."""
    from airflow.sdk import Asset, AssetAlias

    from iceberg_cdc.airflow.operators.steps import asset_extra, sink_changed

    dag = build_dags(parse_config(CONFIG))["cdc__shop__orders"]
    outlets = dag.get_task("commit").outlets
    assert outlets and all(isinstance(o, AssetAlias) for o in outlets)
    assert not any(isinstance(o, Asset) for t in dag.tasks for o in t.outlets)
    # ... while the sink's asset stays known to Airflow (active, on its Assets page): watermark reads it.
    assert [a.name for a in dag.get_task("watermark").inlets] == ["cdc:shop.orders_changes"]
    assert not sink_changed({"committed": False, "reason": "caught up"})
    assert not sink_changed({"committed": False, "snapshot_id": 5, "reason": "skipped replace snapshot"})
    assert sink_changed({"committed": True, "snapshot_id": 5})
    extra = asset_extra(
        "shop.orders",
        {"snapshot_id": 5200992516889735211, "ordinal": 7, "operation": "overwrite"},
        {"committed": True, "inserts": 3, "deletes": 1, "updates": 2, "story": "snapshot ..."},
    )
    assert extra["snapshot_id"] == "5200992516889735211" and extra["ordinal"] == 7
    assert (extra["inserts"], extra["deletes"], extra["updates"]) == (3, 1, 2)


def test_dag_file_imports_through_the_dag_bag(tmp_path, monkeypatch):
    path = tmp_path / "cdc.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    monkeypatch.setenv("CDC_CONFIG", str(path))
    monkeypatch.setenv("CDC_PACKAGE_CACHE", str(tmp_path / "packages"))
    bag = dag_bag("dags")
    assert not bag.import_errors, bag.import_errors
    assert set(bag.dag_ids) == {"cdc__shop__orders", "cdc__crm__accounts"}


def test_dag_file_without_config_reports_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv("CDC_CONFIG", raising=False)
    bag = dag_bag("dags")
    assert any("CDC_CONFIG" in str(error) for error in bag.import_errors.values())


def test_every_task_records_its_error_and_the_chained_runs_note_is_rendered():
    dag = build_dags(parse_config(CONFIG))["cdc__shop__orders"]
    from iceberg_cdc.airflow.policy import record_error

    for task in dag.tasks:
        callbacks = task.on_failure_callback
        assert record_error in (callbacks if isinstance(callbacks, list) else [callbacks]), task.task_id
    trigger = dag.get_task("trigger_next_run")
    assert "note" in trigger.template_fields  # the provider's operator leaves the note unrendered

    class Ti:
        @staticmethod
        def xcom_pull(task_ids):
            return {
                "remaining": 3,
                "chained_run_id": "chained__s7__x",
                "chained_note": "chained: 3 snapshot(s) pending",
            }

    assert trigger.render_template(trigger.note, {"ti": Ti()}) == "chained: 3 snapshot(s) pending"


def test_trigger_next_run_decides_whether_to_chain_and_skips_otherwise():
    """The chain decision lives in trigger_next_run itself: it skips unless should_chain says go on."""
    import copy
    from types import SimpleNamespace

    from airflow.providers.common.compat.sdk import DagRunTriggerException

    from iceberg_cdc.airflow.compat import AirflowSkipException

    trigger = build_dags(parse_config(CONFIG))["cdc__shop__orders"].get_task("trigger_next_run")
    mark = {"remaining": 2, "next_conf": {}, "chained_run_id": "chained__s9__x", "chained_note": "n"}

    class Ti:
        def __init__(self, value):
            self.value, self.pulled = value, []

        def xcom_pull(self, task_ids):
            self.pulled.append(task_ids)
            return self.value

        def xcom_push(self, key, value):
            pass

    def run(value, params, run_type="manual"):
        operator = copy.copy(trigger)
        operator.trigger_run_id, operator.conf = value.get("chained_run_id"), {}
        ti = Ti(value)
        context = {"ti": ti, "params": params, "dag_run": SimpleNamespace(run_type=run_type)}
        operator.execute(context)

    with pytest.raises(DagRunTriggerException) as started:
        run(mark, {"trigger_next": "auto"})
    assert started.value.dag_run_id == "chained__s9__x"
    with pytest.raises(AirflowSkipException, match="no next run"):
        run({**mark, "remaining": 0}, {"trigger_next": "auto"})
    with pytest.raises(AirflowSkipException, match="no next run"):
        run(mark, {"trigger_next": "no"})
    with pytest.raises(AirflowSkipException, match="backfill"):
        run(mark, {"trigger_next": "yes"}, run_type="backfill")


MIRRORED = {
    **CONFIG,
    "tables": [
        {
            **CONFIG["tables"][0],
            "mirrors": [
                {"type": "postgres", "conn_id": "orders_pg", "table": "public.orders"},
                {"type": "iceberg", "table": "shop.orders_mirror"},
            ],
        },
        CONFIG["tables"][1],
    ],
}


def test_one_mirror_dag_per_table_and_mirror_scheduled_on_the_changelog_asset():
    from iceberg_cdc.airflow.mirror_dag import build_mirror_dags

    dags = build_mirror_dags(parse_config(MIRRORED))
    assert set(dags) == {
        "cdc_mirror__shop__orders__public__orders",
        "cdc_mirror__shop__orders__shop__orders_mirror",
    }
    for dag in dags.values():
        assert {t.task_id for t in dag.tasks} == {
            "detect",
            "plan_apply",
            "join_jobs",
            "mirror_join",
            "apply",
            "verify",
            "cleanup",
        }
        assert upstream(dag, "plan_apply") == {"detect"}
        assert upstream(dag, "mirror_join") == {"join_jobs"}
        assert upstream(dag, "apply") == {"mirror_join"}
        assert upstream(dag, "verify") == {"apply"}  # under the run's lease: before the teardown
        assert "verify" in upstream(dag, "cleanup")
        assert dag.get_task("mirror_join").is_mapped
        assert dag.get_task("cleanup").is_teardown
        assert [a.name for a in dag.timetable.asset_condition.objects] == ["cdc:shop.orders_changes"]
    # the asset the table's commit task emits (through its alias, only when it committed rows) is the
    # one the mirrors are scheduled on
    from iceberg_cdc.airflow.dag_factory import sink_alias, sink_asset

    config = parse_config(MIRRORED)
    table_dag = build_dags(config)["cdc__shop__orders"]
    outlets = {o.name for o in table_dag.get_task("commit").outlets}
    assert outlets == {sink_alias(config.tables[0]).name}
    emitted = sink_asset(config, config.tables[0])
    for dag in dags.values():
        [scheduled] = dag.timetable.asset_condition.objects
        assert (scheduled.name, scheduled.uri) == (emitted.name, emitted.uri)


def test_the_hook_resolves_aws_connections_for_the_catalog_and_the_shuffle(monkeypatch):
    """Named AWS connections reach the runtime through the hook; outside Airflow they are an error."""
    from iceberg_cdc.airflow.hooks.cdc import CdcHook
    from iceberg_cdc.errors import ConfigError
    from iceberg_cdc.pipeline.runtime import runtime_from_config

    raw = {**CONFIG, "catalog": {**CONFIG["catalog"], "airflow_conn_id": "cdc_aws"}}
    raw["shuffle"] = {**CONFIG["shuffle"], "airflow_conn_id": "cdc_aws"}
    config = parse_config(raw)
    monkeypatch.setenv(
        "AIRFLOW_CONN_CDC_AWS",
        '{"conn_type": "aws", "login": "AKEY", "password": "s3cret", '
        '"extra": {"endpoint_url": "http://127.0.0.1:9", "region_name": "eu-west-1"}}',
    )
    runtime = CdcHook(config).runtime()
    for properties in (runtime.io_properties, runtime.shuffle_properties):
        assert properties["s3.access-key-id"] == "AKEY"
        assert properties["s3.secret-access-key"] == "s3cret"
        assert properties["s3.endpoint"] == "http://127.0.0.1:9"
        assert properties["s3.region"] == "eu-west-1"
    assert "s3cret" not in repr(runtime)
    with pytest.raises(ConfigError, match=r"catalog.airflow_conn_id: 'cdc_aws' names an Airflow connection"):
        runtime_from_config(config)


START_DATES = """
import json, sys
from iceberg_cdc.airflow.dags import dags_from_config
print(json.dumps({d.dag_id: [d.start_date.isoformat(), str(d.timezone)] for d in dags_from_config(sys.argv[1]).values()}))
"""


def test_every_dag_starts_at_a_utc_date_whatever_the_deployments_default_timezone(tmp_path):
    """A naive start_date is read in [core] default_timezone: the DAGs' start and clock would move with it."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    path = tmp_path / "cdc.yaml"
    raw = {**MIRRORED, "tables": [{**MIRRORED["tables"][0], "freshness_slo": 600}, MIRRORED["tables"][1]]}
    path.write_text(yaml.safe_dump(raw))
    env = {
        **os.environ,
        "PYTHONPATH": f"{repo / 'plugins'}:{repo}",
        "AIRFLOW__CORE__DEFAULT_TIMEZONE": "America/New_York",  # read once, when Airflow is imported
    }
    done = subprocess.run(
        [sys.executable, "-c", START_DATES, str(path)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"cdc__shop__orders", "cdc_mirror__shop__orders__public__orders", "cdc_freshness"} <= set(found)
    assert found == {dag_id: ["2024-01-01T00:00:00+00:00", "UTC"] for dag_id in found}


def test_params_and_default_args_reach_every_task_as_airflow_documents():
    """The DAG's Params under each task's (none) and the run's conf, by Airflow's own merge; default_args
    given to the DAG; the failure callback on each task and not in the DAG's default_args (serialized)."""
    from datetime import timedelta

    from airflow.sdk.definitions.param import process_params

    from iceberg_cdc.airflow.mirror_dag import build_mirror_dags
    from iceberg_cdc.airflow.policy import record_error, task_retries

    config = parse_config(MIRRORED)

    def table_dag():
        return build_dags(config)["cdc__shop__orders"]

    dag = table_dag()
    defaults = {"snapshot_id": None, "trigger_next": "auto", "through_snapshot_id": None}
    conf = {"snapshot_id": "5200992516889735211", "trigger_next": "no"}
    for task in dag.tasks:
        assert process_params(dag, task, None, suppress_exception=False) == defaults, task.task_id
    # A DAG of its own for each: Airflow's merge sets the conf's values in the DAG's own Params.
    for task_id in dag.task_ids:
        fresh = table_dag()
        merged = process_params(fresh, fresh.get_task(task_id), conf, suppress_exception=False)
        assert merged == {**defaults, **conf}, task_id
    assert dag.default_args == {"retries": task_retries(), "retry_delay": timedelta(seconds=15)}
    for built in [dag, *build_mirror_dags(config).values()]:
        for task in built.tasks:
            given = task.partial_kwargs if task.is_mapped else vars(task)
            found = (given.get("retries"), given.get("retry_delay"))
            assert found == (task_retries(), timedelta(seconds=15)), (built.dag_id, task.task_id)
            callbacks = task.on_failure_callback
            assert record_error in (callbacks if isinstance(callbacks, list) else [callbacks]), task.task_id

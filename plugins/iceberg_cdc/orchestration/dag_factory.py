"""One DAG per configured table: ``cdc__<namespace>__<table>``, one run per source snapshot.

    detect ─┬─ write_jobs ─ shuffle_write[] ─ barrier ─ coalesce ─ shuffle_read[] ─┬─ commit ─ watermark ─ more_pending ─ trigger_next_run
            └─ insert_jobs ─ changelog_insert[] ──────────────────────────────────┘
    cleanup: teardown of detect (runs after failures too, keeps them failed)

The mapped Spark tasks expand over what detect (or coalesce) planned; a path
with nothing to do expands to zero tasks and is skipped, so insert-only and
skipped snapshots need no branching operator. Labels from the plan show in
the UI as the mapped tasks' names.

``spark.mode`` picks what a mapped Spark task is: ``submit`` (default) a
SparkSubmitOperator, one Spark application per group; ``connect`` a
:class:`SparkConnectPhaseOperator`, which runs the same group from the Airflow
worker as a client of a warm Spark Connect server. Both take the same
``application_args`` (so the same labels) and the DAG's shape is the same.

``write_jobs`` / ``insert_jobs`` only hand detect's lists on: a mapped task
cannot expand over one key of detect's XCom, because Airflow records one map
length per task (the length of its return value, here the number of keys of
detect's dict), not per key.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import DAG, BaseOperator, Param, TriggerRule, task
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from iceberg_cdc.config import CdcConfig, TableConfig, load_config
from iceberg_cdc.coordination.lease import HolderState, LeaseInfo
from iceberg_cdc.errors import (
    ConfigError,
    ConservationError,
    CorruptShuffleError,
    LeaseHeldError,
    LeaseLostError,
    SourceHistoryError,
)
from iceberg_cdc.orchestration import steps
from iceberg_cdc.orchestration.pyfiles import package_zip
from iceberg_cdc.orchestration.sensors import MapOutputBarrierSensor
from iceberg_cdc.orchestration.submit_conf import submit_conf
from iceberg_cdc.pipeline.runtime import runtime_from_config

SENSOR_MODE_ENV = "CDC_SENSOR_MODE"  # "poke" for `airflow dags test`, else reschedule
_REPO_APPLICATION = Path(__file__).resolve().parents[3] / "spark_jobs" / "cdc_phase.py"
_PACKAGE_APPLICATION = Path(__file__).resolve().parents[1] / "pipeline" / "spark_app.py"

DOC = """
### Change data capture of `{source}` into `{sink}`

Each run processes the oldest source snapshot after the watermark kept in
`{sink}`'s properties. Trigger with `{{"snapshot_id": <id>}}` to reprocess one
snapshot of the current history (its rows in the sink are replaced).

* **detect** — picks the snapshot, plans the work, takes the table's lease
* **shuffle_write / barrier / coalesce / shuffle_read** — the S3 shuffle (snapshots with deletes)
* **changelog_insert** — insert-only snapshots, no shuffle
* **commit** — one atomic sink commit, marked with the source snapshot (exactly once)
* **watermark** — confirms progress; **trigger_next_run** starts the next run at once when more is pending
* **cleanup** — teardown: shuffle objects, uncommitted files, the lease
"""


TASK_RETRIES_ENV = "CDC_TASK_RETRIES"  # retries of every task (default 2)
# Errors that a retry of the same task cannot fix: the run must stop (the next run starts afresh).
_FINAL_ERRORS = (LeaseLostError, ConservationError, CorruptShuffleError, ConfigError, SourceHistoryError)


def task_retries() -> int:
    """Retries of every task: ``CDC_TASK_RETRIES`` (default 2)."""
    return int(os.environ.get(TASK_RETRIES_ENV, "2"))


@contextlib.contextmanager
def final_errors() -> Iterator[None]:
    """Turn errors no retry can fix into AirflowFailException (no retries), message first."""
    try:
        yield
    except _FINAL_ERRORS as exc:
        raise AirflowFailException(f"{type(exc).__name__}: {exc}") from exc


def airflow_holder_state(ti: Any) -> Callable[[LeaseInfo], HolderState] | None:
    """Ask Airflow whether a lease holder's DAG run is still running (for a faster, safer takeover)."""
    if ti is None or not hasattr(ti, "get_dagrun_state"):
        return None

    def state(holder: LeaseInfo) -> HolderState:
        if not holder.dag_id:
            return "unknown"
        value = str(ti.get_dagrun_state(holder.dag_id, holder.owner)).lower().rsplit(".", 1)[-1]
        if value in ("success", "failed"):
            return "finished"
        return "running" if value in ("running", "queued") else "unknown"

    return state


def spark_application() -> str:
    return str(_REPO_APPLICATION if _REPO_APPLICATION.exists() else _PACKAGE_APPLICATION)


# The plan's label (last of the application arguments) names each mapped Spark task in the UI.
MAP_INDEX_TEMPLATE = "{{ task.application_args[-1] }}"


def spark_options(config: CdcConfig) -> dict[str, Any]:
    return {
        "application": spark_application(),
        "conn_id": config.spark.conn_id,
        "py_files": package_zip(),
        "conf": submit_conf(config.spark.conf),
        "driver_memory": config.spark.driver_memory,
        "executor_memory": config.spark.executor_memory,
        "verbose": False,
        "map_index_template": MAP_INDEX_TEMPLATE,
    }


def connect_url(config: CdcConfig, conn_id: str | None = None) -> str:
    """The Spark Connect server: ``spark.connect_url``, else the Airflow connection ``spark.connect_conn_id``.

    The connection is read by the provider's ``SparkConnectHook`` (type
    ``spark_connect``: host, port, login as user id, password as token, extra
    ``use_ssl``); the URL may then hold a token, so it is never logged.
    """
    if config.spark.connect_url:
        return config.spark.connect_url
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    conn_id = conn_id or config.spark.connect_conn_id
    try:
        return SparkConnectHook(conn_id).get_connection_url()
    except AirflowNotFoundException:
        raise ConfigError(
            f"spark.mode is connect, but the Airflow connection {conn_id!r} (spark.connect_conn_id) is not "
            "defined: add a connection of type spark_connect (host sc://<server>, port 15002), e.g. "
            f'AIRFLOW_CONN_{conn_id.upper()}=\'{{"conn_type": "spark_connect", "host": "sc://<server>", '
            '"port": 15002}\', or set spark.connect_url'
        ) from None


class SparkConnectPhaseOperator(BaseOperator):
    """One phase group run from this worker as a Spark Connect client (``spark.mode: connect``).

    Takes the spark-submit task's ``application_args`` (``--phase --plan
    --group --label``), so the mapped tasks expand, and are labelled, exactly
    alike in both modes. Errors from the units arrive as the pipeline's own
    exceptions; those no retry can fix fail the task at once.
    """

    template_fields = ("application_args",)
    ui_color = "#fbd5a5"

    def __init__(
        self, *, application_args: list[str] | None = None, conn_id: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.application_args = list(application_args or [])
        self.conn_id = conn_id

    def execute(self, context: Any) -> None:
        from iceberg_cdc.pipeline import connect_app
        from iceberg_cdc.pipeline.spark_app import parse_args

        args = parse_args([str(a) for a in self.application_args])
        with final_errors():
            config = load_config()
            connect_app.run_group(
                connect_url(config, self.conn_id),
                runtime_from_config(config),
                args.plan,
                args.phase,
                args.group,
                label=args.label,
            )


def phase_operator(config: CdcConfig) -> tuple[type[BaseOperator], dict[str, Any]]:
    """The mapped Spark tasks' operator and its fixed arguments, by ``spark.mode``."""
    if config.spark.mode == "connect":
        options = {"conn_id": config.spark.connect_conn_id, "map_index_template": MAP_INDEX_TEMPLATE}
        return SparkConnectPhaseOperator, options
    return SparkSubmitOperator, spark_options(config)


def build_dag(config: CdcConfig, table: TableConfig) -> DAG:
    source = table.source
    operator, spark = phase_operator(config)

    def spark_task(task_id: str, phase: str):
        """A mapped Spark task of ``spark.mode``'s operator, to ``.expand(application_args=...)``."""
        name = {"name": f"cdc-{source}-{phase}"} if operator is SparkSubmitOperator else {}
        return operator.partial(task_id=task_id, **name, **spark)

    sensor_mode = os.environ.get(SENSOR_MODE_ENV, "reschedule")

    def context() -> steps.Context:
        return steps.Context.of(load_config(), source)

    with DAG(
        dag_id=table.dag_id,
        schedule=table.schedule,
        start_date=datetime(2024, 1, 1),
        catchup=False,
        max_active_runs=1,
        tags=["cdc", source],
        doc_md=DOC.format(source=source, sink=table.sink),
        params={
            "snapshot_id": Param(
                None,
                type=["null", "integer"],
                description="Reprocess this snapshot of the current history (replacing its rows in the sink).",
            ),
            "trigger_next": Param(
                None,
                type=["null", "boolean"],
                description="Start the next run at once when more snapshots are pending "
                "(default: yes, except for a reprocess of one snapshot_id).",
            ),
        },
        # Transient failures (an S3 blip, a killed worker) are retried where they happen: every
        # step is idempotent within the run's lease epoch. Errors a retry cannot fix fail at once.
        default_args={"retries": task_retries(), "retry_delay": timedelta(seconds=15)},
    ) as dag:

        @task(task_id="detect")
        def detect(
            params: dict[str, Any] | None = None, run_id: str | None = None, ti=None
        ) -> dict[str, Any]:
            requested = (params or {}).get("snapshot_id")
            try:
                return steps.detect(
                    context(),
                    run_id or "manual",
                    requested,
                    dag_id=table.dag_id,
                    try_number=getattr(ti, "try_number", None),
                    holder_state=airflow_holder_state(ti),
                )
            except LeaseHeldError as exc:
                raise AirflowSkipException(str(exc)) from None

        detected = detect()

        @task
        def jobs(detected: dict[str, Any], key: str) -> list[list[str]]:
            """The Spark jobs of one path (empty when the run takes the other path)."""
            return detected[key]

        write_jobs = jobs.override(task_id="write_jobs")(detected, "write_args")
        insert_jobs = jobs.override(task_id="insert_jobs")(detected, "insert_args")

        shuffle_write = spark_task("shuffle_write", "write").expand(application_args=write_jobs)

        barrier = MapOutputBarrierSensor(
            task_id="barrier",
            source=source,
            mode=sensor_mode,
            poke_interval=5 if sensor_mode == "poke" else 30,
            timeout=timedelta(hours=1).total_seconds(),
            # ALL_SUCCESS: a write task that failed fails the run at once (upstream_failed);
            # the sensor itself catches outputs a "successful" job did not leave, and failure
            # markers of jobs that run detached from Airflow (cluster deploy mode).
        )

        @task(task_id="coalesce")
        def coalesce(detected: dict[str, Any]) -> list[list[str]]:
            with final_errors():
                return steps.coalesce(context(), detected)

        ranges = coalesce(detected)

        shuffle_read = spark_task("shuffle_read", "read").expand(application_args=ranges)

        changelog_insert = spark_task("changelog_insert", "insert").expand(application_args=insert_jobs)

        @task(task_id="commit", trigger_rule=TriggerRule.NONE_FAILED)
        def commit(ti=None) -> dict[str, Any]:
            # Pulled, not passed: an argument would make commit a direct downstream of the
            # setup task, which Airflow allows only with trigger rule ALL_SUCCESS.
            with final_errors():
                return steps.commit(context(), ti.xcom_pull(task_ids="detect"))

        @task(task_id="watermark")
        def watermark(detected: dict[str, Any], committed: dict[str, Any]) -> dict[str, Any]:
            return steps.watermark(context(), detected)

        @task.short_circuit(task_id="more_pending")
        def more_pending(mark: dict[str, Any], params: dict[str, Any] | None = None) -> bool:
            # A manual reprocess (snapshot_id) does not chain unless asked to: it is about one snapshot.
            params = params or {}
            chain = params.get("trigger_next")
            if chain is None:
                chain = params.get("snapshot_id") is None
            return bool(mark["remaining"]) and bool(chain)

        trigger_next = TriggerDagRunOperator(
            task_id="trigger_next_run", trigger_dag_id=table.dag_id, wait_for_completion=False
        )

        @task(task_id="cleanup")
        def cleanup(detected: dict[str, Any], run_id: str | None = None) -> dict[str, Any]:
            return steps.cleanup(context(), detected, run_id or "manual")

        committed = commit()
        mark = watermark(detected, committed)
        shuffle_write >> barrier >> ranges >> shuffle_read >> committed
        changelog_insert >> committed
        mark >> more_pending(mark) >> trigger_next
        teardown = cleanup(detected).as_teardown(setups=detected)
        mark >> teardown
    return dag


def build_dags(config: CdcConfig | None = None) -> dict[str, DAG]:
    config = config or load_config()
    return {table.dag_id: build_dag(config, table) for table in config.tables}

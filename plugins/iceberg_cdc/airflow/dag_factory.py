"""One DAG per configured table: ``cdc__<namespace>__<table>``, one run per source snapshot.

    detect ─┬─ write_jobs ─ shuffle_write[] ─ barrier ─ coalesce ─ shuffle_read[] ─┬─ commit ─ watermark ─ trigger_next_run
            └─ insert_jobs ─ changelog_insert[] ──────────────────────────────────┘
    cleanup: teardown of detect, after trigger_next_run (runs after failures too, keeps them failed)

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

import functools
from datetime import timedelta
from typing import Any

import pendulum
from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import DAG, AssetAlias, Param, TriggerRule
from airflow.sdk.definitions.param import ParamsDict

from iceberg_cdc.airflow.assets import HashOnceAsset
from iceberg_cdc.airflow.chain import TRIGGER_TASK, no_chain_reason
from iceberg_cdc.airflow.events import schedule_for
from iceberg_cdc.airflow.operators.detect import DetectOperator, sensor_mode
from iceberg_cdc.airflow.operators.spark import CdcSparkSubmitOperator, phase_operator
from iceberg_cdc.airflow.operators.steps import (
    CleanupOperator,
    CoalesceOperator,
    CommitOperator,
    JobListOperator,
    WatermarkOperator,
)
from iceberg_cdc.airflow.policy import record_error, task_retries
from iceberg_cdc.airflow.sensors.barrier import MapOutputBarrierSensor
from iceberg_cdc.config import CdcConfig, TableConfig, load_config

# The tasks are operator classes, not @task functions built here (operators/steps.py says why); their
# work's modules (pyiceberg, pyarrow, the object stores) are imported where they run, never at parse.

# Runs of one table never overlap: the table's lease serializes them, and a run waiting for it gives its
# worker slot back. So Airflow may start a run while another is active -- with max_active_runs=1 a run
# whose task died would hold every later run back until Airflow's task heartbeat timeout (300 s), not
# the lease's two TTLs.
MAX_ACTIVE_RUNS = 16

# Timezone-aware, as Airflow's docs ask: a naive date is read in the deployment's [core]
# default_timezone, which would move the DAGs' start and their clock schedules' timezone with it.
START_DATE = pendulum.datetime(2024, 1, 1, tz="UTC")


def sink_asset(config: CdcConfig, table: TableConfig) -> HashOnceAsset:
    """The sink table as an Airflow Asset: commit emits an event per source snapshot it commits."""
    return HashOnceAsset(
        name=f"cdc:{table.sink}",
        uri=f"iceberg://{config.catalog.name}/{table.sink.replace('.', '/')}",
        group="cdc",
    )


def sink_alias(table: TableConfig) -> AssetAlias:
    """Commit's outlet: an alias through which it emits the sink asset's event only when the sink changed.

    A task's declared Asset outlet gets an event on every success -- an idle
    run's too -- so commit declares this alias and adds the sink asset to it
    when it committed rows (Airflow's way to emit conditionally).
    """
    return AssetAlias(name=f"cdc:{table.sink}:commits", group="cdc")


DOC = """
### Change data capture of `{source}` into `{sink}`

Each run processes the oldest source snapshot after the watermark kept in
`{sink}`'s properties, and says which in its logs, XComs and the sink asset's
events. When more snapshots are pending it starts the next run at once
(`{{"trigger_next": false}}` turns that off).

**Reprocess one snapshot:** trigger with `{{"snapshot_id": <id>}}` (a snapshot of
the current history the sink holds, or the next pending one): its rows in the
sink are replaced atomically, and the run does not chain unless `trigger_next`
is true.

**Reprocess a range:** trigger with `{{"snapshot_id": A, "through_snapshot_id": B}}`.
The run replaces A's rows, then starts a run for the next snapshot of the
current history, and so on up to B: one run per snapshot, in order, each
replacing that snapshot's rows (run ids `reprocess__s<id>__...`). Refused,
naming the fix, when the sink is fresh, when A or B is not in the current
history (expired, rolled back), when B comes before A, or when B is after the
watermark (pending snapshots are for ordinary runs). `{{"trigger_next": false}}`
stops after A.

**Runs never overlap.** A run that finds the table held by another run waits
for it without holding a worker slot (it is rescheduled), for up to two lease
TTLs per holder (so a dead holder is taken over), then fails naming the
holder -- it never skips silently.

**Backfills** (`airflow backfill create`) process pending snapshots in order,
one per run, whatever their `max_active_runs` (the runs queue for the table);
their runs never chain (`trigger_next` is ignored) and refuse `snapshot_id`
and `through_snapshot_id` (reprocess with a manual run instead).

* **detect** — picks the snapshot, plans the work, takes the table's lease
* **shuffle_write / barrier / coalesce / shuffle_read** — the S3 shuffle (snapshots with deletes)
* **changelog_insert** — insert-only snapshots, no shuffle
* **commit** — one atomic sink commit, marked with the source snapshot (exactly once)
* **watermark** — confirms progress; **trigger_next_run** starts the next run at once when more is pending
* **cleanup** — teardown: shuffle objects, uncommitted files, the lease
"""


def snapshot_id_param(name: str, description: str) -> Param:
    """A snapshot id Param: a plain text field in Airflow's Trigger form, checked by detect.

    No JSON-schema ``type`` and no ``pattern``: with a type list (``["null",
    "string", "integer"]``, so API callers may send an integer) Airflow's form
    shows a JSON field that parses the digits into a rounded number unless
    ``examples`` is set, and ``examples`` adds a "Start typing to see options"
    placeholder with no options (Airflow 3.3 ``FlexibleForm/FieldSelector`` /
    ``FieldString``); a ``pattern`` refuses a typo with a raw JSON-schema dump.
    Detect reads the value with :func:`iceberg_cdc.snapshot_ids.parse`, which
    refuses anything but digits with a message naming the param and the fix,
    before anything runs.
    """
    return Param(None, title=name, description=description)


def run_params() -> dict[str, Param]:
    """The DAG's Params (the public contract): new objects per DAG, as a run's conf sets their values."""
    return {
        # Ids as text: the form and its JSON editor round numbers above 2**53 (snapshot_ids).
        "snapshot_id": snapshot_id_param(
            "snapshot_id",
            "Reprocess this snapshot of the current history (replacing its rows in the sink): type "
            "the id's digits as Iceberg shows them. Leave empty to process the next pending snapshot.",
        ),
        "trigger_next": Param(
            "auto",
            type=["string", "boolean", "null"],
            enum=["auto", "yes", "no", True, False, None],
            values_display={
                "auto": "auto: yes, except after a reprocess of one snapshot",
                "yes": "yes: start the next run at once",
                "no": "no: stop after this run",
            },
            title="trigger_next",
            description="Start the next run at once when more snapshots are pending (or, in a range "
            "reprocess, the next snapshot of the range).",
        ),
        "through_snapshot_id": snapshot_id_param(
            "through_snapshot_id",
            "With snapshot_id: reprocess every snapshot from snapshot_id through this one, one run per "
            "snapshot, in order. Type the id's digits as Iceberg shows them; leave empty for one snapshot.",
        ),
    }


@functools.cache
def validated_run_params() -> None:
    """Check the Params' defaults against their schemas once per process (once per DAG file parse).

    Airflow checks a scheduled DAG's Params when the DAG is built with them,
    and every task built inside it deep-copies them and then serializes them,
    re-validating each JSON schema each time (about 1 ms per Param per check,
    75 checks per DAG; measured on Airflow 3.3.2, 250 tables: 2.5 s of CPU to
    build and serialize them -> 12.5 s, the serialized DAG 15 -> 31 kB). So
    :func:`build_dag` gives them to the DAG only -- its ``params`` attribute,
    which Airflow merges under each task's own Params and the run's conf when
    the task runs (``process_params``: DAG, then task, then conf, the
    precedence Airflow documents) -- and the check Airflow would make runs
    here, once.
    """
    ParamsDict(run_params()).validate()


def build_dag(config: CdcConfig, table: TableConfig, config_path: str | None = None) -> DAG:
    source = table.source
    operator, spark = phase_operator(config)

    def spark_task(task_id: str, phase: str):
        """A mapped Spark task of ``spark.mode``'s operator, to ``.expand(application_args=...)``."""
        name = {"name": f"cdc-{source}-{phase}"} if operator is CdcSparkSubmitOperator else {}
        return operator.partial(task_id=task_id, **name, **spark, **each)

    barrier_mode = sensor_mode()
    # Every task's failure callback, given to each task: in the DAG's default_args it would also be
    # serialized with the DAG -- as the callback's source code, read and tokenized at every parse of
    # every table (0.3 ms a DAG) -- for nothing, as the tasks are all built here.
    each = {"on_failure_callback": record_error}

    with DAG(
        dag_id=table.dag_id,
        # The source's new snapshots (an AssetWatcher's event) or the table's clock (airflow/events.py).
        schedule=schedule_for(config, table, config_path),
        start_date=START_DATE,
        catchup=False,
        max_active_runs=MAX_ACTIVE_RUNS,
        tags=["cdc", source],
        doc_md=DOC.format(source=source, sink=table.sink),
        # Transient failures (an S3 blip, a killed worker) are retried where they happen: every
        # step is idempotent within the run's lease epoch. Errors a retry cannot fix fail at once.
        # A task that fails for good records its error line (XCom cdc_error, ``each``'s callback) for
        # the run's note, which the plugin's listener writes when the run ends
        # (airflow/listeners/run_notes.py).
        default_args={"retries": task_retries(), "retry_delay": timedelta(seconds=15)},
    ) as dag:
        detect = DetectOperator(task_id="detect", source=source, **each)
        detected = detect.output
        write_jobs = JobListOperator(task_id="write_jobs", detected=detected, key="write_args", **each).output
        insert_jobs = JobListOperator(
            task_id="insert_jobs", detected=detected, key="insert_args", **each
        ).output

        shuffle_write = spark_task("shuffle_write", "write").expand(application_args=write_jobs)

        barrier = MapOutputBarrierSensor(
            task_id="barrier",
            source=source,
            mode=barrier_mode,
            poke_interval=5 if barrier_mode == "poke" else 30,
            timeout=timedelta(hours=1).total_seconds(),
            # ALL_SUCCESS: a write task that failed fails the run at once (upstream_failed);
            # the sensor itself catches outputs a "successful" job did not leave, and failure
            # markers of jobs that run detached from Airflow (cluster deploy mode).
            **each,
        )

        ranges = CoalesceOperator(task_id="coalesce", source=source, detected=detected, **each).output

        shuffle_read = spark_task("shuffle_read", "read").expand(application_args=ranges)

        changelog_insert = spark_task("changelog_insert", "insert").expand(application_args=insert_jobs)

        asset = sink_asset(config, table)
        alias = sink_alias(table)

        committed = CommitOperator(
            task_id="commit",
            source=source,
            alias=alias,
            asset=asset,
            trigger_rule=TriggerRule.NONE_FAILED,
            **each,
        ).output
        # watermark reads the sink: naming it as an inlet keeps the sink's asset known to Airflow (on its
        # Assets page, active) although commit emits its events only through the alias.
        mark = WatermarkOperator(
            task_id="watermark",
            source=source,
            detected=detected,
            committed=committed,
            inlets=[asset],
            **each,
        ).output

        trigger_next = ChainRunOperator(
            task_id=TRIGGER_TASK,
            trigger_dag_id=table.dag_id,
            wait_for_completion=False,
            # The chained run's id names the snapshot it will process.
            trigger_run_id="{{ ti.xcom_pull(task_ids='watermark')['chained_run_id'] }}",
            # {} for an ordinary chain; the next snapshot of the range for a range reprocess.
            conf="{{ ti.xcom_pull(task_ids='watermark').get('next_conf', {}) | tojson }}",
            note="{{ ti.xcom_pull(task_ids='watermark')['chained_note'] }}",
            **each,
        )

        shuffle_write >> barrier >> ranges >> shuffle_read >> committed
        changelog_insert >> committed
        mark >> trigger_next
        teardown = CleanupOperator(task_id="cleanup", source=source, detected=detected, **each).as_teardown(
            setups=detect
        )
        # The chained run exists before cleanup gives the lease back: a run waiting for the table
        # then sees it and leaves the next snapshot to it (one chain per table, docs/operating.md).
        mark >> teardown
        trigger_next >> teardown
    # The DAG's Params, on the DAG only: given to DAG(params=...), every task would carry a copy, and
    # Airflow would check and serialize each copy (5x the DAG file's parse cost, validated_run_params).
    # Tasks read them from the DAG when they run; tests/integration/test_dag_integrity.py runs Airflow's
    # own merge over every task on the installed Airflow (3.1 by make test-compat).
    validated_run_params()
    dag.params.update(run_params())
    return dag


class ChainRunOperator(TriggerDagRunOperator):
    """Starts the table's next run; skips when :func:`~iceberg_cdc.airflow.chain.no_chain_reason` says no.

    watermark skips this task itself when no next run is due
    (:mod:`iceberg_cdc.airflow.chain`); the check here covers a cleared task
    re-run by hand. ``note`` is a template too (the provider renders only the
    run id and conf): the chained run's note says how many snapshots were
    pending when it was started; the plugin's listener replaces it with what
    the run did when it ends.
    """

    template_fields = (*TriggerDagRunOperator.template_fields, "note")

    def execute(self, context: Any) -> Any:
        from iceberg_cdc.airflow.compat import AirflowSkipException

        mark = context["ti"].xcom_pull(task_ids="watermark") or {}
        reason = no_chain_reason(
            mark, context.get("params"), getattr(context.get("dag_run"), "run_type", None)
        )
        if reason is not None:
            raise AirflowSkipException(f"{reason} (remaining: {mark.get('remaining', 0)})")
        return super().execute(context)


def build_dags(
    config: CdcConfig | None = None,
    config_path: str | None = None,
    tables: list[TableConfig] | None = None,
) -> dict[str, DAG]:
    """One DAG per table (of ``tables``, default all); ``config_path`` (default: ``CDC_CONFIG``) is what the
    event triggers read."""
    config = config or load_config(config_path)
    return {table.dag_id: build_dag(config, table, config_path) for table in tables or config.tables}

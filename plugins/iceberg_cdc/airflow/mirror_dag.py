"""One mirror DAG per (table, mirror): ``cdc_mirror__<ns>__<table>__<mirror name>``.

    detect ─ plan_apply ─ join_jobs ─ mirror_join[] ─ apply ─ verify
    cleanup: teardown of detect (runs after failures too, keeps them failed)

``verify`` proves the mirror equals its source and repairs drift when the
mirror's ``verify`` setting says one is due (:mod:`iceberg_cdc.mirror.verify`).

Scheduled on the changelog's Airflow Asset (``cdc:<sink>``): every commit of
the table's DAG emits an event, and Airflow starts a mirror run for the
events that queued up -- one run applies everything pending at once. The steps
are :mod:`iceberg_cdc.mirror.steps`; ``mirror_join`` is the Iceberg target's
mapped Spark task (the shuffle phases' operator, ``--phase mirror_join``) and
expands to nothing for a PostgreSQL mirror. The mirror has a lease of its own
(never the table's), so mirror runs and changelog runs do not wait for each
other, and two runs of one mirror never overlap.

A mirror with ``conn_id`` reads its DSN from the Airflow connection through
the Postgres provider's hook (registered here, so the core stays Airflow-free).
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import DAG, TriggerRule, task

from iceberg_cdc.airflow.dag_factory import START_DATE, sink_asset
from iceberg_cdc.airflow.hooks.cdc import CdcHook
from iceberg_cdc.airflow.metrics import emit_safely
from iceberg_cdc.airflow.operators.detect import lease_wait_seconds, sensor_mode
from iceberg_cdc.airflow.operators.lineage import lineage_task
from iceberg_cdc.airflow.operators.spark import CdcSparkSubmitOperator, phase_operator
from iceberg_cdc.airflow.policy import airflow_holder_state, final_errors, record_error, task_retries
from iceberg_cdc.config import CdcConfig, MirrorConfig, TableConfig, load_config
from iceberg_cdc.run.metrics import emit_verification

if TYPE_CHECKING:
    from iceberg_cdc.run.context import Context

# The mirror's own modules (its steps, targets, verification: pyarrow, pyiceberg, psycopg) are imported
# in the task functions: the DAG processor imports this module at every parse of the DAG files.

log = logging.getLogger("iceberg_cdc")


DOC = """
### Mirror of `{source}` in {kind} `{target}`

Keeps `{target}` holding exactly the rows of `{source}` (one per key
{key}), from its changelog `{sink}`. Scheduled on the changelog's asset
`cdc:{sink}`: a run applies every changelog snapshot after the mirror's
watermark at once, as net changes per key, in one atomic step with the new
watermark ({atomic}).

* **detect** — takes the mirror's lease, compares its watermark with the changelog
* **plan_apply** — reads the pending changelog, stages the net changes (Parquet, shuffle store)
* **mirror_join** — the Iceberg target's Spark join tasks (none for PostgreSQL)
* **apply** — the atomic apply with the watermark (exactly once)
* **verify** — when due ({verify}): digests of source and mirror, drifted keys repaired ({repair})
* **cleanup** — teardown: staged objects, the lease

Rebuild from the changelog or the source's state:
`iceberg-cdc rebuild --table {source} --mirror {name} [--from source]`.
"""


def build_mirror_dag(config: CdcConfig, table: TableConfig, mirror: MirrorConfig) -> DAG:
    source = table.source
    name = mirror.mirror_name
    operator, spark = phase_operator(config)

    def context() -> tuple[Context, MirrorConfig]:
        from iceberg_cdc.airflow.hooks import mirror_postgres  # noqa: F401  (conn_id -> DSN, for the tasks)

        ctx = CdcHook(load_config()).context(source)
        return ctx, ctx.table.mirror(name)

    with DAG(
        dag_id=table.mirror_dag_id(mirror),
        schedule=[sink_asset(config, table)],
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        tags=["cdc", "cdc-mirror", source],
        doc_md=DOC.format(
            source=source,
            sink=table.sink,
            kind="PostgreSQL" if mirror.type == "postgres" else "Iceberg",
            target=mirror.table,
            key=f"by {table.identifier_columns}" if table.identifier_columns else "by the identifier fields",
            atomic="one PostgreSQL transaction" if mirror.type == "postgres" else "one Iceberg commit",
            name=name,
            verify="never; `make verify`"
            if mirror.verify is None
            else "every run"
            if mirror.verify == 0
            else f"every {mirror.verify / 3600:g} h",
            repair="on" if mirror.repair else "off: drift fails the run",
        ),
        default_args={
            "retries": task_retries(),
            "retry_delay": timedelta(seconds=15),
            "on_failure_callback": record_error,
        },
    ) as dag:

        @task(task_id="detect")
        def detect(run_id: str | None = None, ti=None) -> dict[str, Any]:
            from iceberg_cdc.airflow.lease_wait import take_waiting
            from iceberg_cdc.mirror import steps

            try_started = time.time()
            ctx, mine = context()

            def take() -> dict[str, Any]:
                with final_errors():
                    return steps.detect(
                        ctx,
                        mine,
                        run_id or "manual",
                        dag_id=dag.dag_id,
                        try_number=getattr(ti, "try_number", None),
                        holder_state=airflow_holder_state(ti),
                    )

            return take_waiting(
                take,
                what="mirror",
                lease=lambda: steps.mirror_lease(ctx, mine),
                window=lease_wait_seconds(),
                try_started=try_started,
                waiting_since=try_started,
                reschedule=sensor_mode() != "poke",
                in_process_seconds=5.0,
            )

        detected = detect()

        @task(task_id="plan_apply")
        def plan_apply(detected: dict[str, Any]) -> dict[str, Any]:
            from iceberg_cdc.mirror import steps

            ctx, mine = context()
            with final_errors():
                return steps.plan_apply(ctx, mine, detected)

        planned = plan_apply(detected)

        @task(task_id="join_jobs")
        def join_jobs(planned: dict[str, Any]) -> list[list[str]]:
            """The Iceberg target's Spark join tasks (a mapped task expands over a whole return value)."""
            return planned["join_args"]

        name_arg = {"name": f"cdc-{source}-mirror-{name}"} if operator is CdcSparkSubmitOperator else {}
        mirror_join = operator.partial(task_id="mirror_join", **name_arg, **spark).expand(
            application_args=join_jobs(planned)
        )

        @lineage_task(task_id="apply", trigger_rule=TriggerRule.NONE_FAILED, lineage="mirror")
        def apply(ti=None) -> dict[str, Any]:
            from iceberg_cdc.mirror import steps

            ctx, mine = context()
            detected = ti.xcom_pull(task_ids="detect")
            planned = ti.xcom_pull(task_ids="plan_apply")
            with final_errors():
                return steps.apply(ctx, mine, detected, planned)

        @task(task_id="cleanup")
        def cleanup(detected: dict[str, Any], run_id: str | None = None, ti=None) -> dict[str, Any]:
            from iceberg_cdc.mirror import steps

            ctx, mine = context()
            planned = ti.xcom_pull(task_ids="plan_apply") if ti is not None else None
            return steps.cleanup(ctx, mine, detected, run_id or "manual", planned)

        @lineage_task(task_id="verify", lineage="verify")
        def verify(ti=None) -> dict[str, Any]:
            from iceberg_cdc.mirror.verify.step import verify_step

            ctx, mine = context()
            with final_errors():
                return verify_step(
                    ctx,
                    mine,
                    ti.xcom_pull(task_ids="detect"),
                    on_result=lambda found: emit_safely(emit_verification, source, name, found),
                )

        applied = apply()
        mirror_join >> applied
        verified = verify()
        teardown = cleanup(detected).as_teardown(setups=detected)
        applied >> verified >> teardown
    return dag


def build_mirror_dags(
    config: CdcConfig | None = None, tables: list[TableConfig] | None = None
) -> dict[str, DAG]:
    """Every configured mirror's DAG (of ``tables``' mirrors, default all), by DAG id."""
    config = config or load_config()
    return {
        table.mirror_dag_id(mirror): build_mirror_dag(config, table, mirror)
        for table in tables or config.tables
        for mirror in table.mirrors
    }

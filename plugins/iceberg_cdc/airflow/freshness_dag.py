"""``cdc_freshness``: the tables' freshness SLOs, checked every minute, whatever their DAGs are doing.

Why a DAG of its own and not a Deadline Alert: a Deadline Alert (Airflow 3.1+)
fires when a *DAG run* is not finished some time after its queued or logical
date; a paused or blocked table has no run to miss a deadline, and a run's
age is not the changelog's lag. The promise is about the source's commit
times (``run/freshness.py``), so a small DAG that is never paused measures
it: one task per table with ``freshness_slo``, which

* sends ``<table>.freshness.lag_seconds`` and ``.freshness.breached`` to
  Airflow's metrics backend (StatsD or OpenTelemetry),
* calls the table's ``freshness_callback`` (any callable, or an Airflow
  notifier instance, by dotted path) when the SLO is breached and when it
  clears -- the stored alert state makes each transition fire once, and
  delivers it at least once: a callback that raises fails the task and is
  called again with that transition by every later check until it returns,
* does the same for each of the table's mirrors (gauges
  ``<table>.mirror.<name>.freshness.*``; the callback's ``freshness`` names
  the ``mirror``), each with an alert state of its own,
* returns the measurement as its XCom (the mirrors' under ``mirrors``),
  which the CDC view reads for the table's red state.

Tables with ``protect_pending`` get a task here too (``protect__<dag id>``):
it tags every snapshot pending after the sink's watermark, so a snapshot
committed while the table's DAG is paused or down is protected from expiry
within a minute of its commit -- protection from first sight, not only from
the next run's detect (``run/retention_guard.py``).

A check that fails -- a mirror whose target cannot be read, a callback that
raises -- fails the task after the other checks ran (the changelog's and the
other mirrors' alerts still fire).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import DAG, task

from iceberg_cdc.airflow.dag_factory import START_DATE
from iceberg_cdc.airflow.metrics import emit_safely
from iceberg_cdc.config import CdcConfig, MirrorConfig, TableConfig, load_config
from iceberg_cdc.errors import ConfigError
from iceberg_cdc.run.metrics import StatsBackend, emit_freshness

if TYPE_CHECKING:  # the check's modules (pyiceberg) are imported where it runs, not at DAG file parse
    from iceberg_cdc.run.context import Context
    from iceberg_cdc.run.freshness import Transition

log = logging.getLogger("iceberg_cdc")

FRESHNESS_DAG_ID = "cdc_freshness"
CHECK_EVERY = timedelta(minutes=1)


def resolve_callback(path: str) -> Callable[[dict[str, Any]], Any]:
    """The callable (or notifier instance) ``module.name`` names; an error naming the fix if it is none."""
    module_name, _, name = path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"freshness_callback={path!r} cannot be imported ({type(exc).__name__}: {exc}): put the module "
            "on the workers' Python path (e.g. the DAGs or plugins folder) or fix the path"
        ) from exc
    if not callable(found):
        raise ConfigError(
            f"freshness_callback={path!r} is a {type(found).__name__}, not a callable or notifier"
        )
    return found


def run_check(
    ctx: Context,
    context: dict[str, Any],
    stats: StatsBackend | None = None,
    mirror: MirrorConfig | None = None,
) -> tuple[dict[str, Any], Transition | None]:
    """One check (the changelog's, or ``mirror``'s): measure, send the gauges, call the callback on a transition."""
    from iceberg_cdc.run.freshness import check

    if mirror is None:
        measured, transition = check(ctx)
    else:
        from iceberg_cdc.mirror.freshness import measure_mirror

        measured, transition = check(ctx, measured=measure_mirror(ctx, mirror))
    result = measured.to_dict()
    if stats is not None:
        emit_freshness(stats, ctx.table.source, result)
    else:
        emit_safely(emit_freshness, ctx.table.source, result)
    if ctx.table.freshness_callback:
        deliver_alerts(ctx, context, measured.mirror)
    return result, transition


def deliver_alerts(ctx: Context, context: dict[str, Any], mirror: str | None = None) -> None:
    """Call the table's callback with each transition still owed (at least once: run/freshness.py)."""
    from iceberg_cdc.run.freshness import deliver

    path = str(ctx.table.freshness_callback)

    def send(alert: dict[str, Any]) -> None:
        callback = resolve_callback(path)
        try:
            callback(
                {**context, "freshness": alert["freshness"], "freshness_transition": alert["transition"]}
            )
        except Exception:
            log.exception(
                "freshness_callback %s raised on %s: the next check calls it again", path, alert["transition"]
            )
            raise
        log.info("freshness_callback %s called: %s", path, alert["transition"])

    deliver(ctx, mirror, send)


def run_checks(ctx: Context, context: dict[str, Any], stats: StatsBackend | None = None) -> dict[str, Any]:
    """The table's checks: its changelog's, then each mirror's; raises the first error after all ran.

    A check that fails -- a target that cannot be read, a callback that
    raises -- never keeps the others from measuring and alerting.
    """
    failed: list[BaseException] = []
    result: dict[str, Any] = {}
    transition: Transition | None = None
    try:
        result, transition = run_check(ctx, context, stats)
    except Exception as exc:
        log.exception("the freshness check of %s failed", ctx.table.source)
        failed.append(exc)
    mirrors: dict[str, Any] = {}
    for mirror in ctx.table.mirrors:
        try:
            measured, moved = run_check(ctx, context, stats, mirror)
        except Exception as exc:  # the others still get their checks and alerts
            log.exception("the freshness check of %s failed", mirror.describe())
            failed.append(exc)
            continue
        mirrors[mirror.mirror_name] = {**measured, "transition": moved}
    if failed:
        raise failed[0]
    return {**result, "transition": transition, "mirrors": mirrors}


def build_freshness_dag(config: CdcConfig) -> DAG | None:
    """The checks' DAG, or None when no table has a ``freshness_slo`` or ``protect_pending``."""
    tables: list[TableConfig] = [t for t in config.tables if t.freshness_slo is not None]
    protected: list[TableConfig] = [t for t in config.tables if t.protect_pending]
    if not tables and not protected:
        return None
    with DAG(
        dag_id=FRESHNESS_DAG_ID,
        schedule=CHECK_EVERY,
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        is_paused_upon_creation=False,  # a promise must be watched from the start
        tags=["cdc", "freshness"],
        doc_md=__doc__,
    ) as dag:
        for table in tables:

            @task(task_id=f"check__{table.dag_id}", retries=0)
            def check_table(source: str = table.source, **context: Any) -> dict[str, Any]:
                from iceberg_cdc.airflow.hooks.cdc import CdcHook

                return run_checks(CdcHook(load_config()).context(source), context)

            check_table()
        for table in protected:

            @task(task_id=f"protect__{table.dag_id}", retries=0)
            def protect_table(source: str = table.source) -> dict[str, Any]:
                """Tags on the snapshots pending now, whether or not the table's DAG runs (paused, down)."""
                from iceberg_cdc.airflow.hooks.cdc import CdcHook
                from iceberg_cdc.run.retention_guard import protect

                result = protect(CdcHook(load_config()).context(source))
                if "error" in result:
                    raise ConfigError(f"protect_pending of {source}: {result['error']}")
                return result

            protect_table()
    return dag


__all__ = [
    "CHECK_EVERY",
    "FRESHNESS_DAG_ID",
    "build_freshness_dag",
    "resolve_callback",
    "deliver_alerts",
    "run_check",
    "run_checks",
]

"""The operators of the mapped Spark tasks, one per ``spark.mode``, with errors first.

``submit``: :class:`CdcSparkSubmitOperator`, the provider's SparkSubmitOperator
that, when the application fails, raises the pipeline's own error line (left
by the phase driver under ``paths.group_error``) before spark-submit's
command line and JVM noise. ``connect``: :class:`SparkConnectPhaseOperator`,
which runs the same group from this worker as a Spark Connect client. Both
take the same ``application_args`` (``--phase --plan --group --label``), so the
mapped tasks expand, and are labelled, exactly alike.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseOperator

from iceberg_cdc.airflow.compat import AirflowException, AirflowFailException
from iceberg_cdc.airflow.hooks.cdc import CdcHook
from iceberg_cdc.airflow.policy import final_errors
from iceberg_cdc.config import CdcConfig, load_config
from iceberg_cdc.error_lines import is_final_line
from iceberg_cdc.errors import CdcError
from iceberg_cdc.pipeline.submit_conf import submit_conf

log = logging.getLogger("iceberg_cdc")
_REPO_APPLICATION = Path(__file__).resolve().parents[4] / "spark_jobs" / "cdc_phase.py"
_PACKAGE_APPLICATION = Path(__file__).resolve().parents[1] / "spark_entry.py"


def _phases_known() -> None:
    """Make every phase a mapped Spark task may run known in this process: the Iceberg mirror's too.

    Called where a task runs, never at import: the DAG files import this module,
    and the mirror's phase pulls in the task-only modules (pyiceberg, pyarrow).
    """
    from iceberg_cdc.mirror.iceberg import phase as mirror_phase

    mirror_phase.register()


def spark_application() -> str:
    return str(_REPO_APPLICATION if _REPO_APPLICATION.exists() else _PACKAGE_APPLICATION)


# The plan's label (last of the application arguments) names each mapped Spark task in the UI.
MAP_INDEX_TEMPLATE = "{{ task.application_args[-1] }}"


def spark_options(config: CdcConfig) -> dict[str, Any]:
    return {
        "application": spark_application(),
        "conn_id": config.spark.conn_id,
        # Built when a task runs (CdcSparkSubmitOperator.execute), never at DAG parse: hashing the
        # package's files on every parse would cost each DAG processor loop for nothing.
        "py_files": None,
        "conf": submit_conf(config.spark.conf),
        "driver_memory": config.spark.driver_memory,
        "executor_memory": config.spark.executor_memory,
        "verbose": False,
        "map_index_template": MAP_INDEX_TEMPLATE,
    }


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
        self._runners: list[Any] = []

    def execute(self, context: Any) -> None:
        from iceberg_cdc.pipeline import connect_app
        from iceberg_cdc.pipeline.spark_app import parse_args

        _phases_known()
        if ran_in_process(self.application_args):
            return
        args = parse_args([str(a) for a in self.application_args])
        with final_errors():
            hook = CdcHook()
            connect_app.run_group(
                hook.spark_connect_url(self.conn_id),
                hook.runtime(),
                args.plan,
                args.phase,
                args.group,
                label=args.label,
                on_runner=self._runners.append,
            )

    def on_kill(self) -> None:
        """Airflow stops the task (marked failed or cleared, timed out, SIGTERM): stop its job on the server.

        The task runner calls this from its SIGTERM handler (and after an
        ``execution_timeout``); without it the Connect server would run the
        group's job to its end for nobody. Only this task's job is
        interrupted, by its tag: the server session is shared by every task
        of the package version, so ``interruptAll`` would stop the others too.
        """
        runners = getattr(self, "_runners", [])
        if not runners:
            self.log.info("on_kill: no Spark Connect job started yet; nothing to interrupt")
            return
        for runner in runners:
            runner.cancel()  # logs and never raises: a kill must not fail over a lost connection


class CdcSparkSubmitOperator(SparkSubmitOperator):
    """SparkSubmitOperator whose failure says the pipeline's error first, at ERROR level.

    The provider's exception starts with ``Cannot execute: spark-submit
    --master ... --conf ...``; the reason (say ``AmbiguousUpdateError: ...
    set duplicate_keys: emit_unpaired``) sits many lines down a PySpark
    traceback logged at INFO. The phase driver leaves that reason as one line
    in the run's namespace; this operator raises it first.
    """

    def execute(self, context: Any) -> None:
        from iceberg_cdc.pipeline.pyfiles import package_zip

        _phases_known()
        if ran_in_process(self.application_args or []):
            return
        self.py_files = self.py_files or package_zip()
        try:
            with _renewing(self.application_args or []):
                super().execute(context)
        except AirflowException as exc:
            line = _group_error(self.application_args or [])
            if line is None:
                raise
            self.log.error("%s", line)
            error = AirflowFailException if is_final_line(line) else AirflowException
            raise error(
                f"{line}\n(spark-submit failed; its command line and output follow in the log)"
            ) from exc


def ran_in_process(application_args: list[Any]) -> bool:
    """Run the group in this task's process when its input is below ``spark.in_process_below``.

    True when it ran here (the task is done), False when it needs Spark. The
    same lease check, heartbeat, figures and errors as a Spark driver's
    (:mod:`iceberg_cdc.pipeline.in_process`).
    """
    from iceberg_cdc.pipeline.in_process import run_if_small
    from iceberg_cdc.pipeline.spark_app import parse_args

    args = parse_args([str(a) for a in application_args])
    with final_errors():
        hook = CdcHook(load_config(args.config))
        below = hook.config.spark.in_process_below
        return (
            run_if_small(hook.runtime(), args.plan, args.phase, args.group, below, label=args.label)
            is not None
        )


@contextlib.contextmanager
def _renewing(application_args: list[str]) -> Iterator[None]:
    """Renew the run's lease from this task's process while spark-submit runs.

    The Spark driver renews it too, but only once its JVM is up; renewing here
    as well ties the lease to the Airflow task itself, so a killed task stops
    renewing (coordination.lease, "Dead holders"). A plan or store that cannot
    be read (a :class:`CdcError`) only costs this renewal, with a warning: the
    driver and the next step check the lease themselves. Anything else (bad
    arguments, a bug) fails the task: the driver would meet it too.
    """
    from iceberg_cdc.coordination.heartbeat import LeaseHeartbeat
    from iceberg_cdc.coordination.lease import TableLease
    from iceberg_cdc.pipeline.groups import load_phase_plan
    from iceberg_cdc.pipeline.spark_app import parse_args

    try:
        args = parse_args([str(a) for a in application_args])
        store = CdcHook(load_config(args.config)).runtime().store()
        plan = load_phase_plan(args.phase, store, args.plan)
        lease = TableLease(store, plan.lease_name)
        beat = LeaseHeartbeat(lease, plan.run_id, plan.epoch, plan.lease_ttl_seconds)
    except CdcError as exc:
        log.warning("the task does not renew its run's lease (the Spark driver does): %s", exc)
        yield
        return
    with beat:
        yield


def _group_error(application_args: list[str]) -> str | None:
    """The error line the phase driver recorded for this group, if any (None when it cannot be read)."""
    from iceberg_cdc.pipeline.phase_driver import read_group_error
    from iceberg_cdc.pipeline.spark_app import parse_args

    try:
        args = parse_args([str(a) for a in application_args])
        store = CdcHook(load_config(args.config)).runtime().store()
        return read_group_error(store, args.plan, args.phase, args.group)
    except CdcError as exc:  # the store or the plan cannot be read: spark-submit's own error stands
        log.warning("could not read the error the group recorded: %s", exc)
        return None


def phase_operator(config: CdcConfig) -> tuple[type[BaseOperator], dict[str, Any]]:
    """The mapped Spark tasks' operator and its fixed arguments, by ``spark.mode``."""
    if config.spark.mode == "connect":
        options = {"conn_id": config.spark.connect_conn_id, "map_index_template": MAP_INDEX_TEMPLATE}
        return SparkConnectPhaseOperator, options
    return CdcSparkSubmitOperator, spark_options(config)

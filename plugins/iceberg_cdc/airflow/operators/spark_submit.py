"""``spark.mode: submit``'s mapped Spark task: the provider's SparkSubmitOperator, with errors first.

When the application fails it raises the pipeline's own error line (left by
the phase driver under ``paths.group_error``) before spark-submit's command
line and JVM noise. A module of its own so that connect mode never imports
the provider's spark-submit module (:func:`~iceberg_cdc.airflow.operators.spark.phase_operator`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from iceberg_cdc.airflow.compat import AirflowException, AirflowFailException
from iceberg_cdc.airflow.hooks.cdc import CdcHook
from iceberg_cdc.airflow.operators.phases import phases_known
from iceberg_cdc.config import load_config
from iceberg_cdc.error_lines import is_final_line
from iceberg_cdc.errors import CdcError


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

        phases_known()
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


@contextlib.contextmanager
def _renewing(application_args: list[str]) -> Iterator[None]:
    """Renew the run's lease from this task's process while spark-submit runs.

    The Spark driver renews it too, but only once its JVM is up; renewing here
    as well ties the lease to the Airflow task itself, so a killed task stops
    renewing (coordination.lease, "Dead holders"). Never fails the task: the
    driver and the next step check the lease themselves.
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
    except (CdcError, SystemExit, ValueError, KeyError, OSError, AttributeError):
        yield
        return
    with beat:
        yield


def _group_error(application_args: list[str]) -> str | None:
    """The error line the phase driver recorded for this group, if any."""
    from iceberg_cdc.pipeline.phase_driver import read_group_error
    from iceberg_cdc.pipeline.spark_app import parse_args

    try:
        args = parse_args([str(a) for a in application_args])
        store = CdcHook(load_config(args.config)).runtime().store()
        return read_group_error(store, args.plan, args.phase, args.group)
    except (CdcError, SystemExit, ValueError, KeyError):
        return None

"""Barrier sensor: every planned map output committed before any read starts.

One LIST of the run's namespace per poke (not one request per output)
shows both committed outputs (their row records, written after the index)
and failure markers left by write jobs. Each poke also renews the run's lease
(so a long wait keeps the table), and fails the run if it was overtaken. A marker fails the run at once; a timeout names the outputs
still missing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator

from iceberg_cdc.airflow.compat import AirflowFailException, AirflowSensorTimeout, AirflowSkipException
from iceberg_cdc.airflow.hooks.cdc import CdcHook
from iceberg_cdc.errors import LeaseLostError

if TYPE_CHECKING:  # the run's modules are imported where the sensor pokes, not when the DAG file parses
    from iceberg_cdc.run.state import Detected

_NAMED = 20


class MapOutputBarrierSensor(BaseSensorOperator):
    template_fields = ("source",)

    def __init__(self, *, source: str, detect_task_id: str = "detect", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.source = source
        self.detect_task_id = detect_task_id

    def _detected(self, context) -> Detected:
        from iceberg_cdc.run.state import Detected

        value = context["ti"].xcom_pull(task_ids=self.detect_task_id)
        detected = Detected.of(value) if value else None
        if detected is None or detected.action != "shuffle":
            raise AirflowSkipException("no shuffle in this run: nothing to wait for")
        return detected

    def poke(self, context) -> bool:
        from iceberg_cdc.run.lease import confirm
        from iceberg_cdc.run.shuffle_steps import missing_map_outputs

        detected = self._detected(context)
        ctx = CdcHook().context(self.source)
        try:
            confirm(ctx, detected)
        except LeaseLostError as exc:
            raise AirflowFailException(str(exc)) from None
        missing, failed = missing_map_outputs(ctx, detected)
        if failed:
            task_id, error = next(iter(failed.items()))
            raise AirflowFailException(
                f"{len(failed)} write task(s) of snapshot {detected.snapshot_id} failed, e.g. {task_id}: "
                f"{error or 'no error recorded'}. The run stops here; the next run redoes the snapshot "
                "from the write phase."
            )
        total = len(detected.write_task_ids)
        self.log.info("%d of %d map outputs committed", total - len(missing), total)
        return not missing

    def execute(self, context) -> Any:
        try:
            return super().execute(context)
        except AirflowSensorTimeout:
            from iceberg_cdc.run.shuffle_steps import missing_map_outputs

            # In reschedule mode every poke is a new process: list once more rather than trust
            # what this process remembers.
            missing, _ = missing_map_outputs(CdcHook().context(self.source), self._detected(context))
            named = ", ".join(missing[:_NAMED]) + (" ..." if len(missing) > _NAMED else "")
            raise AirflowSensorTimeout(
                f"timed out waiting for {len(missing)} map output(s) of {self.source}: {named}. "
                "Their write tasks neither committed (NAME.index and written/<task>.json) nor recorded a failure: check the "
                "shuffle_write task logs and the Spark application."
            ) from None

"""watermark decides whether a run starts the next one, and skips trigger_next_run when not (airflow/chain.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from airflow.providers.common.compat.sdk import DownstreamTasksSkipped

from iceberg_cdc.airflow import chain

PENDING = {"remaining": 2, "next_conf": {}, "chained_run_id": "chained__s9__x", "chained_note": "n"}


@pytest.mark.parametrize(
    ("mark", "params", "run_type", "reason"),
    [
        (PENDING, {"trigger_next": "auto"}, "manual", None),
        (PENDING, {"trigger_next": "auto"}, "scheduled", None),
        ({**PENDING, "remaining": 0}, {"trigger_next": "auto"}, "manual", "no next run to start"),
        (PENDING, {"trigger_next": "no"}, "manual", "no next run to start"),
        (PENDING, {"trigger_next": "yes"}, "backfill", "a backfill run does not chain"),
    ],
)
def test_the_reason_not_to_chain(mark, params, run_type, reason):
    assert chain.no_chain_reason(mark, params, run_type) == reason


class _Ti:
    """What skip_trigger touches of Airflow's runtime task instance."""

    def __init__(self) -> None:
        from airflow.providers.standard.operators.empty import EmptyOperator

        self.task_id, self.map_index, self.pushed = "watermark", -1, {}
        trigger = EmptyOperator(task_id=chain.TRIGGER_TASK)
        self.task = SimpleNamespace(dag=SimpleNamespace(get_task={chain.TRIGGER_TASK: trigger}.__getitem__))

    def xcom_push(self, key: str, value) -> None:
        self.pushed[key] = value


def test_watermark_keeps_its_mark_and_skips_trigger_next_run_as_a_short_circuit_would():
    ti = _Ti()
    with pytest.raises(DownstreamTasksSkipped) as skipped:
        chain.skip_trigger(ti, {**PENDING, "remaining": 0}, "no next run to start")
    assert skipped.value.tasks == [chain.TRIGGER_TASK]
    assert ti.pushed["return_value"]["chained_run_id"] == "chained__s9__x"  # the run's note reads it
    assert ti.pushed["skipmixin_key"] == {
        "skipped": [chain.TRIGGER_TASK]
    }  # a clear of it alone stays skipped

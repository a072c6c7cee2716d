"""The spark-submit task's failure says the pipeline's error first (``CdcSparkSubmitOperator``).

When spark-submit fails, the operator looks up the error line the phase
driver recorded for its group and raises it in place of the provider's
``Cannot execute: spark-submit ...``: final errors (no retry can fix them)
as ``AirflowFailException``, others as a retryable ``AirflowException``; with
no recorded line, the provider's own exception. The spark-submit call itself
is replaced here: what is tested is the operator's handling of its failure.
"""

from __future__ import annotations

import pytest
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from iceberg_cdc.airflow.compat import AirflowException, AirflowFailException
from iceberg_cdc.airflow.operators import spark as operators
from iceberg_cdc.airflow.operators.spark import CdcSparkSubmitOperator

ARGS = ["--phase", "write", "--plan", "plans/p.json", "--group", "0", "--label", "write 1/1"]


@pytest.fixture
def failing_submit(monkeypatch):
    def fail(self, context):
        raise AirflowException("Cannot execute: spark-submit --master local ... Error code is: 1.")

    monkeypatch.setattr(SparkSubmitOperator, "execute", fail)


def _run(monkeypatch, recorded: str | None, asked: list | None = None) -> None:
    """Execute the operator; the group's recorded error line is ``recorded``; ``asked`` gets the lookups."""

    def group_error(application_args):
        (asked if asked is not None else []).append(list(application_args))
        return recorded

    monkeypatch.setattr(operators, "_group_error", group_error)
    operator = CdcSparkSubmitOperator(task_id="shuffle_write", application="app.py", application_args=ARGS)
    operator.execute({})


def test_a_final_error_recorded_by_the_group_fails_the_task_without_retries(monkeypatch, failing_submit):
    final = "AmbiguousUpdateError"  # final: its class says no retry can fix it (errors.is_final_line)
    with pytest.raises(AirflowFailException) as raised:
        _run(monkeypatch, f"{final}: key id=3 has 2 DELETE rows")
    assert str(raised.value).startswith(f"{final}: key id=3 has 2 DELETE rows\n(spark-submit failed")


def test_a_transient_error_recorded_by_the_group_is_retried(monkeypatch, failing_submit):
    with pytest.raises(AirflowException) as raised:
        _run(monkeypatch, "ConnectionResetError: reset by peer")
    assert not isinstance(raised.value, AirflowFailException)
    assert str(raised.value).startswith("ConnectionResetError: reset by peer")


def test_without_a_recorded_error_the_providers_exception_stands(monkeypatch, failing_submit):
    with pytest.raises(AirflowException, match=r"^Cannot execute: spark-submit"):
        _run(monkeypatch, None)


def test_the_group_is_found_from_the_tasks_own_arguments(monkeypatch, failing_submit):
    asked: list[list[str]] = []
    with pytest.raises(AirflowException):
        _run(monkeypatch, None, asked)
    assert asked == [ARGS]

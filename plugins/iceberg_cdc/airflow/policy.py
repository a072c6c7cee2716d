"""How the DAG's tasks treat failures and other runs: retries, final errors, lease holders.

Airflow-facing policy shared by the DAG factory and the operators: which
errors no retry can fix (they fail the task at once, message first), how many
retries the rest get, and how detect asks Airflow about a lease holder's run.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from iceberg_cdc.coordination.lease import HolderState, LeaseInfo
from iceberg_cdc.errors import FINAL_ERRORS
from iceberg_cdc.run.story import error_line, scrub

log = logging.getLogger("iceberg_cdc")

TASK_RETRIES_ENV = "CDC_TASK_RETRIES"  # retries of every task (default 2)
ERROR_XCOM_KEY = "cdc_error"  # a failed task's first error line, for the run's note


def task_retries() -> int:
    """Retries of every task: ``CDC_TASK_RETRIES`` (default 2)."""
    return int(os.environ.get(TASK_RETRIES_ENV, "2"))


@contextlib.contextmanager
def final_errors() -> Iterator[None]:
    """Turn errors no retry can fix into AirflowFailException (no retries), message first."""
    try:
        yield
    except FINAL_ERRORS as exc:
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


def record_error(context: Any) -> None:
    """``on_failure_callback`` of every task: its error's first line as XCom ``cdc_error``.

    A task cannot write its DAG run's note (the Task SDK has no call for
    it); the plugin's listener does when the run ends, in the scheduler, and
    reads this line for a failed run. Secrets are scrubbed here, where
    Airflow's masker knows the task's connections and the config is at hand.
    Runs only when the task failed for good (not before a retry). Never
    raises: a failure callback must not hide the task's own error.
    """
    exc = context.get("exception")
    ti = context.get("ti")
    if exc is None or ti is None:  # e.g. a task the scheduler found dead: no exception to tell
        return
    try:
        line = error_line(type(exc).__name__, str(exc))
        ti.xcom_push(key=ERROR_XCOM_KEY, value=scrub(_masked(line), _config_secrets()))
    except Exception as problem:
        log.warning("the error line of %s was not recorded for the run's note: %s", ti, problem)


def _masked(text: str) -> str:
    """``text`` through Airflow's secrets masker (connection passwords, sensitive variables)."""
    try:
        from airflow.sdk._shared.secrets_masker import redact

        return str(redact(text))
    except Exception:
        return text


def _config_secrets() -> set[str]:
    from iceberg_cdc.config import load_config, secret_values

    try:
        return secret_values(load_config())
    except Exception:  # a broken config may be the very error being recorded
        return set()

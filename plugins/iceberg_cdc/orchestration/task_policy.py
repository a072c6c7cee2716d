"""How the DAG's tasks treat failures and other runs: retries, final errors, lease holders.

Airflow-facing policy shared by the DAG factory and the operators: which
errors no retry can fix (they fail the task at once, message first), how many
retries the rest get, and how detect asks Airflow about a lease holder's run.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from iceberg_cdc.coordination.lease import HolderState, LeaseInfo
from iceberg_cdc.errors import FINAL_ERRORS

TASK_RETRIES_ENV = "CDC_TASK_RETRIES"  # retries of every task (default 2)


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

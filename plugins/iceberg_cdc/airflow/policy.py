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
from typing import TYPE_CHECKING, Any

from iceberg_cdc.airflow.compat import AirflowFailException
from iceberg_cdc.error_lines import line_of
from iceberg_cdc.errors import CdcError, is_final

if TYPE_CHECKING:  # the lease's modules (the object stores) are imported where a task runs, not at parse
    from iceberg_cdc.coordination.lease import HolderState, LeaseInfo

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
    except CdcError as exc:
        if is_final(exc):
            raise AirflowFailException(f"{type(exc).__name__}: {exc}") from exc
        raise


def airflow_holder_state(ti: Any) -> Callable[[LeaseInfo], HolderState] | None:
    """Ask Airflow about a lease holder's run: finished, working (a task running) or between tasks.

    Every pipeline task renews the lease while it runs, so Airflow showing a
    task of the holder's run *running* while the lease has expired means that
    task stopped renewing: it died (its worker killed) or hangs, and the lease
    is taken over at expiry instead of after Airflow's task heartbeat timeout.
    """
    if ti is None or not hasattr(ti, "get_dagrun_state"):
        return None

    def state(holder: LeaseInfo) -> HolderState:
        if not holder.dag_id:
            return "unknown"
        value = _state_name(ti.get_dagrun_state(holder.dag_id, holder.owner))
        if value in ("success", "failed"):
            return "finished"
        if value not in ("running", "queued"):
            return "unknown"
        try:
            found = ti.get_task_states(dag_id=holder.dag_id, run_ids=[holder.owner])
        except Exception:  # an older task SDK, or the API unreachable: the run's state is all we know
            return "running"
        return "working" if "running" in _task_state_names(found) else "running"

    return state


def _detect_states(ti: Any, dag_id: str) -> dict[str, set[str]]:
    """Every run of ``dag_id`` with the state names of its detect task (one Task SDK call)."""
    found = ti.get_task_states(dag_id=dag_id, task_ids=["detect"])
    return {run_id: _task_state_names(tasks) or {"none"} for run_id, tasks in (found or {}).items()}


def airflow_live_chain(ti: Any, dag_id: str, own_run_id: str) -> Callable[[], str | None] | None:
    """Ask Airflow for a live chained run of ``dag_id``: one whose detect has not finished yet.

    The lease holder starts its chained run before its cleanup gives the lease
    back, so a run that then holds the lease and sees such a run knows it was
    started for the very snapshot it would take. A chained run whose detect
    finished has taken its snapshot already (or ended): it is not waiting.
    The rule is :func:`iceberg_cdc.run.queue.live_chain`.
    """
    if ti is None or not hasattr(ti, "get_task_states"):
        return None

    def live() -> str | None:
        from iceberg_cdc.run.queue import live_chain

        return live_chain(own_run_id, _detect_states(ti, dag_id))

    return live


def airflow_run_ahead(ti: Any, dag_id: str, own_run_id: str) -> Callable[[], str | None] | None:
    """Ask Airflow whether a run of ``dag_id`` ahead of this one will process the next snapshot.

    The rule is :func:`iceberg_cdc.run.queue.run_ahead`; None when there is no
    Task SDK behind the task to ask (a test): the run then queues as before.
    """
    if ti is None or not hasattr(ti, "get_task_states"):
        return None

    def ahead() -> str | None:
        from iceberg_cdc.run.queue import run_ahead

        return run_ahead(own_run_id, _detect_states(ti, dag_id))

    return ahead


def _state_name(value: Any) -> str:
    return str(getattr(value, "value", value)).lower().rsplit(".", 1)[-1]


def _task_state_names(found: Any) -> set[str]:
    """Every task state in the Task SDK's answer (``{run_id: {task_id: state}}``, nested or flat)."""
    names: set[str] = set()
    todo = [found]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            todo.extend(item.values())
        elif isinstance(item, list | tuple):
            todo.extend(item)
        elif item is not None:
            names.add(_state_name(item))
    return names


def record_error(context: Any) -> None:
    """``on_failure_callback`` of every task: its error's first line as XCom ``cdc_error``.

    A task cannot write its DAG run's note (the Task SDK has no call for
    it); the plugin's listener does when the run ends, in the scheduler, and
    reads this line for a failed run. Secrets are removed here
    (:mod:`iceberg_cdc.redaction`), where the config and the credentials its
    Airflow connections supply are at hand. Runs only when the task failed for
    good (not before a retry). Never raises: a failure callback must not hide
    the task's own error.
    """
    exc = context.get("exception")
    ti = context.get("ti")
    if exc is None or ti is None:  # e.g. a task the scheduler found dead: no exception to tell
        return
    try:
        ti.xcom_push(key=ERROR_XCOM_KEY, value=line_of(exc, secrets=known_secrets()))
    except Exception as problem:
        log.warning(
            "the error line of %s was not recorded for the run's note: %s", ti, type(problem).__name__
        )


def known_secrets() -> set[str]:
    """The secrets this process knows: the config's, and those its Airflow connections supply."""
    from iceberg_cdc.airflow.hooks.cdc import CdcHook
    from iceberg_cdc.config import load_config
    from iceberg_cdc.redaction import secret_values

    found: set[str] = set()
    try:
        config = load_config()
    except Exception:  # a broken config may be the very error being recorded
        return found
    found |= secret_values(config.model_dump(mode="json"))
    try:
        runtime = CdcHook(config).runtime()
        found |= secret_values({**runtime.shuffle_properties, **runtime.io_properties})
    except Exception:  # a connection that cannot be read supplied nothing to hide
        log.debug("the config's connections could not be read for redaction", exc_info=True)
    return found

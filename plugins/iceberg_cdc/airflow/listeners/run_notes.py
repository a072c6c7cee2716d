"""Airflow listener: when a CDC DAG run ends, its note says what it did (or why it failed).

A task cannot set its own DAG run's note: the Task SDK's execution API has
no call for it, and the REST API's ``PATCH .../dagRuns/{run_id}`` needs a
user's token, which a task does not have. Airflow's listeners can:
``on_dag_run_success`` / ``on_dag_run_failed`` are called by
``DagRun.update_state`` -- in the scheduler, and in ``airflow dags test``'s own
loop -- (and by the REST API when a person sets a run's state) with the
``DagRun`` still attached to the session that is about to commit its new
state. This listener reads the run's XComs in that session and sets
``dag_run.note``, which is committed with the state:

* success: commit's ``story`` (``snapshot 42 (overwrite, #7): +300 -100 ±1,000
  updates, ...``), ``caught up``, or a skipped snapshot, plus how many
  snapshots are still pending;
* failed: the snapshot (when detect found one), the first failed task and its
  error line (XCom ``cdc_error``, recorded by the tasks' failure callback,
  :func:`~iceberg_cdc.airflow.policy.record_error`).

A run that ended before and was cleared keeps what its note said: the new
outcome is appended (:func:`~iceberg_cdc.run.story.merged_note`),
so a committed snapshot's story is never replaced by the ``caught up`` of a
re-run. A note a person wrote (it has a user id) is left alone. Only DAGs with the
pipeline's tasks (``detect``, ``commit``, ``cleanup``) and a ``cdc__`` id are
touched. A listener must never break the scheduler: every problem is logged
and the run keeps whatever note it had.

Registered by ``plugins/cdc_ui_plugin.py`` (``listeners = [run_notes]``).
"""

from __future__ import annotations

import logging
from typing import Any

from airflow.listeners import hookimpl

from iceberg_cdc.airflow.policy import ERROR_XCOM_KEY
from iceberg_cdc.run.story import FailedTask, merged_note, mirror_note, run_note

log = logging.getLogger("iceberg_cdc")

DAG_PREFIX = "cdc__"
PIPELINE_TASKS = {"detect", "commit", "cleanup"}
MIRROR_PREFIX = "cdc_mirror__"
MIRROR_TASKS = {"detect", "apply", "cleanup"}
_AIRFLOW_REASONS = {"task_failure", "success", "all_tasks_deadlocked"}


@hookimpl
def on_dag_run_success(dag_run: Any, msg: str) -> None:
    annotate(dag_run, "success", msg)


@hookimpl
def on_dag_run_failed(dag_run: Any, msg: str) -> None:
    annotate(dag_run, "failed", msg)


def annotate(dag_run: Any, state: str, msg: str | None = None) -> str | None:
    """Set the run's note from its XComs and failed tasks; returns the note (None when left alone)."""
    if not str(getattr(dag_run, "dag_id", "")).startswith((DAG_PREFIX, MIRROR_PREFIX)):
        return None
    try:
        from sqlalchemy.orm import object_session

        session = object_session(dag_run)
        if session is None:
            return _annotate_detached(dag_run, state, msg)
        return _annotate(session, dag_run, state, msg)
    except Exception:
        log.warning("the note of %s was not set", getattr(dag_run, "run_id", dag_run), exc_info=True)
        return None


def _annotate_detached(dag_run: Any, state: str, msg: str | None) -> str | None:
    """A run object without a session: load it in a new one, which commits the note."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        attached = session.scalar(
            select(DagRun).where(DagRun.dag_id == dag_run.dag_id, DagRun.run_id == dag_run.run_id)
        )
        return None if attached is None else _annotate(session, attached, state, msg)


def _annotate(session: Any, dag_run: Any, state: str, msg: str | None) -> str | None:
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.state import TaskInstanceState
    from sqlalchemy import select

    tis = session.execute(
        select(TaskInstance.task_id, TaskInstance.map_index, TaskInstance.state, TaskInstance.end_date).where(
            TaskInstance.dag_id == dag_run.dag_id, TaskInstance.run_id == dag_run.run_id
        )
    ).all()
    mirror = str(dag_run.dag_id).startswith(MIRROR_PREFIX)
    if not {ti.task_id for ti in tis} >= (MIRROR_TASKS if mirror else PIPELINE_TASKS):
        return None  # not one of the pipeline's DAGs
    rows = session.scalars(
        select(XComModel).where(
            XComModel.dag_id == dag_run.dag_id,
            XComModel.run_id == dag_run.run_id,
            XComModel.key.in_(["return_value", ERROR_XCOM_KEY]),
        )
    ).all()
    values: dict[tuple[str, str], Any] = {}
    errors: dict[tuple[str, int], str] = {}
    for row in rows:
        value = XComModel.deserialize_value(row)
        if row.key == ERROR_XCOM_KEY:
            errors[(row.task_id, row.map_index)] = str(value)
        elif row.map_index < 0:
            values[(row.task_id, row.key)] = value
    failed_state = str(TaskInstanceState.FAILED.value)
    failed = [
        FailedTask(ti.task_id, ti.map_index, errors.get((ti.task_id, ti.map_index)))
        for ti in sorted(
            (ti for ti in tis if str(getattr(ti.state, "value", ti.state)) == failed_state),
            key=lambda ti: (ti.end_date is None, ti.end_date or 0, ti.task_id, ti.map_index),
        )
    ]
    note = (
        mirror_note(
            state,
            detected=values.get(("detect", "return_value")),
            applied=values.get(("apply", "return_value")),
            verified=values.get(("verify", "return_value")),
            failed=failed,
            reason=None if not msg or msg in _AIRFLOW_REASONS else msg,
        )
        if mirror
        else run_note(
            state,
            detected=values.get(("detect", "return_value")),
            committed=values.get(("commit", "return_value")),
            mark=values.get(("watermark", "return_value")),
            failed=failed,
            reason=None if not msg or msg in _AIRFLOW_REASONS else msg,
        )
    )
    existing = dag_run.dag_run_note
    if existing is not None and existing.user_id:
        log.info("%s keeps the note %s wrote; its outcome: %s", dag_run.run_id, existing.user_id, note)
        return None
    note = merged_note(existing.content if existing is not None else None, note)
    dag_run.note = note
    log.info("note of %s: %s", dag_run.run_id, note)
    return note

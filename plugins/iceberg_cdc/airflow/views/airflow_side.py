"""The Airflow side of the CDC view: who is asking, what they may see, and the DAG runs that failed.

Authentication is Airflow's own: :func:`authenticated_user` hands the request
to ``airflow.api_fastapi.core_api.security.get_user``, the dependency every
core API route uses (a ``Bearer`` token, or the UI's ``_token`` cookie, checked
by the configured auth manager). Authorization too: a table is shown only to
users the auth manager lets read its DAG (``is_authorized_dag``, method
``GET``, as ``requires_access_dag`` asks), and a failed task's error line only
to those who may read that DAG's task logs.

Runs come from Airflow's metadata database, most recently *started* first (a
backfill's runs have old logical dates but ran just now); each with the
snapshot it processed (detect's XCom, else a reprocess's conf). The first
error line of a failed task is read from its log (Airflow's ``TaskLogReader``,
so remote logging works too; :func:`iceberg_cdc.error_lines.line_in_log`),
cached per task try since a finished try's log does not change. Runs made by
``airflow dags test`` (``make sync``) log to the console only: their error
lines are not available here.

Airflow is imported inside the functions: importing this module (the plugin
is loaded by every Airflow process) costs nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from iceberg_cdc.error_lines import FailedTask, line_in_log, line_of
from iceberg_cdc.redaction import redact

log = logging.getLogger(__name__)

_bearer = HTTPBearer(auto_error=False)
_LOG_CACHE_SIZE = 512
_NONE_FOUND_TTL = 300.0
_REPROCESS_KEYS = ("snapshot_id", "through_snapshot_id")  # a run's conf that makes it a reprocess
_SUCCESS_LOOKBACK = 20  # successful runs searched for the newest one that is not a reprocess


async def authenticated_user(
    request: Request, bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Any:
    """The user Airflow's auth manager authenticates for this request (401/403 otherwise).

    The same check as ``get_user`` of Airflow's core API: the ``Authorization:
    Bearer`` header, else the ``_token`` cookie the UI holds.
    """
    from iceberg_cdc.airflow.compat import airflow_user

    return await airflow_user(request, bearer)


def dag_url(base: str, dag_id: str) -> str:
    return f"{base}/dags/{quote(dag_id, safe='')}"


def run_url(base: str, dag_id: str, run_id: str) -> str:
    return f"{dag_url(base, dag_id)}/runs/{quote(run_id, safe='')}"


def task_url(base: str, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> str:
    url = f"{run_url(base, dag_id, run_id)}/tasks/{quote(task_id, safe='')}"
    return url if map_index < 0 else f"{url}/mapped/{map_index}"


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    state: str
    run_type: str
    run_after: datetime | None
    started_at: datetime | None
    ended_at: datetime | None
    snapshot_id: str | None  # the snapshot the run processed (detect's XCom), else its conf's; a string
    url: str
    failed_tasks: list[FailedTask] = field(default_factory=list)
    note: str | None = None  # the run's note: what it did, or why it failed (plugin's listener)
    queued_at: datetime | None = None  # when it was queued (a run not started yet has no started_at)
    reprocess: bool = False  # its conf names snapshot_id or through_snapshot_id

    @property
    def ran_at(self) -> datetime | None:
        """When the run started, else when it was queued: what runs are ordered by (never its logical date)."""
        return self.started_at or self.queued_at or self.run_after

    @property
    def first_error(self) -> str | None:
        for task in self.failed_tasks:
            if task.error:
                return f"{task.task_id}: {task.error}"
        return None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("run_after", "queued_at", "started_at", "ended_at"):
            out[key] = _iso(getattr(self, key))
        out["failed_tasks"] = [task.to_dict() for task in self.failed_tasks]
        out["first_error"] = self.first_error
        return out


@dataclass
class DagRuns:
    """What Airflow knows of one table's DAG: its latest run and its recent failed runs."""

    dag_id: str
    url: str
    known: bool  # the DAG is in Airflow's database (parsed at least once)
    paused: bool | None = None
    latest: RunInfo | None = None
    failed: list[RunInfo] = field(default_factory=list)
    recent: list[RunInfo] = field(default_factory=list)  # newest first, each with its note
    error: str | None = None  # why Airflow's side could not be read
    last_success: RunInfo | None = None  # the newest successful run that is not a reprocess
    failures: dict[str, Any] = field(default_factory=dict)  # run id -> ui.blocking.Failure (set by the app)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dag_id": self.dag_id,
            "url": self.url,
            "known": self.known,
            "paused": self.paused,
            "latest_run": self.latest.to_dict() if self.latest else None,
            "failed_runs": [self._failed_dict(run) for run in self.failed],
            "last_success": self.last_success.to_dict() if self.last_success else None,
            "recent_runs": [run.to_dict() for run in self.recent],
            "error": self.error,
        }

    def _failed_dict(self, run: RunInfo) -> dict[str, Any]:
        out = run.to_dict()
        failure = self.failures.get(run.run_id)
        out["failure"] = failure.to_dict() if failure is not None else None
        return out


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat().replace("+00:00", "Z")


def _is_reprocess(conf: Any) -> bool:
    return isinstance(conf, dict) and any(conf.get(k) not in (None, "") for k in _REPROCESS_KEYS)


class AirflowSide:
    """Reads from the running Airflow: authorization decisions, DAG runs, task logs."""

    def __init__(self, *, failed_limit: int = 5, recent_limit: int = 10, read_logs: bool = True) -> None:
        self.failed_limit = failed_limit
        self.recent_limit = recent_limit
        self.read_logs = read_logs
        # (dag, run, task, map index, try) -> (first error line, monotonic expiry or None for never)
        self._log_cache: dict[tuple[str, str, str, int, int], tuple[str | None, float | None]] = {}
        self._lock = threading.Lock()

    # authorization

    def readable_dag_ids(self, user: Any, dag_ids: Iterable[str]) -> set[str]:
        """The DAGs of ``dag_ids`` the user may read (``GET``), as Airflow's auth manager decides."""
        return {dag_id for dag_id in dag_ids if self._authorized(user, dag_id, None)}

    def can_read_logs(self, user: Any, dag_id: str) -> bool:
        from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity

        return self._authorized(user, dag_id, DagAccessEntity.TASK_LOGS)

    def _authorized(self, user: Any, dag_id: str, entity: Any) -> bool:
        from airflow.api_fastapi.app import get_auth_manager
        from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails
        from airflow.models.dag import DagModel

        return get_auth_manager().is_authorized_dag(
            method="GET",
            access_entity=entity,
            details=DagDetails(id=dag_id, team_name=DagModel.get_team_name(dag_id)),
            user=user,
        )

    def login_url(self, next_url: str) -> str | None:
        from airflow.api_fastapi.app import get_auth_manager

        try:
            return get_auth_manager().get_url_login(next_url=next_url)
        except Exception:  # an auth manager without a login page
            return None

    # runs

    def dag_runs(self, dag_id: str, base: str, *, with_errors: bool) -> DagRuns:
        """The DAG's latest run and last failed runs, each failed run with its failed tasks."""
        result = DagRuns(dag_id=dag_id, url=dag_url(base, dag_id), known=False)
        try:
            self._read_runs(result, base, with_errors=with_errors)
        except Exception as exc:
            log.warning("CDC view: cannot read the runs of %s", dag_id, exc_info=True)
            result.error = line_of(exc)
        return result

    def _read_runs(self, result: DagRuns, base: str, *, with_errors: bool) -> None:
        from airflow.models.dag import DagModel
        from airflow.models.dagrun import DagRun
        from airflow.models.taskinstance import TaskInstance
        from airflow.utils.session import create_session
        from airflow.utils.state import DagRunState, TaskInstanceState
        from sqlalchemy import func, select

        dag_id = result.dag_id
        with create_session(scoped=False) as session:
            dag = session.scalar(select(DagModel).where(DagModel.dag_id == dag_id))
            if dag is not None:
                result.known = True
                result.paused = bool(dag.is_paused)
            # When runs ran, not their logical dates: a backfill's runs are "old" but ran last.
            ran = func.coalesce(DagRun.start_date, DagRun.queued_at, DagRun.run_after)
            newest = select(DagRun).where(DagRun.dag_id == dag_id).order_by(ran.desc(), DagRun.id.desc())
            recent = session.scalars(newest.limit(max(1, self.recent_limit))).all()
            failed_runs = session.scalars(
                newest.where(DagRun.state == DagRunState.FAILED).limit(self.failed_limit)
            ).all()
            successes = session.scalars(
                newest.where(DagRun.state == DagRunState.SUCCESS).limit(_SUCCESS_LOOKBACK)
            ).all()
            success = next((r for r in successes if not _is_reprocess(r.conf)), None)
            snapshots = _detected_snapshots(session, dag_id, {r.run_id for r in [*recent, *failed_runs]})
            if success is not None:
                result.last_success = self._run_info(success, base, [], snapshots)
            result.recent = [self._run_info(run, base, [], snapshots) for run in recent]
            if result.recent:
                result.latest = result.recent[0]
            result.recent = result.recent[: self.recent_limit]
            for run in failed_runs:
                tis = session.scalars(
                    select(TaskInstance)
                    .where(
                        TaskInstance.dag_id == dag_id,
                        TaskInstance.run_id == run.run_id,
                        TaskInstance.state == TaskInstanceState.FAILED,
                    )
                    .order_by(TaskInstance.end_date, TaskInstance.task_id, TaskInstance.map_index)
                ).all()
                tasks = [
                    FailedTask(
                        task_id=ti.task_id,
                        map_index=ti.map_index,
                        try_number=ti.try_number,
                        ended_at=ti.end_date,
                        error=self._error_line(ti) if with_errors and self.read_logs else None,
                        url=task_url(base, dag_id, run.run_id, ti.task_id, ti.map_index),
                    )
                    for ti in tis[:3]  # the first to fail is the cause; the rest usually follow from it
                ]
                info = self._run_info(run, base, tasks, snapshots)
                result.failed.append(info)
                if result.latest is not None and result.latest.run_id == run.run_id:
                    result.latest = info
                result.recent = [info if r.run_id == run.run_id else r for r in result.recent]

    @staticmethod
    def _run_info(run: Any, base: str, tasks: list[FailedTask], snapshots: dict[str, str]) -> RunInfo:
        conf = run.conf or {}
        snapshot = snapshots.get(run.run_id)
        if snapshot is None and isinstance(conf, dict):
            snapshot = conf.get("snapshot_id")
        return RunInfo(
            run_id=run.run_id,
            state=str(getattr(run.state, "value", run.state)),
            run_type=str(getattr(run.run_type, "value", run.run_type)),
            run_after=run.run_after,
            started_at=run.start_date,
            ended_at=run.end_date,
            snapshot_id=None if snapshot in (None, "") else str(snapshot),
            url=run_url(base, run.dag_id, run.run_id),
            failed_tasks=tasks,
            note=redact(run.note) if run.note else None,
            queued_at=run.queued_at,
            reprocess=_is_reprocess(conf),
        )

    def _error_line(self, ti: Any) -> str | None:
        """The first error line of the task try's log, cached.

        A found line is kept (a finished try's log does not change); "none
        found" is kept for :data:`_NONE_FOUND_TTL` seconds only, as a remote
        log may arrive after the task ends.
        """
        key = (ti.dag_id, ti.run_id, ti.task_id, ti.map_index, ti.try_number)
        with self._lock:
            cached = self._log_cache.get(key)
            if cached is not None and (cached[1] is None or cached[1] > time.monotonic()):
                return cached[0]
        line = None
        try:
            from airflow.utils.log.log_reader import TaskLogReader

            reader = TaskLogReader()
            if reader.supports_read and ti.try_number:
                messages, _ = reader.read_log_chunks(ti, ti.try_number, {"download_logs": True})
                line = line_in_log(messages)
        except Exception:
            log.warning("CDC view: cannot read the log of %s", key, exc_info=True)
            return None  # not cached: the log may be readable next time
        with self._lock:
            if len(self._log_cache) >= _LOG_CACHE_SIZE:
                self._log_cache.pop(next(iter(self._log_cache)))
            self._log_cache[key] = (line, None if line else time.monotonic() + _NONE_FOUND_TTL)
        return line


def _detected_snapshots(session: Any, dag_id: str, run_ids: set[str]) -> dict[str, str]:
    """run id -> the snapshot its detect found (as a string), for runs whose detect ran."""
    from airflow.models.xcom import XComModel
    from sqlalchemy import select

    if not run_ids:
        return {}
    rows = session.scalars(
        select(XComModel).where(
            XComModel.dag_id == dag_id,
            XComModel.run_id.in_(run_ids),
            XComModel.task_id == "detect",
            XComModel.key == "return_value",
            XComModel.map_index == -1,
        )
    ).all()
    found = {}
    for row in rows:
        try:
            value = XComModel.deserialize_value(row)
        except Exception:  # an XCom this code did not write: no snapshot to show
            continue
        if isinstance(value, dict) and value.get("snapshot_id") is not None:
            found[row.run_id] = str(value["snapshot_id"])
    return found

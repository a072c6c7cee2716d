"""A client of Airflow's REST API v2 as one logged-in user: runs, task instances, logs, waits.

:class:`~cdc_devtools.scheduler.LocalAirflow` is one (it also starts the
components); ``make stack``'s Airflow runs in another process, and its test
and tools talk to it with this client alone, given the URL and the login.
Every request carries the user's token (``POST /auth/token``).
"""

from __future__ import annotations

import json
import secrets
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import quote, urlencode

FINAL_RUN_STATES = frozenset({"success", "failed"})


def healthy(url: str) -> bool:
    try:
        with _opener().open(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _opener() -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))


class AirflowApiError(RuntimeError):
    def __init__(self, method: str, url: str, status: int, body: str) -> None:
        super().__init__(f"{method} {url}: HTTP {status}: {body[:2000]}")
        self.status = status
        self.body = body


class AirflowApi:
    """The REST API v2 at ``url`` as ``user`` / ``password``."""

    def __init__(self, url: str, user: str, password: str) -> None:
        self._url = url
        self.user = user
        self.password = password
        self._token: str | None = None

    @property
    def url(self) -> str:
        return self._url

    @property
    def where(self) -> str:
        """Where to look when a wait fails (the components' logs)."""
        return self.url

    def check_running(self) -> None:
        """Raise when a component is known to have exited (a client of another process's Airflow cannot tell)."""

    def token(self) -> str:
        """The admin user's API token (``POST /auth/token`` with the user's password)."""
        if self._token is None:
            body = json.dumps({"username": self.user, "password": self.password}).encode()
            request = urllib.request.Request(
                f"{self.url}/auth/token", data=body, headers={"Content-Type": "application/json"}
            )
            with _opener().open(request, timeout=30) as response:
                self._token = json.loads(response.read())["access_token"]
        return self._token

    def request(self, method: str, path: str, body: Any = None, *, params: dict | None = None) -> Any:
        """One call to the API server (``path`` below the base URL); the JSON answer."""
        url = f"{self.url}{path}" + (f"?{urlencode(params, doseq=True)}" if params else "")
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token()}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with _opener().open(request, timeout=60) as response:
                raw = response.read()
        except urllib.error.HTTPError as error:
            raise AirflowApiError(method, url, error.code, error.read().decode(errors="replace")) from None
        return json.loads(raw) if raw else None

    def wait_for_dag(self, dag_id: str, timeout: float = 180.0) -> dict[str, Any]:
        """Until the DAG processor parsed ``dag_id``; import errors end the wait at once."""
        deadline = time.monotonic() + timeout
        while True:
            self.check_running()
            try:
                return self.request("GET", f"/api/v2/dags/{quote(dag_id)}/details")
            except AirflowApiError as error:
                if error.status != 404:
                    raise
            errors = self.request("GET", "/api/v2/importErrors").get("import_errors", [])
            if errors:
                raise RuntimeError(f"the DAG folder has import errors: {errors}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"DAG {dag_id} not parsed in {timeout:.0f} s; see {self.where}")
            time.sleep(1)

    def set_paused(self, dag_id: str, paused: bool) -> None:
        self.request("PATCH", f"/api/v2/dags/{quote(dag_id)}", {"is_paused": paused})

    def unpause(self, dag_id: str) -> None:
        self.set_paused(dag_id, False)

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None, run_id: str | None = None) -> dict:
        """A manual run (``logical_date`` none, as the UI's trigger button), with ``conf``."""
        run_id = (
            run_id or f"manual__{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime())}_{secrets.token_hex(3)}"
        )
        body: dict[str, Any] = {"logical_date": None, "conf": conf or {}, "dag_run_id": run_id}
        path = f"/api/v2/dags/{quote(dag_id)}/dagRuns"
        for attempt in range(5):
            try:
                return self.request("POST", path, body)
            except AirflowApiError as error:
                # SQLite: the API server's insert can lose a race with the scheduler ("database is
                # locked", a 500); the run id makes a retry safe (409 if the first one landed).
                if error.status == 409 and attempt:
                    return self.run(dag_id, run_id)
                if error.status < 500 or attempt == 4:
                    raise
                time.sleep(1 + attempt)
        raise AssertionError("unreachable")

    def backfills(self, dag_id: str) -> list[dict[str, Any]]:
        return self.request("GET", "/api/v2/backfills", params={"dag_id": dag_id, "limit": 100})["backfills"]

    def runs(self, dag_id: str) -> list[dict[str, Any]]:
        """Every run of ``dag_id``, oldest first (by run_after)."""
        runs: list[dict[str, Any]] = []
        while True:
            page = self.request(
                "GET",
                f"/api/v2/dags/{quote(dag_id)}/dagRuns",
                params={"limit": 100, "offset": len(runs), "order_by": "run_after"},
            )
            runs += page["dag_runs"]
            if not page["dag_runs"] or len(runs) >= page["total_entries"]:
                return runs

    def run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return self.request("GET", f"/api/v2/dags/{quote(dag_id)}/dagRuns/{quote(run_id, safe='')}")

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        path = f"/api/v2/dags/{quote(dag_id)}/dagRuns/{quote(run_id, safe='')}/taskInstances"
        return self.request("GET", path, params={"limit": 1000})["task_instances"]

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        """``task_id`` (``task_id[i]`` for mapped ones) -> state."""
        return {
            ti["task_id"] if ti["map_index"] < 0 else f"{ti['task_id']}[{ti['map_index']}]": ti["state"]
            for ti in self.task_instances(dag_id, run_id)
        }

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> Any:
        path = (
            f"/api/v2/dags/{quote(dag_id)}/dagRuns/{quote(run_id, safe='')}/taskInstances/"
            f"{quote(task_id)}/xcomEntries/{quote(key)}"
        )
        return self.request("GET", path, params={"deserialize": "true", "stringify": "false"})["value"]

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        """A task try's log as text (one line per record), through the API server."""
        path = (
            f"/api/v2/dags/{quote(dag_id)}/dagRuns/{quote(run_id, safe='')}/taskInstances/"
            f"{quote(task_id)}/logs/{try_number}"
        )
        content = self.request("GET", path, params={"full_content": "true"}).get("content", [])
        if isinstance(content, str):
            return content
        lines = []
        for record in content:
            if not isinstance(record, dict):
                lines.append(str(record))
                continue
            lines.append(str(record.get("event", "")))
            # An exception's message as plain text, the way a traceback ends.
            for error in record.get("error_detail") or []:
                lines.append(f"{error.get('exc_type')}: {error.get('exc_value')}")
        return "\n".join(lines)

    def wait_for_backfills(self, dag_id: str, timeout: float = 120.0) -> list[dict[str, Any]]:
        """Until the scheduler marked every backfill of the DAG completed (its runs all final)."""
        deadline = time.monotonic() + timeout
        while True:
            backfills = self.backfills(dag_id)
            if all(b.get("completed_at") for b in backfills):
                return backfills
            if time.monotonic() > deadline:
                raise TimeoutError(f"backfills of {dag_id} not completed in {timeout:.0f} s: {backfills}")
            time.sleep(1)

    def wait_for_runs(
        self,
        dag_id: str,
        run_ids: Iterable[str] | None = None,
        *,
        timeout: float = 600.0,
        settle: Callable[[list[dict[str, Any]]], bool] | None = None,
        poll: float = 1.0,
    ) -> list[dict[str, Any]]:
        """Until the given runs (default: every run of the DAG) reached success or failed.

        ``settle``: an extra condition on all the DAG's runs (e.g. "no run is
        queued any more"), checked with the final states. Returns every run.
        """
        wanted = set(run_ids) if run_ids is not None else None
        deadline = time.monotonic() + timeout
        while True:
            self.check_running()
            runs = self.runs(dag_id)
            watched = [r for r in runs if wanted is None or r["dag_run_id"] in wanted]
            seen = {r["dag_run_id"] for r in watched}
            done = all(r["state"] in FINAL_RUN_STATES for r in watched) and (wanted is None or wanted <= seen)
            if done and (settle is None or settle(runs)):
                return runs
            if time.monotonic() > deadline:
                states = {r["dag_run_id"]: r["state"] for r in watched}
                raise TimeoutError(f"runs of {dag_id} not finished in {timeout:.0f} s: {states}")
            time.sleep(poll)

    def wait_until_idle(self, dag_id: str, *, timeout: float = 600.0, quiet: float = 5.0) -> list[dict]:
        """Until every run of the DAG is final and no new run appeared for ``quiet`` seconds."""
        deadline = time.monotonic() + timeout
        count = -1
        while True:
            runs = self.wait_for_runs(dag_id, timeout=max(1.0, deadline - time.monotonic()))
            if len(runs) == count:
                return runs
            count = len(runs)
            time.sleep(quiet)

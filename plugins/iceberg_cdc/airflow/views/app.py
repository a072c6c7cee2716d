"""The FastAPI app of the CDC view, mounted by ``plugins/cdc_ui_plugin.py`` in Airflow's API server.

Routes (under the mount prefix, ``/cdc``):

* ``GET /`` -- the page (HTML); without a login, ``401`` with a short page that
  sends the browser on to Airflow's login page (and back here after it);
* ``GET /api/tables`` -- every table the user may see, as JSON;
* ``GET /api/tables/{source}`` -- one table (``shop.orders``); 404 when it is not
  configured or the user may not read its DAG;
* ``GET /icon.svg`` -- the nav icon (public: it shows nothing).

Every other route requires a user authenticated by Airflow's auth manager
(:func:`~iceberg_cdc.airflow.views.airflow_side.authenticated_user`); a table appears only
if that user may read its DAG. The config is read from ``CDC_CONFIG`` on every
request, like the DAG files read it; a missing or invalid config is shown on
the page (the API answers 503), never a bare 500.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import HTMLResponse, JSONResponse, Response

from iceberg_cdc.airflow.hooks import mirror_postgres  # noqa: F401  (mirrors' conn_id -> DSN)
from iceberg_cdc.airflow.views.airflow_side import AirflowSide, authenticated_user
from iceberg_cdc.config import CONFIG_ENV, CdcConfig, load_config
from iceberg_cdc.errors import CdcError
from iceberg_cdc.ui.blocking import assess

MOUNT_PREFIX = "/cdc"
ICON_SVG = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" fill="none" stroke="#51504f" '
    'stroke-width="2" stroke-linecap="round" stroke-linejoin="round"><ellipse cx="12" cy="5" rx="8" ry="3"/>'
    '<path d="M4 5v6c0 1.7 3.6 3 8 3s8-1.3 8-3V5"/><path d="M4 11v6c0 1.7 3.6 3 8 3"/>'
    '<path d="M17 15l3 3-3 3"/><path d="M14 18h6"/></svg>'
)

UserDep = Annotated[Any, Depends(authenticated_user)]


class _CatalogCache:
    """One pyiceberg catalog per catalog config, kept across requests (loading one may open a pool)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._key: str | None = None
        self._catalog: Any = None

    def __call__(self, config: CdcConfig) -> Any:
        from iceberg_cdc.airflow.hooks.cdc import CdcHook

        key = json.dumps(config.catalog.model_dump(mode="json"), sort_keys=True)
        with self._lock:
            if key != self._key:
                self._catalog = CdcHook(config).catalog()
                self._key = key
            return self._catalog


def blocked_by(status: Any, runs: Any) -> None:
    """Judge the DAG's failed runs (:mod:`iceberg_cdc.ui.blocking`): the table's block, each run's meaning."""
    if runs is None:
        return
    found = assess(runs)
    status.blocked = found.blocked
    runs.failures = found.failures


def create_app(
    *,
    config_loader: Callable[[], CdcConfig] | None = None,
    airflow: AirflowSide | None = None,
    catalog_factory: Callable[[CdcConfig], Any] | None = None,
    mount_prefix: str = MOUNT_PREFIX,
    recent: int | None = None,
    timeout_seconds: float | None = None,
    with_lease: bool = True,
    connections: Callable[[str], dict[str, str]] | None = None,
) -> FastAPI:
    """The app. Every argument is for tests or embedding; the defaults read Airflow and ``CDC_CONFIG``."""
    from iceberg_cdc.airflow.hooks.cdc import CdcHook
    from iceberg_cdc.ui.status import DEFAULT_RECENT, DEFAULT_TIMEOUT_SECONDS

    load = config_loader or load_config
    connections = connections or CdcHook.s3_properties
    side = airflow or AirflowSide()
    catalogs = catalog_factory or _CatalogCache()
    recent = recent if recent is not None else int(os.environ.get("CDC_UI_RECENT", DEFAULT_RECENT))
    timeout = (
        timeout_seconds
        if timeout_seconds is not None
        else float(os.environ.get("CDC_UI_TIMEOUT_SECONDS", DEFAULT_TIMEOUT_SECONDS))
    )

    app = FastAPI(
        title="Iceberg CDC",
        description="Change data capture status per table: watermark, lag, recent commits, failed runs.",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )

    def airflow_base(request: Request) -> str:
        """Airflow's root path as the browser sees it (the app is mounted at ``<base>/cdc``)."""
        root = request.scope.get("root_path", "") or ""
        return root[: -len(mount_prefix)] if mount_prefix and root.endswith(mount_prefix) else root

    def gather(request: Request, user: Any, sources: list[str] | None = None) -> dict[str, Any]:
        from iceberg_cdc.ui.status import collect_status

        now = datetime.now(UTC)
        view: dict[str, Any] = {
            "generated_at": now,
            "config_path": os.environ.get(CONFIG_ENV),
            "config_error": None,
            "statuses": [],
            "runs": {},
            "hidden_tables": 0,
            "unknown": [],
        }
        try:
            config = load()
        except CdcError as exc:
            view["config_error"] = str(exc)
            return view
        configured = {t.source: t for t in config.tables}
        wanted = list(configured) if sources is None else [s for s in sources if s in configured]
        view["unknown"] = [s for s in sources or () if s not in configured]
        readable = side.readable_dag_ids(user, {configured[s].dag_id for s in wanted})
        shown = [s for s in wanted if configured[s].dag_id in readable]
        view["hidden_tables"] = len(wanted) - len(shown)
        if not shown:
            return view
        base = airflow_base(request)
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="cdc-ui") as pool:
            statuses = pool.submit(
                collect_status,
                config,
                tables=shown,
                recent=recent,
                catalog_factory=catalogs,
                with_lease=with_lease,
                timeout_seconds=timeout,
                now=now,
                connections=connections,
            )
            runs = {}
            for source in shown:
                dag_id = configured[source].dag_id
                runs[dag_id] = side.dag_runs(dag_id, base, with_errors=side.can_read_logs(user, dag_id))
            # Each mirror DAG's runs too (its last failure), when the user may read that DAG.
            mirror_dags = {configured[s].mirror_dag_id(m) for s in shown for m in configured[s].mirrors}
            for dag_id in sorted(side.readable_dag_ids(user, mirror_dags) if mirror_dags else ()):
                runs[dag_id] = side.dag_runs(dag_id, base, with_errors=side.can_read_logs(user, dag_id))
            view["statuses"] = statuses.result()
        view["runs"] = runs
        for status in view["statuses"]:
            blocked_by(status, runs.get(status.dag_id))
        return view

    def table_json(status: Any, all_runs: dict[str, Any]) -> dict[str, Any]:
        out = status.to_dict()
        runs = all_runs.get(status.dag_id)
        out["airflow"] = runs.to_dict() if runs is not None else None
        for mirror in out["mirrors"]:
            mirror["airflow"] = mirror_airflow(all_runs.get(mirror["dag_id"]))
        return out

    def mirror_airflow(runs: Any) -> dict[str, Any] | None:
        """A mirror DAG's latest run and last failed run (with its error line), as the table's runs are given."""
        if runs is None:
            return None
        found = runs.to_dict()
        return {
            "dag_id": found["dag_id"],
            "url": found["url"],
            "known": found["known"],
            "paused": found["paused"],
            "latest_run": found["latest_run"],
            "last_failed_run": found["failed_runs"][0] if found["failed_runs"] else None,
            "error": found["error"],
        }

    @app.exception_handler(HTTPException)
    async def _login_page(request: Request, exc: HTTPException) -> Response:
        """The page without a login: 401, and a page that sends the browser to Airflow's login.

        Not a redirect: every unauthenticated request -- a browser's, a script's
        -- gets the same 401 (the API's answer too), so nothing reads it as a
        success; a browser still lands on the login page (and comes back).
        """
        path, root = request.scope.get("path", ""), request.scope.get("root_path", "") or ""
        route = path[len(root) :] if root and path.startswith(root) else path
        if exc.status_code == 401 and request.method == "GET" and route in ("", "/"):
            from iceberg_cdc.ui.page_format import login_page

            login = side.login_url(next_url=str(request.url))
            return HTMLResponse(
                login_page(login),
                status_code=401,
                headers={"Cache-Control": "no-store", **(exc.headers or {})},
            )
        return await http_exception_handler(request, exc)

    @app.get("/", response_class=HTMLResponse)
    def page(request: Request, user: UserDep) -> HTMLResponse:
        from iceberg_cdc.ui.page import PageModel, render_page

        view = gather(request, user)
        model = PageModel(
            generated_at=view["generated_at"],
            statuses=view["statuses"],
            runs=view["runs"],
            config_path=view["config_path"],
            config_error=view["config_error"],
            hidden_tables=view["hidden_tables"],
            api_href="api/tables",
        )
        return HTMLResponse(render_page(model), headers={"Cache-Control": "no-store"})

    @app.get("/api/tables")
    def tables(request: Request, user: UserDep) -> JSONResponse:
        view = gather(request, user)
        if view["config_error"]:
            return JSONResponse({"detail": view["config_error"]}, status_code=503)
        return JSONResponse(
            {
                "generated_at": view["generated_at"].isoformat().replace("+00:00", "Z"),
                "config": view["config_path"],
                "hidden_tables": view["hidden_tables"],
                "tables": [table_json(s, view["runs"]) for s in view["statuses"]],
            },
            headers={"Cache-Control": "no-store"},
        )

    @app.get("/api/tables/{source}")
    def table(source: str, request: Request, user: UserDep) -> JSONResponse:
        view = gather(request, user, [source])
        if view["config_error"]:
            return JSONResponse({"detail": view["config_error"]}, status_code=503)
        if not view["statuses"]:
            # Not configured and not readable look the same: the answer does not tell which tables exist.
            raise HTTPException(404, f"no table {source!r} among the tables you may read")
        status = view["statuses"][0]
        return JSONResponse(table_json(status, view["runs"]), headers={"Cache-Control": "no-store"})

    @app.get("/icon.svg", include_in_schema=False)
    def icon() -> Response:
        return Response(ICON_SVG, media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"})

    return app

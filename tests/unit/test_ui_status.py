"""The CDC view: its status model on a real catalog and sink, and its FastAPI app.

The catalog is SQLite with a ``file://`` warehouse; the sink commits are real
ones, made by the pipeline's own steps (:class:`InlinePipeline`). Airflow's
side (authorization, DAG runs) is a fake here, except for authentication:
without credentials the app must refuse, through Airflow's own ``get_user``.
The real API server is in ``tests/integration/test_ui_page.py``.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from cdc_devtools.inline_pipeline import SINK, SOURCE, InlinePipeline
from cdc_devtools.orders import SCHEMA, rows
from iceberg_cdc.airflow.views.airflow_side import DagRuns, RunInfo, authenticated_user
from iceberg_cdc.airflow.views.app import create_app
from iceberg_cdc.config import parse_config
from iceberg_cdc.error_lines import ERROR_LIMIT, FailedTask
from iceberg_cdc.error_lines import line_in_log as first_error_line
from iceberg_cdc.errors import ConfigError
from iceberg_cdc.sink.table import watermark_property_names
from iceberg_cdc.ui.sink_history import processed_snapshot, skew_warnings
from iceberg_cdc.ui.status import collect_status
from tests.support.ui_history import processed_history

REPO = Path(__file__).resolve().parents[2]
DAG_ID = "cdc__shop__orders"


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> SimpleNamespace:
    """shop.orders: two appends and a copy-on-write MERGE processed, one more append pending."""
    return processed_history(tmp_path_factory.mktemp("ui"))


def _one(history, **kwargs):
    [status] = collect_status(history.config, **kwargs)
    return status


# ---------------------------------------------------------------- the status model


def test_watermark_lag_and_age_of_the_oldest_pending_snapshot(history):
    now = datetime.now(UTC) + timedelta(minutes=5)
    status = _one(history, now=now)
    assert status.errors == [] and status.notes == []
    assert (status.source, status.sink, status.dag_id) == (SOURCE, SINK, DAG_ID)
    assert status.watermark_snapshot_id == history.merge == history.ids[2]
    assert status.watermark_ordinal == 3
    assert status.pending == 1 and status.state == "behind"
    pending = history.source.metadata.snapshot_by_id(history.ids[3])
    assert status.oldest_pending_snapshot_id == pending.snapshot_id
    assert status.oldest_pending_at == datetime.fromtimestamp(pending.timestamp_ms / 1000, UTC)
    assert 290 < status.oldest_pending_age_seconds < 400
    assert status.source_snapshot_id == history.ids[3]
    assert status.lease_checked and status.lease is None  # the file:// shuffle store: nobody holds it


def test_last_processed_snapshots_with_their_figures(history):
    status = _one(history)
    merge, second, first = status.recent
    assert [s.source_snapshot_id for s in status.recent] == [history.ids[2], history.ids[1], history.ids[0]]
    assert [s.ordinal for s in status.recent] == [3, 2, 1]
    # The MERGE: ids 1 and 2 move to eu (updates), 3 is deleted; the rest of the rewritten files is carryover.
    assert (merge.inserts, merge.deletes, merge.updates) == (0, 1, 2)
    assert merge.carryover_rows == 14 and merge.change_rows == 5
    assert merge.shuffle_bytes and merge.shuffle_bytes > 0
    # The carryover stayed in its partition: cancelled in the write task, never shuffled.
    assert merge.rows == {
        "input": 19,
        "masked": 0,
        "cancelled": 14,
        "shuffled": 5,
        "read": 5,
        "carryover": 0,
        "changes": 5,
    }
    assert merge.balanced is True
    assert {"detect", "write", "coalesce", "read"} <= set(merge.seconds)
    assert next(iter(merge.seconds)) == "detect"  # phases in run order
    assert merge.operation == "overwrite" and not merge.initial_load and not merge.reprocess
    assert merge.skew == []
    for appended in (second, first):
        assert (appended.inserts, appended.deletes, appended.updates) == (10, 0, 0)
        assert appended.shuffle_bytes is None  # insert-only: no shuffle
        assert appended.rows["shuffled"] == 0 and appended.balanced is True
        assert "insert" in appended.seconds
    assert merge.committed_at >= second.committed_at >= first.committed_at
    assert [s.ordinal for s in _one(history, recent=2).recent] == [3, 2]


def test_a_table_that_is_caught_up(tmp_path):
    pipeline = InlinePipeline(tmp_path)
    pipeline.create_source(SCHEMA).append(rows(range(3)))
    pipeline.catch_up()
    [status] = collect_status(pipeline.config)
    assert status.state == "caught-up" and status.pending == 0
    assert status.oldest_pending_snapshot_id is None and status.oldest_pending_age_seconds is None
    assert status.recent[0].inserts == 3


def test_each_table_keeps_its_own_problems(history, tmp_path):
    catalog = history.pipeline.catalog
    if not catalog.table_exists("shop.items"):
        catalog.create_table("shop.items", schema=SCHEMA).append(rows(range(4)))
    raw = {
        **history.pipeline.raw,
        "tables": [
            *history.pipeline.raw["tables"],
            {"source": "shop.items", "sink": "shop.items_changes"},  # sink not created yet
            {"source": "shop.nothing", "sink": "shop.nothing_changes"},  # no source
        ],
    }
    orders, items, nothing = collect_status(parse_config(raw))
    assert orders.errors == [] and orders.watermark_ordinal == 3
    assert items.errors == [] and items.sink_exists is False and items.pending == 1
    assert items.watermark_snapshot_id is None and items.recent == []
    assert any("does not exist yet" in note for note in items.notes)
    assert nothing.state == "error" and nothing.source_exists is False
    assert any("source table shop.nothing does not exist" in e for e in nothing.errors)


def test_a_watermark_off_the_source_history_is_an_error_on_that_table(tmp_path):
    pipeline = InlinePipeline(tmp_path)
    pipeline.create_source(SCHEMA).append(rows(range(3)))
    pipeline.catch_up()
    uuid_key, _, _ = watermark_property_names(SOURCE)
    with pipeline.sink.transaction() as tx:
        tx.set_properties(
            {uuid_key: "00000000-0000-0000-0000-000000000000"}
        )  # as if the source was recreated
    [status] = collect_status(pipeline.config)
    assert status.state == "error" and status.pending is None
    assert any("SourceHistoryError" in e for e in status.errors)
    assert status.recent and status.recent[0].inserts == 3  # what the sink holds is still shown


def test_an_unreachable_catalog_is_an_error_per_table_not_an_exception(history, tmp_path):
    raw = {**history.pipeline.raw}
    raw["catalog"] = {**raw["catalog"], "uri": f"sqlite:///{tmp_path / 'missing-dir' / 'catalog.db'}"}
    [status] = collect_status(parse_config(raw), with_lease=False)
    assert status.state == "error" and status.errors
    assert status.watermark_snapshot_id is None and status.recent == []

    def broken(config):
        raise ConnectionError("catalog at http://catalog:8181 refused the connection")

    [status] = collect_status(history.config, catalog_factory=broken, with_lease=False)
    assert status.errors == [
        "catalog 'inline' unreachable: ConnectionError: catalog at http://catalog:8181 refused the connection"
    ]


def test_secrets_never_reach_the_messages(history):
    raw = {
        **history.pipeline.raw,
        "catalog": {**history.pipeline.raw["catalog"], "s3.secret-access-key": "hunter2-secret"},
    }

    def leaky(config):
        raise RuntimeError("bad credentials hunter2-secret for http://user:pw-in-url@host/x")

    [status] = collect_status(parse_config(raw), catalog_factory=leaky, with_lease=False)
    assert "hunter2-secret" not in status.errors[0] and "pw-in-url" not in status.errors[0]
    assert "***" in status.errors[0]


def test_a_table_that_does_not_answer_in_time_is_reported_as_such(history):
    class Slow:
        def load_table(self, identifier):
            time.sleep(2)
            raise RuntimeError("too late")

    started = time.monotonic()
    [status] = collect_status(
        history.config, catalog_factory=lambda c: Slow(), with_lease=False, timeout_seconds=0.3
    )
    assert time.monotonic() - started < 1.5
    assert status.errors == ["no answer from the catalog or storage within 0.3 s"]


def test_commits_without_figures_and_skew_warnings():
    snapshot = SimpleNamespace(snapshot_id=7, timestamp_ms=1_700_000_000_000)
    older = processed_snapshot(
        snapshot, {"cdc.source-table": SOURCE, "cdc.source-snapshot-id": "42", "added-records": "8"}
    )
    assert older is not None and older.ordinal is None
    assert (older.inserts, older.deletes, older.updates, older.shuffle_bytes) == (None, None, None, None)
    assert older.change_rows == 8 and older.balanced is None and older.seconds == {} and older.skew == []
    assert older.to_dict()["source_snapshot_id"] == "42"  # 64-bit ids as strings in JSON
    assert processed_snapshot(snapshot, {"cdc.source-table": SOURCE}) is None  # a reprocess's delete snapshot
    skewed = {
        "cdc.skewed": "2",
        "cdc.skew.max-ratio": "41.3",
        "cdc.skew.max-bytes": str(12 * 2**20),
        "cdc.skew.partitions": "17,3",
    }
    assert skew_warnings(skewed) == ["2 skewed partitions (17, 3): largest 12.0 MiB, 41x the median"]
    assert skew_warnings({**skewed, "cdc.skewed": "1", "cdc.skew.partitions": "17"}) == [
        "1 skewed partition (17): 12.0 MiB, 41x the median"
    ]
    assert skew_warnings({"cdc.skewed": "30", "cdc.skew.partitions": "1,2"}) == [
        "30 skewed partitions (1, 2, …)"
    ]
    assert skew_warnings({"cdc.skewed": "0", "cdc.inserts": "3"}) == []
    assert skew_warnings({"cdc.inserts": "3"}) == []
    unbalanced = processed_snapshot(
        snapshot,
        {
            "cdc.source-snapshot-id": "1",
            **{"cdc.rows.input": "9", "cdc.rows.shuffled": "9", "cdc.rows.read": "3"},
            **{"cdc.rows.carryover": "2", "cdc.rows.changes": "1"},
        },
    )
    assert unbalanced.balanced is False


# ---------------------------------------------------------------- the Airflow side, without Airflow


def test_skew_found_by_coalesce_reaches_the_commit_summary_and_the_page(tmp_path, monkeypatch):
    """A real MERGE through the pipeline's steps, with coalesce told to call any above-median partition skewed."""
    from cdc_devtools.cow import cow_merge
    from iceberg_cdc.airflow.views.app import create_app
    from iceberg_cdc.run import shuffle_steps
    from iceberg_cdc.shuffle.coalesce import coalesce

    monkeypatch.setattr(
        shuffle_steps,
        "plan_ranges",
        lambda sizes, t, m, **kw: coalesce(sizes, t, m, skew_factor=1.0, skew_min_bytes=0, **kw),
    )
    # Every row through the shuffle (no carryover cancelled before it), so partitions differ in size.
    pipeline = InlinePipeline(tmp_path, shuffle={"cancel_before_shuffle": False})
    source = pipeline.create_source(SCHEMA)
    source.append(rows(range(40)))
    pipeline.catch_up()
    merge = cow_merge(source, upserts=rows([1, 2], region="eu", status="paid"), delete_keys=[3])
    [run] = pipeline.catch_up()
    assert run.committed["skewed_partitions"] >= 1 and run.committed["skew_max_ratio"] > 1.0
    summary = next(
        s.summary.additional_properties
        for s in pipeline.sink.snapshots()
        if s.summary.additional_properties.get("cdc.source-snapshot-id") == str(merge)
    )
    count = int(summary["cdc.skewed"])
    assert count == run.committed["skewed_partitions"] == len(summary["cdc.skew.partitions"].split(","))
    assert float(summary["cdc.skew.max-ratio"]) == run.committed["skew_max_ratio"]
    assert int(summary["cdc.skew.max-bytes"]) > int(summary["cdc.skew.median-bytes"]) > 0
    [status] = collect_status(pipeline.config, with_lease=False)
    latest, first = status.recent
    assert latest.skew and latest.skew[0].startswith(f"{count} skewed partition")
    assert first.skew == []  # insert-only: no shuffle, no skew figures
    assert status.skewed_commits == 1
    app = create_app(config_loader=lambda: pipeline.config, airflow=FakeAirflow())
    app.dependency_overrides[authenticated_user] = lambda: "alice"
    page = TestClient(app).get("/").text
    assert 'data-field="skew-warning"' in page and 'data-field="skew"' in page
    assert "1 of the last 2 commits had skewed partitions" in page


def test_no_skew_is_recorded_as_zero_for_a_shuffled_snapshot(history):
    merge = next(
        s.summary.additional_properties
        for s in history.pipeline.sink.snapshots()
        if s.summary.additional_properties.get("cdc.source-snapshot-id") == str(history.merge)
    )
    assert merge["cdc.skewed"] == "0" and "cdc.skew.max-ratio" not in merge


def test_first_error_line_of_a_task_log():
    log = [
        {"event": "::group::Log message source details"},
        {"level": "error", "event": "Could not read served logs: connection refused"},  # the reader's own
        {"level": "info", "event": "detect: taking the lease"},
        {"level": "error", "event": "something went wrong\nwith details"},
        {
            "level": "error",
            "event": "Task failed with exception",
            "error_detail": [
                {"exc_type": "OSError", "exc_value": "the cause", "frames": []},
                {
                    "exc_type": "SourceHistoryError",
                    "exc_value": "Cannot reprocess snapshot 1\nmore",
                    "frames": [],
                },
            ],
        },
    ]
    assert first_error_line(log) == "SourceHistoryError: Cannot reprocess snapshot 1"
    assert first_error_line(log[:4]) == "something went wrong"
    assert first_error_line(log[:3]) is None
    objects = [SimpleNamespace(event="boom", level="critical", error_detail=None)]
    assert first_error_line(objects) == "boom"
    assert len(first_error_line([{"level": "error", "event": "x" * 5000}])) == ERROR_LIMIT


def test_tokens_are_checked_by_airflows_auth_manager(history, monkeypatch):
    """No override: Airflow's own get_user decides, through the configured auth manager."""
    import jwt
    from airflow.api_fastapi import app as airflow_app

    class StubAuthManager:  # stands for the configured one; only this method is reached
        async def get_user_from_token(self, token):
            if token == "valid-token":
                return "bob"
            raise jwt.InvalidTokenError("signature mismatch")

    if hasattr(airflow_app, "_AuthManagerState"):  # Airflow >= 3.2
        monkeypatch.setattr(airflow_app._AuthManagerState, "instance", StubAuthManager())
    else:  # Airflow 3.1: a module global
        monkeypatch.setattr(airflow_app, "auth_manager", StubAuthManager())
    airflow = FakeAirflow()
    client = TestClient(create_app(config_loader=lambda: history.config, airflow=airflow))
    assert client.get("/api/tables", headers={"Authorization": "Bearer forged"}).status_code == 403
    assert client.get("/api/tables").status_code == 401
    assert client.get("/api/tables", cookies={"_token": "forged"}).status_code == 403
    assert airflow.asked == []
    assert client.get("/api/tables", headers={"Authorization": "Bearer valid-token"}).status_code == 200
    client.cookies.set("_token", "valid-token")  # the UI's cookie, as the page inside Airflow gets it
    assert client.get("/").status_code == 200
    assert airflow.asked == ["bob", "bob"]


# ---------------------------------------------------------------- the app


class FakeAirflow:
    """Authorization and runs as a test decides them."""

    def __init__(self, readable: set[str] | None = None, logs: bool = True) -> None:
        self.readable = readable
        self.logs = logs
        self.asked: list[Any] = []

    def readable_dag_ids(self, user, dag_ids):
        self.asked.append(user)
        return set(dag_ids) if self.readable is None else set(dag_ids) & self.readable

    def can_read_logs(self, user, dag_id):
        return self.logs

    def dag_runs(self, dag_id, base, *, with_errors):
        run_id = "manual__2026-01-02T03:04:05+00:00"
        url = f"{base}/dags/{dag_id}/runs/{run_id.replace(':', '%3A').replace('+', '%2B')}"
        failed = RunInfo(
            run_id=run_id,
            state="failed",
            run_type="manual",
            run_after=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
            started_at=None,
            ended_at=datetime(2026, 1, 2, 3, 5, 0, tzinfo=UTC),
            snapshot_id="123",
            url=url,
            failed_tasks=[
                FailedTask(
                    "detect",
                    -1,
                    "SourceHistoryError: <script>alert(1)</script> not in history" if with_errors else None,
                    try_number=1,
                    url=f"{url}/tasks/detect",
                )
            ],
            note="failed at detect: SourceHistoryError: snapshot 123 is not in the ancestry",
            reprocess=True,  # a reprocess of snapshot 123 (its conf): bad input, the table is not blocked
        )
        done = RunInfo(
            run_id="chained__s42__20260102T030000",
            state="success",
            run_type="manual",
            run_after=datetime(2026, 1, 2, 3, 0, 0, tzinfo=UTC),
            started_at=None,
            ended_at=datetime(2026, 1, 2, 3, 1, 0, tzinfo=UTC),
            snapshot_id=None,
            url=f"{base}/dags/{dag_id}/runs/chained__s42__20260102T030000",
            note="snapshot 42 (overwrite, #3): +0 -1 ±2 updates, carryover 14, 1.2 KiB shuffled",
        )
        return DagRuns(dag_id, f"{base}/dags/{dag_id}", True, False, failed, [failed], [failed, done])

    def login_url(self, next_url):
        return f"/auth/login?next={next_url}"


def _client(history, airflow=None, *, user="alice", **kwargs) -> tuple[TestClient, FakeAirflow]:
    airflow = airflow or FakeAirflow()
    app = create_app(config_loader=lambda: history.config, airflow=airflow, **kwargs)
    if user is not None:
        app.dependency_overrides[authenticated_user] = lambda: user
    return TestClient(app), airflow


def test_without_credentials_the_app_refuses(history):
    client, airflow = _client(history, user=None)
    for path in ("/api/tables", f"/api/tables/{SOURCE}"):
        response = client.get(path)
        assert response.status_code == 401, path
        assert SINK not in response.text
    page = client.get("/", follow_redirects=False)
    # 401 like the API (never a 2xx or 3xx a script could take for success); the browser is sent on.
    assert page.status_code == 401 and SINK not in page.text
    assert '<meta http-equiv="refresh" content="0; url=/auth/login?next=' in page.text
    assert airflow.asked == []  # nothing was read for nobody
    assert client.get("/icon.svg").status_code == 200  # the nav icon shows nothing


def test_every_data_route_requires_the_airflow_user(history):
    app = create_app(config_loader=lambda: history.config, airflow=FakeAirflow())
    guarded = {}
    for route in app.routes:
        if getattr(route, "dependant", None) is None:
            continue
        calls = {d.call for d in route.dependant.dependencies}
        guarded[route.path] = authenticated_user in calls
    assert guarded == {"/": True, "/api/tables": True, "/api/tables/{source}": True, "/icon.svg": False}


def test_api_tables(history):
    client, airflow = _client(history)
    response = client.get("/api/tables")
    assert response.status_code == 200
    body = response.json()
    assert airflow.asked == ["alice"] and body["hidden_tables"] == 0
    [table] = body["tables"]
    assert table["source"] == SOURCE and table["sink"] == SINK and table["state"] == "behind"
    assert table["watermark"]["snapshot_id"] == str(history.merge) and table["watermark"]["ordinal"] == 3
    assert table["lag"]["pending_snapshots"] == 1
    assert table["lag"]["oldest_pending_snapshot_id"] == str(history.ids[3])
    merge = table["recent"][0]
    assert (merge["inserts"], merge["deletes"], merge["updates"], merge["carryover_rows"]) == (0, 1, 2, 14)
    assert merge["rows"]["changes"] == 5 and merge["balanced"] is True
    [failed] = table["airflow"]["failed_runs"]
    assert failed["url"] == f"/dags/{DAG_ID}/runs/manual__2026-01-02T03%3A04%3A05%2B00%3A00"
    assert failed["first_error"].startswith("detect: SourceHistoryError")
    one = client.get(f"/api/tables/{SOURCE}")
    assert one.status_code == 200 and one.json()["watermark"] == table["watermark"]
    assert client.get("/api/tables/shop.unknown").status_code == 404


def test_tables_whose_dag_the_user_may_not_read_are_not_shown(history):
    client, _ = _client(history, FakeAirflow(readable=set()))
    body = client.get("/api/tables").json()
    assert body["tables"] == [] and body["hidden_tables"] == 1
    assert client.get(f"/api/tables/{SOURCE}").status_code == 404  # same answer as for an unknown table
    page = client.get("/").text
    assert SINK not in page and "1 configured table is not shown" in page


def test_error_lines_need_the_right_to_read_task_logs(history):
    client, _ = _client(history, FakeAirflow(logs=False))
    [failed] = client.get("/api/tables").json()["tables"][0]["airflow"]["failed_runs"]
    assert failed["first_error"] is None and failed["failed_tasks"][0]["task_id"] == "detect"
    assert failed["note"].startswith("failed at detect: SourceHistoryError")
    # The page falls back to the run's note, which Airflow shows to every reader of the DAG's runs.
    page = client.get("/").text
    assert 'data-field="run-note">failed at detect: SourceHistoryError: snapshot 123' in page


def test_the_page(history):
    client, _ = _client(history)
    response = client.get("/")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    page = response.text
    for text in (SOURCE, SINK, DAG_ID, str(history.merge), str(history.ids[3]), "1 pending"):
        assert text in page, text
    assert '<td class="num" data-field="deletes">1</td>' in page
    assert '<td class="num" data-field="updates">2</td>' in page
    assert '<td class="num" data-field="carryover">14</td>' in page
    assert "19 in, 14 cancelled → 5 shuffled → 5 read = 0 carryover + 5 changes" in page
    assert f'href="/dags/{DAG_ID}/runs/manual__2026-01-02T03%3A04%3A05%2B00%3A00" target="_top"' in page
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert 'id="auto-refresh"' in page
    assert 'data-field="latest-note">failed at detect: SourceHistoryError: snapshot 123' in page
    # Recent runs, each with its note (Airflow's own Runs list shows no notes)
    assert 'data-field="recent-runs"' in page
    assert "snapshot 42 (overwrite, #3): +0 -1 ±2 updates, carryover 14, 1.2 KiB shuffled" in page


def test_links_follow_the_mount_and_airflow_base_path(history):
    app = create_app(config_loader=lambda: history.config, airflow=FakeAirflow())
    app.dependency_overrides[authenticated_user] = lambda: "alice"
    airflow_app = FastAPI()
    airflow_app.mount("/cdc", app)
    for root, prefix in (("", ""), ("/airflow", "/airflow")):
        client = TestClient(airflow_app, root_path=root)
        body = client.get(f"{root}/cdc/api/tables").json()  # the server's root path is part of the path
        assert body["tables"][0]["airflow"]["url"] == f"{prefix}/dags/{DAG_ID}"


def test_a_bad_config_is_shown_not_a_500(history):
    def broken():
        raise ConfigError("config file /etc/cdc.yaml is invalid:\n  tables: required key is missing")

    app = create_app(config_loader=broken, airflow=FakeAirflow())
    app.dependency_overrides[authenticated_user] = lambda: "alice"
    client = TestClient(app)
    page = client.get("/")
    assert page.status_code == 200 and "tables: required key is missing" in page.text
    api = client.get("/api/tables")
    assert api.status_code == 503 and "required key is missing" in api.json()["detail"]


def test_the_airflow_plugin_module():
    # Loaded by the airflow.plugins entry point, or by plugins/cdc_ui_plugin.py in a plugins folder
    # (tests/unit/test_distribution.py covers which).
    from iceberg_cdc.airflow.plugin import CdcUiPlugin as plugin

    [app] = plugin.fastapi_apps
    assert app["url_prefix"] == "/cdc" and isinstance(app["app"], FastAPI)
    [view] = plugin.external_views
    assert view["destination"] == "nav" and view["url_route"] == "cdc"
    assert view["href"] == "cdc/"  # relative to Airflow's base URL


def test_the_retention_guard_on_the_status_and_the_page(tmp_path):
    from iceberg_cdc.source.retention import MAX_SNAPSHOT_AGE_PROPERTY
    from iceberg_cdc.ui.page import PageModel, render_page

    # protect_base off: the watermark's snapshot is held only by main's retention, as before tags.
    pipeline = InlinePipeline(tmp_path, table={"retention_warning": "2h", "protect_base": False})
    source = pipeline.create_source(SCHEMA, properties={MAX_SNAPSHOT_AGE_PROPERTY: str(3 * 3600 * 1000)})
    source.append(rows(range(3)))
    pipeline.catch_up()
    mark = pipeline.watermark().snapshot_id
    source.append(rows(range(3, 6)))
    made = datetime.fromtimestamp(source.metadata.snapshot_by_id(mark).timestamp_ms / 1000, UTC)

    calm = _one(SimpleNamespace(config=pipeline.config), now=made)
    assert (
        calm.retention["first"]["snapshot_id"] == str(mark) and calm.retention["first"]["role"] == "watermark"
    )
    assert calm.retention["seconds_left"] == pytest.approx(3 * 3600, abs=1)
    assert calm.retention_warning is None
    page = render_page(PageModel(generated_at=made, statuses=[calm]))
    assert (
        'data-field="retention"' in page
        and "may be expired in 3 h" in page
        and "⚠" not in page.split("Expiry")[1][:300]
    )

    late = _one(SimpleNamespace(config=pipeline.config), now=made + timedelta(hours=2, minutes=30))
    assert late.retention_warning and f"snapshot {mark} may be expired in 30 min" in late.retention_warning
    assert late.to_dict()["retention"]["seconds_left"] == pytest.approx(1800, abs=1)
    page = render_page(PageModel(generated_at=made, statuses=[late]))
    assert 'class="warn" data-field="retention"' in page


# ---------------------------------------------------------------- a history that stays true


def test_a_replaced_commit_is_marked_and_a_foreign_writer_is_named(tmp_path):
    from iceberg_cdc.run.story import story

    pipeline = InlinePipeline(tmp_path)
    source = pipeline.create_source(SCHEMA)
    source.append(rows(range(5)))
    source.append(rows(range(5, 8)))
    pipeline.catch_up()
    first, second = (s.snapshot_id for s in pipeline.source.snapshots())
    pipeline.run(snapshot_id=first)  # a reprocess: the first commit's rows are deleted and written again
    [status] = collect_status(pipeline.config)
    assert [(s.source_snapshot_id, s.replaced) for s in status.recent] == [
        (first, False),
        (second, False),
        (first, True),
    ]
    newest, _, old = status.recent
    assert old.replaced_by == newest.sink_snapshot_id and old.replaced_at == newest.committed_at
    assert status.foreign == [] and status.warnings == []
    raw = status.to_dict()["recent"][2]
    assert raw["replaced"] is True and raw["replaced_by"] == str(newest.sink_snapshot_id)

    # Another writer appends rows to the changelog: the view and the next run's note say so.
    sink = pipeline.sink
    sink.append(sink.scan(limit=2).to_arrow())
    foreign = pipeline.sink.current_snapshot().snapshot_id
    [status] = collect_status(pipeline.config)
    assert [f.snapshot_id for f in status.foreign] == [foreign]
    assert status.foreign[0].operation == "append" and status.foreign[0].added_records == 2
    [warning] = status.warnings
    assert f"snapshot {foreign} (append, +2 rows" in warning
    assert status.to_dict()["foreign_commits"][0]["snapshot_id"] == str(foreign)
    source = pipeline.source
    source.append(rows(range(8, 9)))
    run = pipeline.run()
    [detected_warning] = run.detected.warnings
    assert f"snapshot {foreign}" in detected_warning and "did not write" in detected_warning
    assert "⚠ sink shop.orders_changes has 1 snapshot(s) the pipeline did not write" in story(
        run.detected, run.committed
    )

    client, _ = _client(SimpleNamespace(config=pipeline.config))
    page = client.get("/").text
    assert page.count('data-replaced="true"') == 1 and "replaced by a reprocess" in page
    assert 'data-field="warning">⚠ the sink has 1 snapshot(s) the pipeline did not write' in page

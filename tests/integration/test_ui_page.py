"""The CDC view in the real ``airflow api-server``, with login on, seen by headless Chromium.

One Airflow home for the module: a SQLite catalog and ``file://`` warehouse
whose sink holds three real commits (one pending snapshot after them), one
failed DAG run made by ``airflow dags test`` (a reprocess of a snapshot that
does not exist), and the API server on 127.0.0.1 with the simple auth
manager and one user. Checked:

* without a login, the API answers 401 (403 for a bad token), the page
  redirects to Airflow's login, and Chromium (``--headless --dump-dom``)
  never sees the data;
* with a token from ``POST /auth/token``, the JSON API and the plugin listing;
* the page in Chromium, logged in through the UI's ``_token`` cookie (set
  over the DevTools protocol): table names, watermark, counts and the failed
  run appear in the rendered DOM; and in Airflow's own UI at ``/plugin/cdc``,
  the nav entry frames the page.

``CDC_UI_SCREENSHOTS=docs/img`` saves both pages as PNG (the screenshots of
``docs/ui.md``). Chromium comes from Debian's package ``chromium``
(``apt-get install -y chromium``); without it the browser tests skip.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from cdc_devtools.airflow_env import VENV_BIN, airflow_env, dags_test, ensure_airflow_db
from tests.support.inline_pipeline import SINK, SOURCE
from tests.support.ui_history import processed_history

pytestmark = pytest.mark.e2e

DAG_ID = "cdc__shop__orders"
USER, PASSWORD = "admin", "cdc-ui-test-password"
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="headless Chromium not found: install the Debian package `chromium` (apt-get install -y chromium)",
)
SCREENSHOTS = os.environ.get("CDC_UI_SCREENSHOTS")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(url: str, *, token: str | None = None, data: dict | None = None) -> tuple[int, dict, str]:
    """(status, headers, body) without following redirects."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body = None
    if data is not None:
        body = json.dumps(data).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=body, headers=headers)
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(request, timeout=60) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


def _stop(process: subprocess.Popen) -> None:
    """Stop a process this module started, with its children (its own process group)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[SimpleNamespace]:
    tmp = tmp_path_factory.mktemp("ui-page")
    history = processed_history(tmp / "data")
    pipeline, merge, pending = history.pipeline, history.merge, history.pending
    config_path = tmp / "cdc.yaml"
    config_path.write_text(yaml.safe_dump(pipeline.raw))

    passwords = tmp / "passwords.json"
    passwords.write_text(json.dumps({USER: PASSWORD}))
    env = airflow_env(tmp / "airflow", config_path)
    port = _free_port()
    env.update(
        {
            "CDC_TASK_RETRIES": "0",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__WORKERS": "1",
        }
    )
    ensure_airflow_db(env)
    # A failed run: a reprocess of a snapshot the table never had fails in detect, before any Spark.
    with open(tmp / "failed-run.log", "w") as out:
        assert dags_test(env, DAG_ID, {"snapshot_id": 1, "trigger_next": False}, out) != 0

    base = f"http://127.0.0.1:{port}"
    log = open(tmp / "api-server.log", "w")  # noqa: SIM115 (closed at teardown)
    process = subprocess.Popen(
        [str(VENV_BIN / "airflow"), "api-server", "-H", "127.0.0.1", "-p", str(port), "-w", "1"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                pytest.fail(f"airflow api-server exited with {process.returncode}; see {log.name}")
            try:
                if _request(f"{base}/api/v2/monitor/health")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"airflow api-server did not answer within 120 s; see {log.name}")
            time.sleep(0.5)
        status, _, body = _request(f"{base}/auth/token", data={"username": USER, "password": PASSWORD})
        assert status == 201, body
        yield SimpleNamespace(
            base=base,
            token=json.loads(body)["access_token"],
            merge=merge,
            pending=pending,
            tmp=tmp,
        )
    finally:
        _stop(process)
        log.close()


def test_without_login_the_view_refuses(server):
    for path in ("/cdc/api/tables", f"/cdc/api/tables/{SOURCE}"):
        status, _, body = _request(server.base + path)
        assert status == 401 and SINK not in body, (path, status, body)
        status, _, body = _request(server.base + path, token="not-a-token")
        assert status == 403 and SINK not in body, (path, status, body)
    status, headers, _ = _request(f"{server.base}/cdc/")
    assert status == 303 and headers["location"].startswith("/auth/login?next=")
    assert _request(f"{server.base}/cdc/icon.svg")[0] == 200


def test_the_json_api_with_a_token(server):
    status, _, body = _request(f"{server.base}/cdc/api/tables", token=server.token)
    assert status == 200, body
    [table] = json.loads(body)["tables"]
    assert (table["source"], table["sink"], table["state"]) == (SOURCE, SINK, "behind")
    assert table["watermark"]["snapshot_id"] == str(server.merge) and table["watermark"]["ordinal"] == 3
    assert table["lag"]["pending_snapshots"] == 1
    assert table["lag"]["oldest_pending_snapshot_id"] == str(server.pending)
    merge = table["recent"][0]
    assert (merge["inserts"], merge["deletes"], merge["updates"], merge["carryover_rows"]) == (0, 1, 2, 14)
    airflow = table["airflow"]
    assert airflow["known"] and airflow["url"] == f"/dags/{DAG_ID}"
    [failed] = airflow["failed_runs"]
    assert failed["state"] == "failed" and failed["snapshot_id"] == "1"
    assert failed["url"].startswith(f"/dags/{DAG_ID}/runs/manual__")
    assert [t["task_id"] for t in failed["failed_tasks"]] == ["detect"]
    # The plugin's listener noted why the run failed (dags test logs to the console only: no log line).
    assert failed["note"].startswith("failed at detect: SourceHistoryError: "), failed["note"]
    status, _, body = _request(f"{server.base}/api/v2/dags/{DAG_ID}/dagRuns", token=server.token)
    assert status == 200, body
    [run] = json.loads(body)["dag_runs"]
    assert run["note"] == failed["note"]  # the note Airflow's run page shows
    assert [r["note"] for r in airflow["recent_runs"]] == [failed["note"]]
    status, _, body = _request(f"{server.base}/cdc/api/tables/{SOURCE}", token=server.token)
    assert status == 200 and json.loads(body)["watermark"] == table["watermark"]


def test_the_plugin_is_registered_with_a_nav_entry(server):
    status, _, body = _request(f"{server.base}/api/v2/plugins", token=server.token)
    assert status == 200, body
    [plugin] = [p for p in json.loads(body)["plugins"] if p["name"] == "iceberg_cdc_ui"]
    assert plugin["fastapi_apps"][0]["url_prefix"] == "/cdc"
    [view] = plugin["external_views"]
    assert (view["destination"], view["url_route"], view["href"]) == ("nav", "cdc", "cdc/")


# ---------------------------------------------------------------- in the browser


class Chromium:
    """Headless Chromium driven over the DevTools protocol (to log in with Airflow's cookie)."""

    def __init__(self, tmp: Path, width: int = 1400, height: int = 1000) -> None:
        from websockets.sync.client import connect

        profile = tmp / f"chromium-{time.monotonic_ns()}"
        self.process = subprocess.Popen(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--no-first-run",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        active = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (active.exists() and len(active.read_text().split()) >= 2):
            if time.monotonic() > deadline or self.process.poll() is not None:
                _stop(self.process)
                raise RuntimeError("Chromium did not open its DevTools port")
            time.sleep(0.1)
        port = int(active.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as response:
            pages = [t for t in json.load(response) if t["type"] == "page"]
        self._stack = contextlib.ExitStack()
        self.ws = self._stack.enter_context(
            connect(pages[0]["webSocketDebuggerUrl"], max_size=64 << 20, open_timeout=10)
        )
        self._next = 0
        self.call("Page.enable")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._next += 1
        ident = self._next
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv(timeout=60))
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    def open(self, url: str, ready: str = "document.readyState === 'complete'", timeout: float = 60) -> None:
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + timeout
        while not self.evaluate(f"!!({ready})"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url}: not ready ({ready}) within {timeout} s")
            time.sleep(0.25)

    def screenshot(self, path: Path, height: int | None = None) -> None:
        params: dict[str, Any] = {"format": "png"}
        if height:
            params.update(
                captureBeyondViewport=True, clip={"x": 0, "y": 0, "width": 1400, "height": height, "scale": 1}
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", **params)["data"]))

    def close(self) -> None:
        try:
            self._stack.close()
        finally:
            _stop(self.process)


@needs_chromium
def test_without_login_chromium_sees_the_login_page_not_the_data(server):
    result = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--user-data-dir={server.tmp / 'chromium-anonymous'}",
            "--virtual-time-budget=5000",
            "--dump-dom",
            f"{server.base}/cdc/",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    dom = result.stdout
    assert "<html" in dom
    assert SINK not in dom and str(server.merge) not in dom and "Change data capture" not in dom


@needs_chromium
def test_the_page_in_chromium(server):
    browser = Chromium(server.tmp)
    try:
        browser.call(
            "Network.setCookie",
            name="_token",
            value=server.token,
            url=server.base + "/",
            httpOnly=True,
        )
        browser.open(f"{server.base}/cdc/", ready="document.querySelector('section[data-source]')")
        dom = browser.evaluate("document.documentElement.outerHTML")
        section = browser.evaluate(f"document.querySelector('section[data-source=\"{SOURCE}\"]').innerText")
        for text in (SOURCE, SINK, DAG_ID, str(server.merge), "1 pending", "detect"):
            assert text in dom, text
        field = 'document.querySelector(\'section[data-source="%s"] [data-field="%s"]\').textContent'
        assert browser.evaluate(field % (SOURCE, "watermark-snapshot")) == str(server.merge)
        assert browser.evaluate(field % (SOURCE, "watermark-ordinal")) == "3"
        assert browser.evaluate(field % (SOURCE, "pending")) == "1"
        first_row = "document.querySelector('table.recent tbody tr [data-field=\"%s\"]').textContent"
        counts = {
            name: browser.evaluate(first_row % name)
            for name in ("inserts", "deletes", "updates", "carryover")
        }
        assert counts == {"inserts": "0", "deletes": "1", "updates": "2", "carryover": "14"}
        assert "19 in → 19 shuffled → 19 read = 14 carryover + 5 changes" in section
        run_link = browser.evaluate("document.querySelector('table.failed a').getAttribute('href')")
        assert run_link.startswith(f"/dags/{DAG_ID}/runs/manual__")
        if SCREENSHOTS:
            height = browser.evaluate("document.documentElement.scrollHeight")
            browser.screenshot(Path(SCREENSHOTS) / "cdc-page.png", height=min(int(height), 2000))

        # Airflow's own UI: the nav entry frames the page at /plugin/cdc.
        frame_ready = (
            "document.querySelector('iframe') && document.querySelector('iframe').contentDocument && "
            "document.querySelector('iframe').contentDocument.querySelector('section[data-source]')"
        )
        browser.open(f"{server.base}/plugin/cdc", ready=frame_ready, timeout=90)
        assert browser.evaluate("document.querySelector('iframe').getAttribute('src')").endswith("cdc/")
        assert browser.evaluate("!!document.querySelector('a[href$=\"plugin/cdc\"]')")  # the nav entry
        framed = browser.evaluate("document.querySelector('iframe').contentDocument.body.innerText")
        assert SINK in framed and str(server.merge) in framed
        if SCREENSHOTS:
            time.sleep(1)  # the nav's icons
            browser.screenshot(Path(SCREENSHOTS) / "cdc-in-airflow.png")
    finally:
        browser.close()

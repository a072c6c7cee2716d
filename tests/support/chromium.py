"""Headless Chromium driven over the DevTools protocol, as a user drives it: pages, clicks, keystrokes.

Debian's ``chromium`` package (``apt-get install -y chromium``); without it the
browser tests skip (:data:`needs_chromium`). Each browser gets a fresh profile
and runs with networking features that would reach outside 127.0.0.1 off.
Typing goes through ``Input.dispatchKeyEvent`` -- one key down, char and key up
per character, as a keyboard sends them -- so a form sees exactly what a
person's typing produces.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="headless Chromium not found: install the Debian package `chromium` (apt-get install -y chromium)",
)
CALL_SECONDS = 60  # one DevTools call, events before its answer included
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def stop(process: subprocess.Popen) -> None:
    """Stop a process started here, with its children (its own process group)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def dump_dom(url: str, profile: Path, budget_ms: int = 5000) -> str:
    """The DOM Chromium renders for ``url`` with a fresh profile (no login)."""
    result = subprocess.run(
        [
            CHROMIUM,
            *FLAGS,
            f"--user-data-dir={profile}",
            f"--virtual-time-budget={budget_ms}",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


class Chromium:
    """One headless browser with one page, driven over the DevTools protocol."""

    def __init__(self, tmp: Path, width: int = 1400, height: int = 1000) -> None:
        from websockets.sync.client import connect

        profile = tmp / f"chromium-{time.monotonic_ns()}"
        self.width = width
        self.process = subprocess.Popen(
            [
                CHROMIUM,
                *FLAGS,
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
                stop(self.process)
                raise RuntimeError("Chromium did not open its DevTools port")
            time.sleep(0.1)
        port = int(active.read_text().split()[0])
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"http://127.0.0.1:{port}/json/list", timeout=10) as response:
            pages = [t for t in json.load(response) if t["type"] == "page"]
        self._stack = contextlib.ExitStack()
        self.ws = self._stack.enter_context(
            connect(pages[0]["webSocketDebuggerUrl"], max_size=64 << 20, open_timeout=10)
        )
        self._next = 0
        self.call("Page.enable")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """``method``'s result; the page's events that come first are passed over, for a minute at most."""
        self._next += 1
        ident = self._next
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        deadline = time.monotonic() + CALL_SECONDS
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"Chromium did not answer {method} within {CALL_SECONDS} s")
            message = json.loads(self.ws.recv(timeout=left))
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:200]}: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    def wait_for(self, condition: str, timeout: float = 60, what: str = "") -> Any:
        """Until the JavaScript ``condition`` is truthy; its value."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.evaluate(
                    f"(() => {{ try {{ const v = {condition}; return v && v.nodeType ? true : v; }} "
                    "catch (e) { return null; } })()"
                )
            except RuntimeError as exc:  # the page navigated while it was asked: ask the next one
                if "navigated" not in str(exc) and "context" not in str(exc).lower():
                    raise
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                url = self.evaluate("location.href")
                raise TimeoutError(f"{what or condition} not true within {timeout} s at {url}")
            time.sleep(0.25)

    def open(self, url: str, ready: str = "document.readyState === 'complete'", timeout: float = 60) -> None:
        self.call("Page.navigate", url=url)
        self.wait_for(ready, timeout, f"{url} ready ({ready})")

    def set_cookie(self, name: str, value: str, url: str) -> None:
        self.call("Network.setCookie", name=name, value=value, url=url, httpOnly=True)

    def click(self, selector_js: str) -> None:
        """A real mouse click at the middle of the element the JavaScript expression finds."""
        box = self.wait_for(
            f"(() => {{ const e = {selector_js}; if (!e) return null; e.scrollIntoView({{block: 'center'}}); "
            "const r = e.getBoundingClientRect(); return r.width && r.height ? "
            "{x: r.left + r.width / 2, y: r.top + r.height / 2} : null; })()",
            what=f"clickable {selector_js}",
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.call(
                "Input.dispatchMouseEvent", type=kind, x=box["x"], y=box["y"], button="left", clickCount=1
            )

    def type_text(self, text: str) -> None:
        """Type ``text`` into the focused element, one key at a time."""
        for char in text:
            code = f"Digit{char}" if char.isdigit() else f"Key{char.upper()}" if char.isalpha() else ""
            key_code = ord(char.upper()) if char.isalnum() else 0
            common = {
                "key": char,
                "code": code,
                "windowsVirtualKeyCode": key_code,
                "nativeVirtualKeyCode": key_code,
            }
            self.call("Input.dispatchKeyEvent", type="keyDown", **common)
            self.call("Input.dispatchKeyEvent", type="char", text=char, unmodifiedText=char, **common)
            self.call("Input.dispatchKeyEvent", type="keyUp", **common)

    def screenshot(self, path: Path, height: int | None = None) -> None:
        params: dict[str, Any] = {"format": "png"}
        if height:
            params.update(
                captureBeyondViewport=True,
                clip={"x": 0, "y": 0, "width": self.width, "height": height, "scale": 1},
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", **params)["data"]))

    def close(self) -> None:
        try:
            self._stack.close()
        finally:
            stop(self.process)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

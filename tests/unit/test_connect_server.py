"""The local Spark Connect server's start story, without starting one (tests/integration does)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdc_devtools import connect_server
from cdc_devtools.connect_server import (
    LocalSparkConnectServer,
    configured_url,
    connect_server_for,
    connection_url,
    ensure_connect_server,
)
from iceberg_cdc.config import parse_config

RAW = {
    "catalog": {"name": "t", "type": "sql", "uri": "sqlite:////tmp/never-opened.db"},
    "shuffle": {"uri": "s3://shuffle/cdc"},
    "tables": [{"source": "shop.orders", "sink": "shop.orders_changes"}],
}


def config(**spark):
    return parse_config({**RAW, "spark": spark})


@pytest.mark.parametrize(
    ("value", "url"),
    [
        ('{"conn_type": "spark_connect", "host": "sc://10.0.0.5", "port": 15010}', "sc://10.0.0.5:15010"),
        ('{"conn_type": "spark_connect", "host": "spark-connect"}', "sc://spark-connect:15002"),
        ('{"conn_type": "spark_connect", "host": "sc://h:15003"}', "sc://h:15003"),
        ("spark-connect://h:15004", "sc://h:15004"),
        ('{"conn_type": "spark_connect"}', None),
    ],
)
def test_connection_urls(value, url):
    assert connection_url(value) == url


def test_the_config_url_wins_over_the_connection():
    env = {"AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": '{"host": "sc://from-env", "port": 1}'}
    assert configured_url(config(mode="connect"), env) == "sc://from-env:1"
    assert configured_url(config(mode="connect", connect_url="sc://own:2"), env) == "sc://own:2"
    assert configured_url(config(mode="connect", connect_conn_id="other"), env) is None


def test_submit_mode_starts_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(connect_server, "ensure_connect_server", pytest.fail)
    env: dict[str, str] = {}
    with connect_server_for(config(), env, tmp_path) as url:
        assert url is None
    assert env == {}


def test_a_reachable_server_is_used_and_named_in_the_connection(tmp_path, monkeypatch):
    monkeypatch.setattr(connect_server, "reachable", lambda url: url == "sc://127.0.0.1:15002")
    env = {"AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": '{"host": "sc://127.0.0.1", "port": 15002}'}
    with connect_server_for(config(mode="connect"), env, tmp_path) as url:
        assert url == "sc://127.0.0.1:15002"
    assert json.loads(env["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"]) == {
        "conn_type": "spark_connect",
        "host": "sc://127.0.0.1",
        "port": 15002,
    }


def test_a_missing_local_server_is_started_and_stopped(tmp_path, monkeypatch):
    events = []

    class Fake(LocalSparkConnectServer):
        def start(self, timeout: float = 120.0):
            events.append(("start", self.port))
            return self

        def stop(self):
            events.append(("stop", self.port))

    monkeypatch.setattr(connect_server, "reachable", lambda url: False)
    monkeypatch.setattr(connect_server, "LocalSparkConnectServer", Fake)
    env: dict[str, str] = {}
    with connect_server_for(config(mode="connect", connect_url="sc://127.0.0.1:15999"), env, tmp_path) as url:
        assert url == "sc://127.0.0.1:15999" and events == [("start", 15999)]
    assert events == [("start", 15999), ("stop", 15999)]
    assert env == {}, "connect_url names the server: no connection needed"


def test_a_remote_server_that_does_not_answer_is_not_replaced(tmp_path, monkeypatch):
    monkeypatch.setattr(connect_server, "reachable", lambda url: False)
    with pytest.raises(RuntimeError, match=r"no Spark Connect server answers on sc://spark\.internal:15002"):
        ensure_connect_server("sc://spark.internal:15002", tmp_path)


def test_the_server_binds_loopback_and_runs_this_interpreter():
    server = LocalSparkConnectServer(Path("/tmp/never"), port=15123, conf={"spark.x": "1"})
    command = server.command()
    assert command[command.index("--class") + 1] == connect_server.SERVER_CLASS
    assert command[command.index("--master") + 1] == "local[2]"
    confs = dict(command[i + 1].split("=", 1) for i, word in enumerate(command) if word == "--conf")
    assert confs["spark.connect.grpc.binding.address"] == "127.0.0.1"
    assert confs["spark.connect.grpc.binding.port"] == "15123"
    assert confs["spark.ui.enabled"] == "false" and confs["spark.x"] == "1"
    assert server.url == "sc://127.0.0.1:15123"


def _confs(server: LocalSparkConnectServer) -> dict[str, str]:
    command = server.command()
    return dict(command[i + 1].split("=", 1) for i, word in enumerate(command) if word == "--conf")


def test_the_servers_jvm_runs_the_jits_first_tier_only_unless_told_otherwise():
    """It only coordinates (the rows are in Python workers); a server that computes in the JVM opts out."""
    coordinator = _confs(LocalSparkConnectServer(Path("/tmp/never"), port=15123))
    assert coordinator["spark.driver.extraJavaOptions"] == "-XX:TieredStopAtLevel=1"
    assert "spark.driver.extraJavaOptions" not in _confs(
        LocalSparkConnectServer(Path("/tmp/never"), port=15123, java_options="")
    )
    told = LocalSparkConnectServer(
        Path("/tmp/never"), port=15123, conf={"spark.driver.extraJavaOptions": "-Xss4m"}
    )
    assert _confs(told)["spark.driver.extraJavaOptions"] == "-Xss4m"


class SleepingServer(LocalSparkConnectServer):
    """Stands for the JVM: a process that never answers, with a child in its group (a Python worker)."""

    def command(self) -> list[str]:
        import sys

        child = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])"
        return [sys.executable, "-c", f"{child}; time.sleep(120)"]


@pytest.fixture
def started(monkeypatch):
    """The processes start() launches; their groups are killed after the test whatever happened."""
    import contextlib
    import os
    import signal
    import subprocess

    launched: list[subprocess.Popen] = []
    real_popen = subprocess.Popen

    def popen(*args, **kwargs):
        launched.append(real_popen(*args, **kwargs))
        return launched[-1]

    monkeypatch.setattr(connect_server.subprocess, "Popen", popen)
    yield launched
    for process in launched:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def _gone(pgid: int) -> bool:
    """No live process is left in the group (zombies waiting for a reaper are dead)."""
    import os
    import time

    deadline = time.monotonic() + 5
    while True:
        alive = []
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                alive.append(entry)
        if not alive or time.monotonic() > deadline:
            return not alive
        time.sleep(0.1)


def test_ctrl_c_while_the_server_starts_stops_it(tmp_path, monkeypatch, started):
    """Ctrl-C during the wait for the server stops it (and its group) before the interrupt goes on."""
    calls = []

    def interrupted(url, timeout=1.0):
        calls.append(url)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return False

    monkeypatch.setattr(connect_server, "port_open", interrupted)
    server = SleepingServer(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        server.start(timeout=60)
    [process] = started
    assert len(calls) == 3 and server.process is None
    assert process.poll() is not None and _gone(process.pid)  # the server and its child


def test_sigterm_while_the_server_starts_stops_it(tmp_path, monkeypatch, started):
    import os
    import signal
    import threading

    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        pytest.skip("SIGTERM has a handler in this process; start() leaves it to that handler")
    monkeypatch.setattr(connect_server, "port_open", lambda url, timeout=1.0: False)
    threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
    with pytest.raises(KeyboardInterrupt):
        SleepingServer(tmp_path).start(timeout=60)
    [process] = started
    assert process.poll() is not None and _gone(process.pid)  # the server and its child
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back

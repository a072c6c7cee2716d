"""make airflow's plumbing: log server ports that follow PORT, the pid file make airflow-stop reads, Ctrl-C."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cdc_devtools.pidfile import AlreadyRunning, pid_file, stop_running
from cdc_devtools.scheduler import HOST, LOW_LATENCY, log_server_ports, machine_env, port_free

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _airflow_ui():
    """``scripts/airflow_ui.py`` (``make airflow``) as a module."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        import airflow_ui
    finally:
        sys.path.remove(str(SCRIPTS))
    return airflow_ui


def _free_base() -> int:
    """A port whose log-server ports (+713, +714, +715) are free now, below the ephemeral range.

    An ephemeral base put those ports where the kernel hands out the local ports of outgoing
    connections: the other test worker's HTTP clients took one between the check and the test.
    Below the range only a listener bound on purpose can take one (``make airflow``'s 8080 ->
    8793, 8794 are there too).
    """
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(50):
        base = random.randrange(10_000, ephemeral_low - 716)
        if port_free(base) and log_server_ports(base) == (base + 713, base + 714) and port_free(base + 715):
            return base
    pytest.skip("no free port range for the test")


def test_log_server_ports_follow_the_api_port_and_skip_taken_ones():
    base = _free_base()
    env = machine_env({}, base)
    assert env["AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"] == str(base + 713)
    assert env["AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT"] == str(base + 714)
    with socket.socket() as taken:
        taken.bind((HOST, base + 713))
        assert log_server_ports(base) == (base + 714, base + 715)
    # set ones are kept (a deployment's own choice)
    given = {
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": "9001",
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": "9002",
    }
    assert machine_env(dict(given), base)["AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"] == "9001"


def _sleeper(marker: str) -> subprocess.Popen:
    """A process named like the command (``marker`` in its arguments) that exits 0 on SIGTERM."""
    code = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); "
        "print('up', flush=True); time.sleep(60)"
    )
    process = subprocess.Popen([sys.executable, "-c", code, marker], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline() == "up\n"
    return process


def test_make_airflow_stop_signals_the_process_its_pid_file_names(tmp_path):
    path = tmp_path / "airflow-ui.pid"
    process = _sleeper("airflow_ui.py")
    try:
        path.write_text(f"{process.pid}\n")
        stopped, message = stop_running(path, "airflow_ui.py", timeout=20)
        assert stopped, message
        assert process.wait(timeout=10) == 0 and not path.exists()  # it took its SIGTERM path
    finally:
        process.kill()
        process.wait()


def test_a_stale_or_foreign_pid_is_never_signalled(tmp_path):
    path = tmp_path / "airflow-ui.pid"
    assert stop_running(path, "airflow_ui.py") == (
        False,
        f"nothing to stop: no pid file {path} (is it running?)",
    )
    other = _sleeper("something-else")  # the pid now belongs to another program
    try:
        path.write_text(f"{other.pid}\n")
        stopped, message = stop_running(path, "airflow_ui.py", timeout=5)
        assert not stopped and "is gone" in message and not path.exists()
        assert other.poll() is None  # untouched
    finally:
        other.kill()
        other.wait()


def test_the_pid_file_lives_as_long_as_the_block(tmp_path):
    path = tmp_path / "sub" / "airflow-ui.pid"
    with pid_file(path):
        assert path.read_text().strip().isdigit()
    assert not path.exists()


def test_ctrl_c_while_make_airflow_starts_is_one_line_and_leaves_no_pid_file(tmp_path, monkeypatch, capsys):
    airflow_ui = _airflow_ui()

    def interrupted(port: int, config_path: Path | None = None) -> int:
        assert airflow_ui.PID_FILE.exists()
        raise KeyboardInterrupt

    monkeypatch.setattr(airflow_ui, "PID_FILE", tmp_path / "airflow-ui.pid")
    monkeypatch.setattr(airflow_ui, "_start", interrupted)
    monkeypatch.setattr(sys, "argv", ["airflow_ui.py", "--port", str(_free_base())])
    sigint, sigterm = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        assert airflow_ui.main() == 130
    finally:
        signal.signal(signal.SIGINT, sigint)
        signal.signal(signal.SIGTERM, sigterm)
    err = capsys.readouterr().err
    assert err.strip() == "make airflow: interrupted while starting; stopped what it had started"
    assert not (tmp_path / "airflow-ui.pid").exists()


def test_a_second_make_airflow_is_refused_while_the_first_runs(tmp_path):
    path = tmp_path / "airflow-ui.pid"
    first = _sleeper("airflow_ui.py")
    try:
        path.write_text(f"{first.pid}\n")
        with (
            pytest.raises(AlreadyRunning, match=rf"process {first.pid} .*make airflow-stop"),
            pid_file(path, "airflow_ui.py"),
        ):
            pass
        assert path.read_text() == f"{first.pid}\n"  # the first one's file is left alone
    finally:
        first.kill()
        first.wait()
    # Once it is gone its file is stale, and the next one takes it over.
    with pid_file(path, "airflow_ui.py"):
        assert path.read_text() == f"{os.getpid()}\n"
    assert not path.exists()


def test_small_snapshot_settings_where_asked_and_never_over_a_given_value():
    assert not set(LOW_LATENCY) & set(machine_env({}, 8080))
    chosen = machine_env({}, 8080, low_latency=True)
    assert {name: chosen[name] for name in LOW_LATENCY} == LOW_LATENCY
    kept = machine_env({"AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "2"}, 8080, low_latency=True)
    assert kept["AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME"] == "2"


def test_make_airflow_runs_with_the_small_snapshot_settings(tmp_path):
    airflow_ui = _airflow_ui()
    env = airflow_ui.ui_env(tmp_path, tmp_path / "cdc.yaml", 8080, tmp_path / "passwords.json")
    assert {name: env[name] for name in LOW_LATENCY} == LOW_LATENCY


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "team.yaml"
    raw = {
        "catalog": {"name": "team", "type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db"},
        "shuffle": {"uri": f"file://{tmp_path}/shuffle"},
        "tables": [{"source": "sales.invoices", "sink": "sales.invoices_changes"}],
    }
    path.write_text(json.dumps(raw))  # JSON is YAML
    return path


def test_make_airflow_config_serves_that_config_and_sets_up_no_demo(tmp_path, monkeypatch):
    airflow_ui = _airflow_ui()
    config = _config(tmp_path)
    served = {}

    def no_demo(servers, work):
        raise AssertionError("the demo's servers and table were set up for CONFIG=")

    def run_airflow(env, port, config):
        served.update(cdc_config=env["CDC_CONFIG"], dags=[t.dag_id for t in config.tables], port=port)
        return 0

    monkeypatch.setattr(airflow_ui, "WORK", tmp_path / "work")
    monkeypatch.setattr(airflow_ui, "PASSWORDS_FILE", tmp_path / "passwords.json")
    monkeypatch.setattr(airflow_ui, "start_servers", no_demo)
    monkeypatch.setattr(airflow_ui, "ensure_airflow_db", lambda env: None)
    monkeypatch.setattr(airflow_ui, "run_airflow", run_airflow)
    port = _free_base()
    assert airflow_ui._start(port, config) == 0
    assert served == {"cdc_config": str(config.resolve()), "dags": ["cdc__sales__invoices"], "port": port}


def test_make_airflow_with_a_bad_config_says_so_and_starts_nothing(tmp_path, monkeypatch, capsys):
    airflow_ui = _airflow_ui()
    missing = tmp_path / "missing.yaml"
    monkeypatch.setattr(airflow_ui, "_start", lambda *args: pytest.fail("started with a bad config"))
    monkeypatch.setattr(sys, "argv", ["airflow_ui.py", "--config", str(missing)])
    sigint, sigterm = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        assert airflow_ui.main() == 2
    finally:
        signal.signal(signal.SIGINT, sigint)
        signal.signal(signal.SIGTERM, sigterm)
    assert f"make airflow CONFIG={missing}: config file {missing} does not exist" in capsys.readouterr().err


# An Airflow component stand-in: a worker of its own that only SIGKILL stops (as a component's workers
# can outlive its SIGTERM), and a SIGTERM handler that takes 2 s to exit, as a component's shutdown does.
_COMPONENT = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, lambda *a: (time.sleep(2), sys.exit(0)))
subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(120)", sys.argv[1]],
    preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN),
)
time.sleep(120)
"""

# make airflow's main() on stand-in components; with a child number, it sends itself SIGTERM right after
# that child's Popen returned, before run_airflow has kept the process (the race seen in production).
_DRIVER = """
import os, signal, subprocess, sys
from pathlib import Path
scripts, work, port, at, component = sys.argv[1:6]
marker = os.environ["CDC_STOP_TEST_MARKER"]  # not in this process's own command line
sys.path.insert(0, scripts)
import airflow_ui

names = ("api-server", "scheduler", "dag-processor", "triggerer", "log-server")
airflow_ui.components = lambda env, port: {n: [sys.executable, "-c", component, marker] for n in names}
airflow_ui.healthy = lambda url: False
airflow_ui.PID_FILE = Path(work) / "airflow-ui.pid"
env = {"AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(Path(work) / "passwords.json")}
airflow_ui._start = lambda port, config_path=None: airflow_ui.run_airflow(env, port)
real_popen, started = subprocess.Popen, []

def popen(*args, **kwargs):
    process = real_popen(*args, **kwargs)
    started.append(process)
    if len(started) == int(at):
        os.kill(os.getpid(), signal.SIGTERM)  # handled here, before the caller holds `process`
    return process

subprocess.Popen = popen
sys.argv = ["airflow_ui.py", "--port", port]
print("ready", flush=True)
sys.exit(airflow_ui.main())
"""


def _with_marker(marker: str) -> list[int]:
    from cdc_devtools.process_tree import alive

    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                command = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if marker in command and alive(int(entry.name)):
                found.append(int(entry.name))
    return found


@pytest.mark.parametrize("at", [1, 3, 5, 0], ids=["1st-child", "3rd-child", "5th-child", "after-start"])
def test_sigterm_while_make_airflow_starts_its_children_stops_every_one(tmp_path, at):
    """SIGTERM while the children start, then a second one during the stop (make forwards its own)."""
    marker = f"cdc-stop-test-{os.getpid()}-{random.randrange(1 << 30)}"
    driver = subprocess.Popen(
        [sys.executable, "-c", _DRIVER, str(SCRIPTS), str(tmp_path), str(_free_base()), str(at), _COMPONENT],
        env={**os.environ, "CDC_STOP_TEST_MARKER": marker},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert driver.stdout is not None and driver.stdout.readline() == "ready\n"
        if at == 0:  # every child started: the first signal from outside
            deadline = time.monotonic() + 20
            while len(_with_marker(marker)) < 10 and time.monotonic() < deadline:
                time.sleep(0.05)
            driver.send_signal(signal.SIGTERM)
        time.sleep(1.0)  # the stop now waits for the components' 2 s shutdown
        with contextlib.suppress(ProcessLookupError):
            driver.send_signal(signal.SIGTERM)
        out, err = driver.communicate(timeout=90)
        # 0, or killed by the second SIGTERM when it came after the stop had finished, while Python exited
        # (its handlers are gone then): either way the stop ran whole, which the rest checks.
        assert driver.returncode in (0, -signal.SIGTERM), (out, err)
        assert "stopping Airflow" in out and "interrupted while starting" not in err, (out, err)
        deadline = time.monotonic() + 3
        while _with_marker(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _with_marker(marker) == [], f"left running after the stop:\n{out}\n{err}"
    finally:
        driver.kill()
        driver.wait()
        for pid in _with_marker(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

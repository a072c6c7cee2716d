"""The scheduler imports the tasks' modules before its LocalExecutor forks (listeners/task_preload.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from iceberg_cdc.airflow.listeners import task_preload

SCHEDULER = ["/venv/bin/airflow", "scheduler"]


@pytest.mark.parametrize(
    ("argv", "executors", "env", "expected"),
    [
        (SCHEDULER, "LocalExecutor", {}, True),
        (SCHEDULER, "LocalExecutor,CeleryExecutor", {}, True),
        (SCHEDULER, "CeleryExecutor", {}, False),  # its tasks run on other machines: nothing to share
        (["/venv/bin/airflow", "dag-processor"], "LocalExecutor", {}, False),
        (["/venv/bin/airflow", "triggerer"], "LocalExecutor", {}, False),
        (["/venv/bin/airflow", "dags", "test", "x"], "LocalExecutor", {}, False),
        (SCHEDULER, "LocalExecutor", {"CDC_TASK_PRELOAD": "false"}, False),
        (SCHEDULER, "LocalExecutor", {"CDC_TASK_PRELOAD": "0"}, False),
        (SCHEDULER, "LocalExecutor", {"CDC_TASK_PRELOAD": "true"}, True),
    ],
)
def test_only_a_forking_local_scheduler_preloads(argv, executors, env, expected):
    assert task_preload.enabled(argv, executors, env) is expected


def test_a_failed_import_is_logged_not_raised(caplog):
    failed = task_preload.preload(("json", "iceberg_cdc.no_such_module"))
    assert failed == ["iceberg_cdc.no_such_module"]
    assert "iceberg_cdc.no_such_module not imported" in caplog.text


CHILD = """
import json, os, sys
sys.argv = ["/venv/bin/airflow", "scheduler"]
os.environ["AIRFLOW__CORE__EXECUTOR"] = "LocalExecutor"
from iceberg_cdc.airflow.listeners import task_preload
task_preload.on_starting(component=None)
loaded = [m for m in task_preload.TASK_MODULES if m in sys.modules]
read, write = os.pipe()
pid = os.fork()
if pid == 0:  # a task process: it has the modules, and its own on_starting imports nothing again
    task_preload.on_starting(component=None)
    os.write(write, json.dumps([m for m in task_preload.TASK_MODULES if m in sys.modules]).encode())
    os._exit(0)
os.close(write)
forked = json.loads(os.read(read, 1 << 16))
os.waitpid(pid, 0)
print(json.dumps({"loaded": loaded, "forked": forked}))
"""


def test_the_scheduler_imports_every_task_module_and_its_forks_have_them():
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["loaded"] == list(task_preload.TASK_MODULES)
    assert found["forked"] == list(task_preload.TASK_MODULES)
    # Once, in the scheduler: the task process's own on_starting logs nothing.
    assert (done.stdout + done.stderr).count("task preload:") == 1


def test_the_plugin_registers_the_listener():
    from iceberg_cdc.airflow.plugin import CdcUiPlugin

    assert task_preload in CdcUiPlugin.listeners

"""on_kill of the Spark Connect phase task: the group's job on the server is interrupted, by its own tag.

No server: a fake session stands in for pyspark's, and its job blocks until
it is interrupted, as a long Spark job would. The operator runs in a thread,
as ``execute`` runs in the task process while the SIGTERM handler calls
``on_kill``.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from iceberg_cdc.airflow.hooks.cdc import CdcHook
from iceberg_cdc.airflow.operators import spark as spark_operators
from iceberg_cdc.airflow.operators.spark import SparkConnectPhaseOperator
from iceberg_cdc.pipeline import connect_app, pyfiles

ARGS = ["--phase", "read", "--plan", "t/plan.json", "--group", "0", "--label", "read 1/1"]


class InterruptedJob(Exception):
    pass


class FakeSession:
    """The parts of a Spark Connect session the runner uses; its job runs until interrupted."""

    is_stopped = False

    def __init__(self) -> None:
        self.tags: list[str] = []
        self.submitted_tags: list[list[str]] = []
        self.interrupted: list[str] = []
        self.interrupted_all = False
        self.started = threading.Event()
        self.stop = threading.Event()

    def range(self, *args: Any) -> FakeSession:
        return self

    def mapInArrow(self, function: Any, schema: str) -> FakeSession:
        return self

    def addTag(self, tag: str) -> None:
        self.tags.append(tag)

    def removeTag(self, tag: str) -> None:
        self.tags.remove(tag)

    def toArrow(self) -> Any:
        self.submitted_tags.append(list(self.tags))
        self.started.set()
        if not self.stop.wait(timeout=30):
            raise AssertionError("the job was never interrupted")
        raise InterruptedJob("[OPERATION_CANCELED] Operation has been cancelled.")

    def interruptTag(self, tag: str) -> list[str]:
        self.interrupted.append(tag)
        if any(tag in tags for tags in self.submitted_tags):
            self.stop.set()
            return ["operation-1"]
        return []

    def interruptAll(self) -> list[str]:  # would stop every task's job in the shared session
        self.interrupted_all = True
        self.stop.set()
        return []


@pytest.fixture
def fake_server(monkeypatch) -> FakeSession:
    spark = FakeSession()
    monkeypatch.setattr(connect_app, "session", lambda url, artifact=None, digest=None: spark)
    monkeypatch.setattr(pyfiles, "package_zip", lambda: "/tmp/package.zip")
    monkeypatch.setattr(pyfiles, "package_digest", lambda: "digest")

    def phase_group(runtime, plan_key, phase, group, start_runner, label=""):
        # The driver proves the lease, then starts the runner and maps the group's units.
        return start_runner(SimpleNamespace()).map_units(phase, None, runtime, ["unit-0", "unit-1"])

    monkeypatch.setattr(connect_app, "run_phase_group", phase_group)
    monkeypatch.setattr(CdcHook, "spark_connect_url", lambda self, conn_id=None: "sc://127.0.0.1:15002")
    monkeypatch.setattr(CdcHook, "runtime", lambda self: None)
    # A group of a real plan: never small enough for the task's own process (no config, no plan here).
    monkeypatch.setattr(spark_operators, "ran_in_process", lambda application_args: False)
    return spark


def test_on_kill_interrupts_the_running_job_by_its_tag(fake_server):
    task = SparkConnectPhaseOperator(task_id="shuffle_read", application_args=ARGS)
    outcome: dict[str, BaseException] = {}

    def execute() -> None:
        try:
            task.execute({})
        except BaseException as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=execute)
    worker.start()
    assert fake_server.started.wait(timeout=10), "the job did not start"
    task.on_kill()
    worker.join(timeout=10)
    assert not worker.is_alive(), "execute did not end after on_kill"
    [submitted] = fake_server.submitted_tags
    assert fake_server.interrupted == submitted  # exactly the job's own tag
    assert not fake_server.interrupted_all  # the shared session's other jobs keep running
    assert "error" in outcome  # the task fails: its job was stopped


def test_on_kill_before_any_job_and_with_a_lost_server_never_raises(fake_server):
    task = SparkConnectPhaseOperator(task_id="shuffle_read", application_args=ARGS)
    task.on_kill()  # killed before the session opened: nothing to interrupt
    assert fake_server.interrupted == []

    def unreachable(tag: str) -> list[str]:
        raise ConnectionError("server gone")

    fake_server.interruptTag = unreachable
    task._runners.append(connect_app.ConnectUnitRunner(fake_server, "sc://127.0.0.1:15002", 0))
    task.on_kill()  # logged, not raised: a kill must not fail over a lost connection

"""The Spark Connect driver's pieces that need no server: the worker-side function and error round trip."""

from __future__ import annotations

import json
import sys
import types
import uuid

import pyarrow as pa
import pytest

from iceberg_cdc.errors import AmbiguousUpdateError, ConnectJobError, CorruptShuffleError, UnitFailed
from iceberg_cdc.pipeline import connect_app, worker_heap
from iceberg_cdc.pipeline.connect_app import describe, job_error


def server_report(worker_error: BaseException) -> Exception:
    """What pyspark raises in the client for a Python worker error: the worker's traceback as text."""
    return Exception(
        "\n  An exception was thrown from the Python worker. Please see the stack trace below.\n"
        "[PYTHON_EXCEPTION] An exception was thrown from the Python worker: Traceback (most recent call last):\n"
        '  File "connect_app.py", line 97, in run_units\n'
        f"{type(worker_error).__module__}.{type(worker_error).__name__}: {worker_error}\n SQLSTATE: 38000"
    )


def mapped(monkeypatch, function, units):
    monkeypatch.setitem(connect_app.PHASE_FUNCTIONS, "read", function)
    run_units = connect_app._unit_mapper("read", plan=None, runtime=None, units=units)
    assert run_units.__name__ == "cdc_read_units"  # the name the server's SQL plans show
    batch = pa.RecordBatch.from_pydict({"id": pa.array(range(len(units)), pa.int64())})
    return list(run_units(iter([batch])))


def test_units_run_by_number_and_return_json(monkeypatch):
    out = mapped(monkeypatch, lambda plan, runtime, unit: {"unit": unit, "rows": 2}, ["a", "b"])
    table = pa.Table.from_batches(out)
    assert table.column("unit").to_pylist() == [0, 1]
    assert [json.loads(r) for r in table.column("result").to_pylist()] == [
        {"unit": "a", "rows": 2},
        {"unit": "b", "rows": 2},
    ]


def test_a_units_error_comes_back_as_the_pipelines_exception(monkeypatch):
    message = "table shop.orders: cannot pair updates for identifier (id=3):\nsecond line"

    def fails(plan, runtime, unit):
        raise AmbiguousUpdateError(message)

    with pytest.raises(UnitFailed) as raised:
        mapped(monkeypatch, fails, ["a"])
    error = job_error(server_report(raised.value), "read", 0, "sc://h:15002/;token=abc")
    assert type(error) is AmbiguousUpdateError and str(error) == message
    info = connect_app.unit_failure(server_report(raised.value))
    assert info["unit"] == 0 and "in fails" in info["traceback"]


def test_corrupt_shuffle_message_is_not_doubled(monkeypatch):
    def fails(plan, runtime, unit):
        raise CorruptShuffleError("object x: bad checksum")

    with pytest.raises(UnitFailed) as raised:
        mapped(monkeypatch, fails, ["a"])
    error = job_error(server_report(raised.value), "read", 0, "sc://h")
    assert type(error) is CorruptShuffleError and str(error).count("retrying") <= 1
    assert str(error) == str(CorruptShuffleError("object x: bad checksum"))


def test_other_errors_keep_their_type_name_and_message(monkeypatch):
    def fails(plan, runtime, unit):
        raise KeyError("column")

    with pytest.raises(UnitFailed) as raised:
        mapped(monkeypatch, fails, ["a"])
    error = job_error(server_report(raised.value), "read", 0, "sc://h")
    assert isinstance(error, ConnectJobError) and str(error) == "KeyError: 'column'"


def test_a_job_error_without_a_unit_names_the_server_not_its_token():
    report = Exception(
        "[CONNECTION] failed\nTraceback (most recent call last):\nMemoryError: worker died\n SQLSTATE: 1"
    )
    error = job_error(report, "write", 1, "sc://spark.example:15002/;token=s3cr3t;use_ssl=true")
    assert str(error) == (
        "write group 2 failed on the Spark Connect server spark.example:15002: MemoryError: worker died"
    )
    assert describe("sc://spark.example:15002/;token=s3cr3t") == "spark.example:15002"


def test_one_shared_session_per_package_version_and_day():
    first = connect_app.shared_session_id("digest-a", 0, day="2026-01-01")
    assert first == connect_app.shared_session_id("digest-a", 0, day="2026-01-01")
    others = {
        connect_app.shared_session_id("digest-b", 0, day="2026-01-01"),
        connect_app.shared_session_id("digest-a", 1, day="2026-01-01"),
        connect_app.shared_session_id("digest-a", 0, day="2026-01-02"),
    }
    assert first not in others and len(others) == 3
    assert uuid.UUID(first).version == 4  # the format Spark Connect accepts


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("sc://h:15002", "sc://h:15002/;session_id=S"),
        ("sc://h:15002/", "sc://h:15002/;session_id=S"),
        ("sc://h:443/;use_ssl=true;token=t", "sc://h:443/;use_ssl=true;token=t;session_id=S"),
        ("sc://h/;session_id=mine", "sc://h/;session_id=mine"),
    ],
)
def test_session_id_joins_the_urls_parameters(url, expected):
    assert connect_app.with_session_id(url, "S") == expected


def test_worker_heap_is_frozen_once_per_new_imports_and_only_in_a_spark_task(monkeypatch):
    from pyspark import TaskContext

    calls = []
    monkeypatch.setattr(worker_heap.gc, "collect", lambda: calls.append("collect"))
    monkeypatch.setattr(worker_heap.gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(worker_heap, "_frozen_with_modules", 0)
    worker_heap.settle_worker_heap()
    assert calls == []  # not in a Spark task: the test process's GC is left alone
    TaskContext._setTaskContext(TaskContext._getOrCreate())
    try:
        worker_heap.settle_worker_heap()
        worker_heap.settle_worker_heap()  # nothing imported since: no second collection
        assert calls == ["collect", "freeze"]
        monkeypatch.setitem(sys.modules, "cdc_test_new_module", types.ModuleType("cdc_test_new_module"))
        worker_heap.settle_worker_heap()
        assert calls == ["collect", "freeze"] * 2
    finally:
        TaskContext._setTaskContext(None)


def test_worker_memory_is_kept_once_and_only_in_a_spark_task(monkeypatch):
    from pyspark import TaskContext

    calls = []
    monkeypatch.setattr(worker_heap, "libc_function", lambda name: lambda *args: calls.append((name, *args)))
    monkeypatch.setattr(worker_heap, "_kept", False)
    worker_heap.keep_worker_memory()
    assert calls == []  # not in a Spark task: the test process's allocator is left alone
    TaskContext._setTaskContext(TaskContext._getOrCreate())
    try:
        worker_heap.keep_worker_memory()
        worker_heap.keep_worker_memory()  # once per worker
    finally:
        TaskContext._setTaskContext(None)
    # Blocks up to 32 MB from the heap (M_MMAP_THRESHOLD), and the heap never trimmed (M_TRIM_THRESHOLD).
    assert calls == [("mallopt", -3, 32 << 20), ("mallopt", -1, 2**31 - 1)]


def test_spark_submit_workers_get_the_memory_keeping_environment():
    from iceberg_cdc.pipeline.submit_conf import submit_conf

    assert submit_conf()["spark.executorEnv.MIMALLOC_PURGE_DELAY"] == "-1"
    # spark.conf in the config file still has the last word.
    assert (
        submit_conf({"spark.executorEnv.MIMALLOC_PURGE_DELAY": "10"})[
            "spark.executorEnv.MIMALLOC_PURGE_DELAY"
        ]
        == "10"
    )

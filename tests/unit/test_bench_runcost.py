"""Where a one-row run's seconds go (bench/runcost.py): each task's split from Airflow's times and its log.

The split is read from what Airflow and the tasks recorded; these cases pin
its arithmetic on made-up records, so a wrong column is caught without a run.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
_spec = importlib.util.spec_from_file_location("bench_runcost", BENCH / "runcost.py")
assert _spec is not None and _spec.loader is not None
runcost = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(runcost)


def _task(name: str, queued: float, start: float, end: float) -> dict:
    return {"task": name, "task_id": name, "map_index": -1, "queued": queued, "start": start, "end": end}


def test_a_spark_task_splits_into_startup_spark_overhead_and_its_units_work():
    task = _task("shuffle_write[0]", queued=10.0, start=10.5, end=13.0)
    lines = [
        (10.5, "::group::Pre Execute"),
        (10.9, "::endgroup::"),  # start-up: 0.4 s
        (11.2, "Spark Connect session on sc://127.0.0.1:15002"),  # session: 0.3 s
        (11.3, 'write done: {"seconds": 0.5, "unit": 0}'),
        (11.4, 'write done: {"seconds": 0.25, "unit": 1}'),
        (12.2, "write group 0: 2 units in 1.0 s"),  # job overhead: 1.0 - 0.75
        (12.9, "::group::Post Execute"),
    ]
    split = runcost.split(task, lines, previous_end=9.0)
    assert split["sched"] == pytest.approx(1.0)
    assert split["queue"] == pytest.approx(0.5)
    assert split["startup"] == pytest.approx(0.4)
    assert split["spark"] == pytest.approx(0.3 + 0.25)
    assert split["work"] == pytest.approx(0.75)
    assert split["rest"] == pytest.approx(2.5 - 0.4 - 0.55 - 0.75)


def test_any_other_task_works_from_its_start_up_to_post_execute():
    task = _task("commit", queued=20.0, start=20.1, end=21.5)
    lines = [(20.1, "::group::Pre Execute"), (20.4, "::endgroup::"), (21.2, "::group::Post Execute")]
    split = runcost.split(task, lines, previous_end=19.5)
    assert (split["sched"], split["queue"], split["startup"], split["spark"]) == pytest.approx(
        (0.5, 0.1, 0.3, 0.0)
    )
    assert split["work"] == pytest.approx(0.8)
    assert split["rest"] == pytest.approx(0.3)


def test_a_task_without_a_log_is_all_start_up():
    split = runcost.split(_task("trigger_next_run", 5.0, 5.0, 5.0), [], previous_end=4.0)
    assert (split["startup"], split["spark"], split["work"], split["rest"]) == (0.0, 0.0, 0.0, 0.0)


def test_each_task_waits_from_the_last_task_that_ended_before_it_was_queued():
    run = {"queued": 0.5, "start": 1.0, "end": 9.0}
    tasks = [
        _task("detect", 1.2, 1.3, 2.0),
        _task("write_jobs", 2.4, 2.5, 3.0),
        _task("barrier", 3.7, 3.8, 4.0),
    ]
    found = runcost.breakdown(run, tasks, {})
    assert [row["sched"] for row in found["tasks"]] == pytest.approx([0.2, 0.4, 0.7])
    assert found["sums"]["sched"] == pytest.approx(1.3)
    assert found["run_queued_to_start"] == pytest.approx(0.5)
    assert found["last_task_to_run_end"] == pytest.approx(5.0)

"""Barrier: one listing per poke, fail fast on failure markers, skip when there is no shuffle."""

from __future__ import annotations

import json

import pytest
import yaml

from iceberg_cdc.airflow.compat import AirflowFailException, AirflowSkipException
from iceberg_cdc.airflow.sensors.barrier import MapOutputBarrierSensor
from iceberg_cdc.config import parse_config
from iceberg_cdc.pipeline.paths import SnapshotPaths, attempt_name
from iceberg_cdc.run.lease import take
from iceberg_cdc.run.steps import Context, missing_map_outputs

SNAPSHOT = 42
TASKS = ["aaa", "bbb", "ccc"]


@pytest.fixture
def setup(tmp_path, monkeypatch):
    raw = {
        "catalog": {"name": "t", "type": "sql", "uri": f"sqlite:///{tmp_path}/c.db"},
        "shuffle": {"uri": f"file://{tmp_path}/shuffle"},
        "tables": [{"source": "shop.orders", "sink": "shop.orders_changes"}],
    }
    path = tmp_path / "cdc.yaml"
    path.write_text(yaml.safe_dump(raw))
    monkeypatch.setenv("CDC_CONFIG", str(path))
    ctx = Context.of(parse_config(raw), "shop.orders")
    store = ctx.runtime.store()
    held = take(ctx, "run-1")
    paths = SnapshotPaths("shop.orders", SNAPSHOT, attempt_name(held.epoch))
    detected = {
        "action": "shuffle",
        "source": "shop.orders",
        "sink": "shop.orders_changes",
        "snapshot_id": str(SNAPSHOT),  # detect's XCom form
        "write_task_ids": TASKS,
        "run_id": "run-1",
        "epoch": held.epoch,
        "lease_ttl": 60,
    }
    return ctx, store, paths, detected


def _commit(store, paths, task):
    store.put(paths.map_output(task) + ".index", b"x")
    store.put(paths.written(task), b"{}")


class _TaskInstance:
    def __init__(self, detected):
        self.detected = detected

    def xcom_pull(self, task_ids):
        assert task_ids == "detect"
        return self.detected


def test_missing_outputs_are_those_without_a_row_record(setup):
    ctx, store, paths, detected = setup
    store.put(paths.map_output("aaa") + ".data", b"x")
    _commit(store, paths, "aaa")
    store.put(paths.map_output("bbb") + ".data", b"x")  # data without index: not committed
    store.put(paths.map_output("ccc") + ".index", b"x")  # index without row record: not yet
    missing, failed = missing_map_outputs(ctx, detected)
    assert missing == ["bbb", "ccc"] and failed == {}


def test_outputs_of_another_epoch_do_not_count(setup):
    ctx, store, _, detected = setup
    other = SnapshotPaths("shop.orders", SNAPSHOT, attempt_name(int(detected["epoch"]) + 1))
    for task in TASKS:
        _commit(store, other, task)
    assert missing_map_outputs(ctx, detected)[0] == TASKS


def test_sensor_fails_when_the_run_lost_its_lease(setup):
    ctx, _, _, detected = setup
    ctx.lease().release("run-1")
    take(ctx, "run-2")
    sensor = MapOutputBarrierSensor(task_id="barrier", source="shop.orders")
    with pytest.raises(AirflowFailException, match="has lost the lease"):
        sensor.poke({"ti": _TaskInstance(detected)})


def test_sensor_pokes_until_every_index_exists(setup):
    _, store, paths, detected = setup
    sensor = MapOutputBarrierSensor(task_id="barrier", source="shop.orders")
    context = {"ti": _TaskInstance(detected)}
    assert sensor.poke(context) is False
    for task in TASKS:
        _commit(store, paths, task)
    assert sensor.poke(context) is True


def test_sensor_fails_fast_on_a_failure_marker(setup):
    _, store, paths, detected = setup
    store.put(paths.failed("bbb"), json.dumps({"task_id": "bbb", "error": "OSError: disk full"}).encode())
    sensor = MapOutputBarrierSensor(task_id="barrier", source="shop.orders")
    with pytest.raises(AirflowFailException, match=r"bbb: OSError: disk full.*redoes the snapshot"):
        sensor.poke({"ti": _TaskInstance(detected)})


def test_sensor_skips_without_a_shuffle(setup):
    sensor = MapOutputBarrierSensor(task_id="barrier", source="shop.orders")
    with pytest.raises(AirflowSkipException):
        sensor.poke({"ti": _TaskInstance({**setup[3], "action": "insert"})})

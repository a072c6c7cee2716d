"""A real DAG run's note and metrics: ``airflow dags test`` with StatsD on, a UDP listener, the run's note.

One table history on the local S3 server: the first append is processed in
process (the pipeline's own steps, no Spark), then a copy-on-write MERGE with
deletes and partition moves goes through ``airflow dags test`` (the write and
read phases on the test worker's warm Spark Connect server) with ``[metrics] statsd_on`` pointing at a UDP
socket of this test, and one more run finds nothing to do. Checked:

* the per-table metrics arrive over StatsD, the table in their names: lag,
  rows by change type, carryover, shuffle bytes, skewed partitions, seconds
  per phase, committed snapshots;
* the plugin's listener set each run's note in Airflow's database: the MERGE
  run's says its snapshot, operation, ordinal and figures (commit's story);
  the idle run's says ``caught up``.

The note of a failed run is checked in ``test_ui_page.py`` (through the REST API).
"""

from __future__ import annotations

import socket
import sqlite3
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from cdc_devtools.cow import cow_merge
from cdc_devtools.inline_run import run_snapshot
from cdc_devtools.orders import BY_REGION, SCHEMA, rows
from cdc_devtools.replay import assert_replay
from iceberg_cdc.config import parse_config
from tests.support.airflow_pipeline import DAG_ID, SOURCE, AirflowPipeline

pytestmark = [pytest.mark.s3, pytest.mark.e2e]

PREFIX = "airflow.cdc.shop__orders."


class StatsdListener:
    """Collects StatsD datagrams (``name:value|type[|@rate][|#tags]``) on a UDP port of 127.0.0.1."""

    def __init__(self) -> None:
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.socket.bind(("127.0.0.1", 0))
        self.socket.settimeout(0.2)
        self.port = self.socket.getsockname()[1]
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.socket.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            self.lines.extend(line for line in data.decode(errors="replace").splitlines() if line)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.socket.close()

    def metrics(self, prefix: str) -> dict[str, list[tuple[float, str]]]:
        """name -> [(value, type)] of every datagram whose name starts with ``prefix``."""
        found: dict[str, list[tuple[float, str]]] = {}
        for line in list(self.lines):
            name, _, rest = line.partition(":")
            if name.startswith(prefix):
                value, _, kind = rest.partition("|")
                found.setdefault(name, []).append((float(value), kind.split("|")[0]))
        return found


def _notes(home: Path) -> dict[str, str | None]:
    """run_id -> note, from Airflow's metadata database."""
    with sqlite3.connect(home / "airflow.db") as db:
        rows_ = db.execute(
            "SELECT r.run_id, n.content FROM dag_run r LEFT JOIN dag_run_note n ON n.dag_run_id = r.id "
            "WHERE r.dag_id = ? ORDER BY r.id",
            (DAG_ID,),
        ).fetchall()
    return dict(rows_)


@pytest.fixture(scope="module")
def statsd():
    listener = StatsdListener()
    yield listener
    listener.close()


def test_a_real_run_sends_its_metrics_and_notes_its_story(moto_server, spark_connect, tmp_path, statsd):
    pipeline = AirflowPipeline(tmp_path, moto_server, SCHEMA, partition_spec=BY_REGION, connect=spark_connect)
    pipeline.source.append(rows(range(0, 60), "us"))
    pipeline.source.append(rows(range(60, 100), "eu"))
    config = parse_config(pipeline.config)
    run_snapshot(config, SOURCE)  # the two appends, in process: no Spark needed for them
    run_snapshot(config, SOURCE)
    updated = rows(range(0, 20), ["eu"] * 5 + ["us"] * 15, status="shipped")  # 5 move us -> eu
    merge = cow_merge(pipeline.source, upserts=updated, delete_keys=range(60, 70))

    env = {
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(statsd.port),
        "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
    }
    assert pipeline.run(env_overrides=env) == 0, pipeline.log_tail()
    assert pipeline.watermark().snapshot_id == merge
    assert assert_replay(pipeline.source, pipeline.sink(), merge, ["id"]) == Counter(
        {"UPDATE_BEFORE": 20, "UPDATE_AFTER": 20, "DELETE": 10}
    )

    deadline = time.monotonic() + 5
    while f"{PREFIX}lag.snapshots" not in statsd.metrics(PREFIX) and time.monotonic() < deadline:
        time.sleep(0.1)
    sent = statsd.metrics(PREFIX)
    assert sent.get(f"{PREFIX}rows.deletes") == [(10, "c")], sorted(sent)
    assert sent.get(f"{PREFIX}rows.updates") == [(20, "c")]
    assert f"{PREFIX}rows.inserts" not in sent  # a zero count is not sent
    assert sent.get(f"{PREFIX}rows.carryover") == [(2 * (100 - 20 - 10), "c")]
    [(shuffled, kind)] = sent[f"{PREFIX}shuffle.bytes"]
    assert kind == "c" and shuffled > 0
    assert sent.get(f"{PREFIX}shuffle.skewed_partitions") == [(0, "g")]
    assert sent.get(f"{PREFIX}snapshots.committed") == [(1, "c")]
    assert sent.get(f"{PREFIX}lag.snapshots") == [(0, "g")]
    for phase in ("detect", "write", "coalesce", "read"):
        [(milliseconds, kind)] = sent[f"{PREFIX}phase.{phase}"]
        assert kind == "ms" and milliseconds >= 0, phase

    [(run_id, note)] = _notes(pipeline.home).items()
    assert note is not None and note.startswith(f"snapshot {merge} (overwrite, #3): +0 -10 ±20 updates, "), (
        note
    )
    assert "carryover 140" in note and "shuffled" in note and "write " in note and "read " in note, note

    assert pipeline.run(env_overrides=env) == 0, pipeline.log_tail()
    notes = _notes(pipeline.home)
    assert notes[run_id] == note  # each run keeps its own note
    [idle] = [content for other, content in notes.items() if other != run_id]
    assert idle == "caught up"

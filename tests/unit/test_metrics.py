"""Per-table metrics: names a StatsD backend keeps apart, tags for tagged backends."""

from __future__ import annotations

from datetime import timedelta

from iceberg_cdc.run.metrics import emit_commit, emit_lag, metric_prefix


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def incr(self, stat, count=None, rate=None, *, tags=None):
        self.calls.append(("incr", stat, count, tags))

    def gauge(self, stat, value, rate=None, delta=None, *, tags=None):
        self.calls.append(("gauge", stat, value, tags))

    def timing(self, stat, dt, *, tags=None):
        self.calls.append(("timing", stat, dt, tags))


def test_commit_figures_and_lag_are_emitted_per_table():
    stats = Recorder()
    committed = {
        "committed": True,
        "snapshot_id": 42,
        "inserts": 300,
        "deletes": 100,
        "updates": 1000,
        "carryover_rows": 37800,
        "shuffle_bytes": 813056,
        "seconds": {"write": 4.3, "read": 3.4},
        "skewed_partitions": 2,
    }
    emit_commit(stats, "shop.orders", committed)
    emit_lag(stats, "shop.orders", 8)
    tags = {"table": "shop.orders"}
    assert ("incr", "cdc.shop__orders.rows.inserts", 300, tags) in stats.calls
    assert ("incr", "cdc.shop__orders.rows.carryover", 37800, tags) in stats.calls
    assert ("incr", "cdc.shop__orders.shuffle.bytes", 813056, tags) in stats.calls
    assert ("incr", "cdc.shop__orders.snapshots.committed", None, tags) in stats.calls
    assert ("timing", "cdc.shop__orders.phase.write", timedelta(seconds=4.3), tags) in stats.calls
    assert ("gauge", "cdc.shop__orders.lag.snapshots", 8.0, tags) in stats.calls
    assert ("gauge", "cdc.shop__orders.shuffle.skewed_partitions", 2.0, tags) in stats.calls


def test_names_are_statsd_safe():
    assert metric_prefix("db.my_table") == "cdc.db__my_table"
    # A space is written "_"; the hash keeps "db.my table" apart from "db.my_table".
    assert metric_prefix("db.my table").startswith("cdc.db__my_table___")


def test_a_caught_up_run_counts_no_snapshot():
    stats = Recorder()
    emit_commit(stats, "shop.orders", {"committed": False, "reason": "caught up"})
    assert stats.calls == []
    emit_commit(
        stats, "shop.orders", {"committed": False, "snapshot_id": 7, "reason": "skipped replace snapshot"}
    )
    assert stats.calls == [("incr", "cdc.shop__orders.snapshots.uncommitted", None, {"table": "shop.orders"})]


def test_retention_gauges_say_how_long_until_a_needed_snapshot_may_go():
    from iceberg_cdc.run.metrics import emit_retention

    stats = Recorder()
    emit_retention(stats, "shop.orders", {"seconds_left": 5400.0, "protected": False})
    emit_retention(stats, "shop.orders", {"seconds_left": None, "protected": True})
    emit_retention(stats, "shop.orders", None)
    tags = {"table": "shop.orders"}
    assert stats.calls == [
        ("gauge", "cdc.shop__orders.retention.seconds_left", 5400.0, tags),
        ("gauge", "cdc.shop__orders.retention.protected", 0.0, tags),
        ("gauge", "cdc.shop__orders.retention.protected", 1.0, tags),
    ]


def test_a_bridge_commit_is_counted_as_one():
    stats = Recorder()
    bridge = {"reason": "expired", "from": "41", "to": "44"}
    emit_commit(stats, "shop.orders", {"committed": True, "snapshot_id": 44, "bridge": bridge})
    emit_commit(stats, "shop.orders", {"committed": True, "snapshot_id": 45, "bridge": {}})
    bridged = [c for c in stats.calls if c[1] == "cdc.shop__orders.snapshots.bridged"]
    assert bridged == [("incr", "cdc.shop__orders.snapshots.bridged", None, {"table": "shop.orders"})]

"""Metric names and tags stay whole on the StatsD wire, and distinct tables never share a name.

A table name may hold anything its catalog allows (dots, spaces, ``:|@#``,
unicode); StatsD and DogStatsD cut a line at ``:``, ``|``, ``@``, ``#``,
``,`` and newlines, and Airflow's validator drops a name outside
``[A-Za-z0-9_.-/]``. Every name and tag :mod:`iceberg_cdc.run.metrics`
emits, for any table, is checked through a recording backend.
"""

from __future__ import annotations

import string

from hypothesis import given
from hypothesis import strategies as st

from iceberg_cdc.run.metrics import emit_commit, emit_lag, emit_retention

SEPARATORS = set(":|@#,\n\r")
AIRFLOW_NAME_CHARACTERS = set(string.ascii_letters + string.digits + "_.-/")

COMMITTED = {
    "committed": True,
    "snapshot_id": 42,
    "inserts": 3,
    "deletes": 1,
    "updates": 2,
    "carryover_rows": 5,
    "cancelled_rows": 1,
    "shuffle_bytes": 100,
    "skewed_partitions": 1,
    "seconds": {"write": 1.5, "read": 2.0},
}

# Names built from the characters that break things most, and arbitrary text too.
tables = st.one_of(
    st.text(alphabet=st.sampled_from(list("ab._-:|@# \n\u00e9\u4e2d")), min_size=1, max_size=12),
    st.text(min_size=1, max_size=20),
)


class Recorder:
    def __init__(self) -> None:
        self.names: list[str] = []
        self.tags: list[dict[str, str]] = []

    def _record(self, stat: str, tags: dict[str, str] | None) -> None:
        self.names.append(stat)
        self.tags.append(tags or {})

    def incr(self, stat, count=None, rate=None, *, tags=None):
        self._record(stat, tags)

    def gauge(self, stat, value, rate=None, delta=None, *, tags=None):
        self._record(stat, tags)

    def timing(self, stat, dt, *, tags=None):
        self._record(stat, tags)


def _emitted(source: str) -> Recorder:
    stats = Recorder()
    emit_commit(stats, source, COMMITTED)
    emit_lag(stats, source, 3)
    emit_retention(stats, source, {"seconds_left": 60, "protected": True})
    return stats


@given(tables)
def test_no_name_or_tag_holds_a_statsd_separator(source):
    stats = _emitted(source)
    assert stats.names
    for name in stats.names:
        assert set(name) <= AIRFLOW_NAME_CHARACTERS, name
    for tags in stats.tags:
        for key, value in tags.items():
            assert not (set(key) | set(value)) & SEPARATORS, (key, value)


@given(tables, tables)
def test_distinct_tables_get_distinct_names_and_tags(first, second):
    if first == second:
        return
    a, b = _emitted(first), _emitted(second)
    assert not set(a.names) & set(b.names), (first, second)
    assert {t["table"] for t in a.tags}.isdisjoint({t["table"] for t in b.tags}), (first, second)


def test_plain_names_read_as_themselves():
    stats = _emitted("shop.order_items")
    assert "cdc.shop__order_items.lag.snapshots" in stats.names
    assert {t["table"] for t in stats.tags} == {"shop.order_items"}


@given(tables, st.data())
def test_a_table_and_its_lookalikes_get_distinct_names(source, data):
    """The names most likely to collide: one character written as the "_" or "__" the name shows for it."""
    position = data.draw(st.integers(min_value=0, max_value=len(source) - 1))
    lookalikes = {
        source[:position] + stand_in + source[position + 1 :]
        for stand_in in ("_", "__", ".", "-")
        if stand_in != source[position]
    } - {source}
    names = set(_emitted(source).names)
    for other in lookalikes:
        assert not names & set(_emitted(other).names), (source, other)

"""A sink commit that loses its race waits before retrying, and the waits spread out as it keeps losing.

A real SQLite catalog refuses the first commits of each call with
``CommitFailedException`` (what a writer that moved the table first causes);
the waits are recorded where the retry policy sleeps. Without the backoff the
retries of many writers land in lockstep and collide again; with a fixed wait
they never spread. ``test_sink_commit.py`` turns the backoff off for speed,
so the backoff is guarded here.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from pyiceberg.exceptions import CommitFailedException

from iceberg_cdc import retry
from iceberg_cdc.retry import SINK_COMMIT
from iceberg_cdc.sink.commit import advance_watermark, commit_changes
from iceberg_cdc.sink.table import ensure_sink_table, read_watermark
from iceberg_cdc.watermark import Watermark
from tests.support.sink_tables import (
    SINK,
    SOURCE,
    SOURCE_UUID,
    change_rows,
    make_catalog,
    source_schema,
    stage,
)

REFUSED = 4  # commits refused per call: 4 retries, 5 attempts (of SINK_COMMIT's 6)
CALLS = 30


@pytest.fixture
def refusing(tmp_path, monkeypatch):
    """The sink table of a SQLite catalog that refuses the first ``REFUSED`` commits after each ``arm()``."""
    catalog = make_catalog(tmp_path)
    table = ensure_sink_table(catalog, SINK, source_schema())
    real_commit = catalog.commit_table
    left = {"refusals": 0}

    def commit_table(table, requirements, updates):
        if left["refusals"]:
            left["refusals"] -= 1
            raise CommitFailedException("another writer committed first (refused by the test's catalog)")
        return real_commit(table, requirements, updates)

    monkeypatch.setattr(catalog, "commit_table", commit_table)
    return catalog, table, lambda: left.update(refusals=REFUSED)


@pytest.fixture
def slept(monkeypatch) -> list[float]:
    waits: list[float] = []
    monkeypatch.setattr(retry, "time", SimpleNamespace(sleep=waits.append))
    return waits


def test_retries_of_a_lost_commit_wait_longer_and_spread_wider(refusing, slept):
    catalog, table, arm = refusing
    random.seed(25)
    per_call: list[list[float]] = []
    for n in range(1, CALLS + 1):
        arm()
        # The first call commits real rows; the rest move the watermark (cheaper, the same retry loop).
        staged = stage(table, 1001, 1, [change_rows([1, 2, 3])]) if n == 1 else []
        result = commit_changes(
            table,
            staged_paths=staged,
            source_identifier=SOURCE,
            source_uuid=SOURCE_UUID,
            snapshot_id=1000 + n,
            ordinal=n,
        )
        assert result.attempts == REFUSED + 1
        per_call.append(slept[:])
        slept.clear()
    assert read_watermark(catalog.load_table(SINK), SOURCE) == Watermark(SOURCE_UUID, 1000 + CALLS, CALLS)

    assert all(len(waits) == REFUSED for waits in per_call), "one wait before each retry"
    by_retry = list(zip(*per_call, strict=True))
    for retry_number, waits in enumerate(by_retry):
        ceiling = SINK_COMMIT.ceiling(retry_number)
        assert all(0.0 <= w <= ceiling for w in waits)
        assert len(set(waits)) == len(waits), "jittered: no two writers wait alike"
        if retry_number:
            # The spread grows: later retries reach past the whole range of the earlier ones.
            assert max(waits) > SINK_COMMIT.ceiling(retry_number - 1)
    means = [sum(waits) / len(waits) for waits in by_retry]
    assert means == sorted(means) and means[-1] > 3 * means[0]


def test_a_watermark_only_commit_waits_before_each_retry_too(refusing, slept):
    _, table, arm = refusing
    arm()
    assert advance_watermark(table, SOURCE, SOURCE_UUID, 1001, 1) == Watermark(SOURCE_UUID, 1001, 1)
    assert len(slept) == REFUSED
    assert all(0.0 <= w <= SINK_COMMIT.ceiling(i) for i, w in enumerate(slept))

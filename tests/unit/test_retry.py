"""Retry timing: one policy type (exponential backoff, full jitter) and the pipeline's named policies."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from iceberg_cdc import retry
from iceberg_cdc.mirror.iceberg import commit as mirror_commit
from iceberg_cdc.retry import (
    FILE_IO,
    MIRROR_COMMIT,
    S3_REQUEST,
    SINK_COMMIT,
    RetryPolicy,
)
from iceberg_cdc.sink import commit as commit_module
from iceberg_cdc.storage.s3 import S3ObjectStore


@given(
    st.integers(min_value=1, max_value=20),
    st.floats(min_value=0, max_value=10),
    st.floats(min_value=0, max_value=60),
    st.integers(min_value=0, max_value=200),
)
def test_every_wait_lies_between_zero_and_the_capped_exponential(attempts, base, cap, retry_number):
    policy = RetryPolicy(attempts, base, cap)
    ceiling = min(cap, base * 2.0 ** min(retry_number, 64))
    assert policy.ceiling(retry_number) == ceiling
    assert 0.0 <= policy.delay(retry_number) <= ceiling


def test_ceilings_double_up_to_the_cap():
    policy = RetryPolicy(attempts=8, base_delay=0.1, max_delay=1.0)
    assert [policy.ceiling(n) for n in range(6)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])


def test_waits_are_jittered_over_the_whole_range():
    """Full jitter: retries of many parties spread from zero to the ceiling instead of colliding."""
    random.seed(7)
    waits = [SINK_COMMIT.delay(3) for _ in range(2000)]
    ceiling = SINK_COMMIT.ceiling(3)
    assert min(waits) < 0.05 * ceiling and max(waits) > 0.95 * ceiling
    assert len(set(waits)) == len(waits)
    assert 0.45 * ceiling < sum(waits) / len(waits) < 0.55 * ceiling


def test_sleep_waits_a_jittered_delay_not_the_ceiling(monkeypatch):
    """What a retry loop actually waits: spread over ``[0, ceiling]`` by seeded draws, never all the ceiling."""
    slept: list[float] = []
    monkeypatch.setattr(retry, "time", SimpleNamespace(sleep=slept.append))
    random.seed(25)
    for _ in range(500):
        FILE_IO.sleep(2)
    ceiling = FILE_IO.ceiling(2)
    assert len(slept) == 500 and all(0.0 <= s <= ceiling for s in slept)
    assert len(set(slept)) > 450, "jittered: the waits differ"
    assert min(slept) < 0.1 * ceiling and sum(slept) / len(slept) < 0.6 * ceiling


@pytest.mark.parametrize(("attempts", "base", "cap"), [(0, 0.1, 1.0), (3, -0.1, 1.0), (3, 0.1, -1.0)])
def test_nonsense_policies_are_refused(attempts, base, cap):
    with pytest.raises(ValueError, match="attempts >= 1 and delays >= 0"):
        RetryPolicy(attempts, base, cap)
    with pytest.raises(ValueError, match="start at 0"):
        FILE_IO.ceiling(-1)


def test_the_named_policies_keep_their_figures():
    """The waits each loop had before the policies had one owner (the ceilings, not the jitter)."""
    assert (S3_REQUEST.attempts, S3_REQUEST.base_delay, S3_REQUEST.max_delay) == (8, 0.2, 5.0)
    assert (FILE_IO.attempts, FILE_IO.base_delay, FILE_IO.max_delay) == (8, 0.1, 3.0)
    assert SINK_COMMIT.attempts == commit_module.DEFAULT_ATTEMPTS == 6
    assert [SINK_COMMIT.ceiling(n) for n in range(5)] == pytest.approx([0.2, 0.4, 0.8, 1.6, 3.2])
    assert MIRROR_COMMIT.attempts == mirror_commit.DEFAULT_ATTEMPTS == 5
    assert (MIRROR_COMMIT.base_delay, MIRROR_COMMIT.max_delay) == (
        SINK_COMMIT.base_delay,
        SINK_COMMIT.max_delay,
    )
    store = S3ObjectStore("s3://bucket/prefix", client=None)
    assert store.policy == S3_REQUEST


def test_sink_commit_retries_wait_by_the_sink_policy(monkeypatch):
    asked = []
    monkeypatch.setattr(SINK_COMMIT.__class__, "sleep", lambda self, n: asked.append((self, n)))
    commit_module._backoff(1)
    commit_module._backoff(5)
    assert asked == [(SINK_COMMIT, 0), (SINK_COMMIT, 4)]

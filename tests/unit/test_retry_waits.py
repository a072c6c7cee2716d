"""The storage retry loops really wait, longer after each failure, and not in lockstep.

The S3 tests run with zero delays (a real wait per injected fault would make
them minutes long), so nothing there fails when a loop stops sleeping or its
waits lose their jitter. Here the loops run against failures without a
network, and the sleep the policy module calls is recorded: one wait between
attempts (none after the last), each within its ceiling, the mean growing
with the retry number (backoff), the draws spread over ``[0, ceiling]``
(full jitter).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from statistics import mean
from types import SimpleNamespace

import botocore.exceptions
import pytest

from iceberg_cdc import retry
from iceberg_cdc.errors import TransientStorageError
from iceberg_cdc.retry import FILE_IO, S3_REQUEST, RetryPolicy
from iceberg_cdc.storage.retrying_streams import call_with_retries
from iceberg_cdc.storage.s3 import S3ObjectStore

RUNS = 300  # failed requests per loop: enough draws per retry number to see the spread


class ThrottledClient:
    """An S3 client whose GETs answer 503 SlowDown ``failures`` times, then the object."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def get_object(self, **kwargs):
        self.calls += 1
        if self.calls <= self.failures:
            raise botocore.exceptions.ClientError(
                {
                    "Error": {"Code": "SlowDown", "Message": "Reduce your request rate"},
                    "ResponseMetadata": {"HTTPStatusCode": 503},
                },
                "GetObject",
            )
        return {"Body": SimpleNamespace(read=lambda: b"payload"), "ETag": '"e"'}


@pytest.fixture
def slept(monkeypatch) -> list[float]:
    """Every wait of a retry loop, recorded instead of slept (the ``time`` of the policy module)."""
    waits: list[float] = []
    monkeypatch.setattr(retry, "time", SimpleNamespace(sleep=waits.append))
    random.seed(1234)
    return waits


def _s3_store_gives_up() -> None:
    store = S3ObjectStore("s3://bucket/shuffle", ThrottledClient(failures=10**9))
    with pytest.raises(TransientStorageError, match="SlowDown for 8 attempts"):
        store.get("a/one.data")


def _file_io_gives_up() -> None:
    def reset() -> bytes:
        raise ConnectionResetError("connection reset by peer")

    with pytest.raises(TransientStorageError):
        call_with_retries(FILE_IO, reset, operation="read", location="s3://bucket/t/data/f.parquet")


LOOPS: dict[str, tuple[Callable[[], None], RetryPolicy]] = {
    "s3-store": (_s3_store_gives_up, S3_REQUEST),
    "file-io": (_file_io_gives_up, FILE_IO),
}


@pytest.mark.parametrize("loop", LOOPS)
def test_the_waits_back_off_and_are_jittered(slept, loop):
    gives_up, policy = LOOPS[loop]
    by_retry: list[list[float]] = [[] for _ in range(policy.retries)]
    for _ in range(RUNS):
        slept.clear()
        gives_up()
        assert len(slept) == policy.retries, f"one wait between attempts, none after the last: {slept}"
        for number, wait in enumerate(slept):
            by_retry[number].append(wait)
    means = []
    for number, waits in enumerate(by_retry):
        ceiling = policy.ceiling(number)
        assert all(0.0 <= w <= ceiling for w in waits), f"retry {number} waited past {ceiling} s"
        # Full jitter: spread from near zero to near the ceiling, not one wait for every party.
        assert min(waits) < 0.15 * ceiling and max(waits) > 0.85 * ceiling, (number, min(waits), max(waits))
        assert len(set(waits)) > 0.9 * len(waits), "the waits differ from one request to the next"
        assert mean(waits) == pytest.approx(ceiling / 2, rel=0.2)
        means.append(mean(waits))
    # Backoff: the mean wait doubles while the ceiling does, up to the cap.
    doubling = [n for n in range(1, policy.retries) if policy.ceiling(n) == 2 * policy.ceiling(n - 1)]
    assert len(doubling) >= 3
    for n in doubling:
        assert means[n] > 1.5 * means[n - 1], f"retry {n} waits no longer than retry {n - 1}: {means}"


@pytest.mark.parametrize("failures", [1, 3])
def test_the_s3_store_waits_only_between_a_failure_and_its_retry(slept, failures):
    client = ThrottledClient(failures)
    assert S3ObjectStore("s3://bucket/shuffle", client).get("a/one.data") == b"payload"
    assert client.calls == failures + 1
    assert len(slept) == failures
    assert all(0.0 <= w <= S3_REQUEST.ceiling(n) for n, w in enumerate(slept))

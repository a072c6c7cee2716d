"""The one wait around taking a lease (both detect tasks): retry while held, fail or reschedule by the rule."""

from __future__ import annotations

import time

import pytest

from iceberg_cdc.airflow import lease_wait
from iceberg_cdc.airflow.compat import AirflowFailException, AirflowRescheduleException
from iceberg_cdc.coordination import TableLease
from iceberg_cdc.errors import LeaseHeldError
from iceberg_cdc.storage import open_store


@pytest.fixture
def lease(tmp_path) -> TableLease:
    return TableLease(open_store(f"file://{tmp_path}/store", {}), "shop.orders")


def _held_then_free(lease: TableLease, times: int):
    calls = {"n": 0}

    def take() -> str:
        calls["n"] += 1
        if calls["n"] <= times:
            raise LeaseHeldError("shop.orders is held by run 'other'")
        return lease.acquire("mine", 30).owner

    return take, calls


def _wait(take, lease, **kwargs):
    now = time.time()
    options = {
        "what": "table",
        "lease": lambda: lease,
        "window": 60.0,
        "try_started": now,
        "waiting_since": now,
        "reschedule": False,
        "in_process_seconds": 5.0,
    }
    return lease_wait.take_waiting(take, **{**options, **kwargs})


def test_a_held_lease_is_taken_once_it_is_free(lease, monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(lease_wait.time, "sleep", slept.append)
    take, calls = _held_then_free(lease, 2)
    assert _wait(take, lease) == "mine"
    assert calls["n"] == 3 and len(slept) == 2 and all(s >= 1.0 for s in slept)


def test_a_holder_past_the_window_fails_the_run_naming_it(lease, monkeypatch):
    real_sleep = time.sleep
    slept: list[float] = []

    def sleep(seconds: float) -> None:  # short real sleeps, so the 0.3 s window passes; never forever
        slept.append(seconds)
        assert len(slept) < 40, "the wait never gave up on a holder past its window"
        real_sleep(0.05)

    monkeypatch.setattr(lease_wait.time, "sleep", sleep)
    lease.acquire("other", 300)  # a live holder that keeps the table past the window
    take, calls = _held_then_free(lease, 10**6)
    with pytest.raises(AirflowFailException, match=r"LeaseHeldError: shop\.orders is held by run 'other'"):
        _wait(take, lease, window=0.3)
    assert calls["n"] > 1, "it waited before giving up"


def test_under_a_scheduler_the_wait_gives_its_slot_back(lease):
    take, calls = _held_then_free(lease, 1)
    with pytest.raises(AirflowRescheduleException):
        _wait(take, lease, reschedule=True, try_started=time.time() - 10)
    assert calls["n"] == 1


def test_the_holder_counts_from_when_it_took_the_lease(lease):
    assert lease_wait.holder_of(lease) == (None, False)
    before = time.time()
    lease.acquire("other", 300)
    since, expired = lease_wait.holder_of(lease)
    assert since is not None and since >= before - 1 and expired is False

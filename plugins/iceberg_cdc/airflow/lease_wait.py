"""Waiting for a busy table or mirror: the one loop both detect tasks run around taking a lease.

The rule of the wait -- how long, per holder, in process or by rescheduling --
is :func:`iceberg_cdc.run.lease.lease_wait_step`; this module only carries it
out the Airflow way (sleep, ``AirflowRescheduleException``, or
``AirflowFailException`` naming the holder).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from iceberg_cdc.airflow.compat import AirflowFailException, AirflowRescheduleException
from iceberg_cdc.coordination.lease import TableLease
from iceberg_cdc.errors import LeaseHeldError
from iceberg_cdc.run.lease import lease_wait_step

log = logging.getLogger("iceberg_cdc")

T = TypeVar("T")


def holder_of(lease: TableLease) -> tuple[float | None, bool]:
    """When the lease's current holder took it (epoch seconds), and whether its lease expired."""
    try:
        current = lease.current()
    except Exception:  # the wait is then counted from this run's own start
        return None, False
    if current is None or current.released:
        return None, False
    return current.acquired_at.timestamp(), current.expired(datetime.now(UTC))


def take_waiting(
    take: Callable[[], T],
    *,
    what: str,
    lease: Callable[[], TableLease],
    window: float,
    try_started: float,
    waiting_since: float,
    reschedule: bool,
    in_process_seconds: float,
) -> T:
    """``take()`` (a detect that takes a lease), waiting while another run holds it."""
    while True:
        try:
            return take()
        except LeaseHeldError as exc:
            holder_since, holder_expired = holder_of(lease())
            action, seconds = lease_wait_step(
                now=time.time(),
                waiting_since=waiting_since,
                holder_since=holder_since,
                holder_expired=holder_expired,
                window=window,
                try_started=try_started,
                reschedule=reschedule,
                in_process_seconds=in_process_seconds,
            )
            if action == "fail":
                raise AirflowFailException(f"LeaseHeldError: {exc}") from None
            if action == "reschedule":
                log.warning("%s busy, looking again in %.0f s (slot given back): %s", what, seconds, exc)
                raise AirflowRescheduleException(datetime.now(UTC) + timedelta(seconds=seconds)) from None
            log.info("%s busy, looking again in %.0f s: %s", what, seconds, exc)
            time.sleep(seconds)


__all__ = ["holder_of", "take_waiting"]

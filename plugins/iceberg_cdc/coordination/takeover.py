"""When a run may take a table's lease from its current holder: the rule of dead holders.

A released lease is free; the owner itself may take it again (a retried
detect); a holder Airflow reports finished is overtaken at once; otherwise
only an expired lease is -- at expiry when Airflow shows a task of the
holder's run *running* (that task stopped renewing: dead or hung), one more
TTL later when its run is between tasks (queued for a slot), at expiry when
Airflow cannot be asked. :class:`~iceberg_cdc.coordination.lease.TableLease`
applies it inside its conditional write.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from iceberg_cdc.coordination.lease_record import HolderState, LeaseInfo, iso
from iceberg_cdc.units import format_duration

log = logging.getLogger("iceberg_cdc.coordination.lease")


def ask_holder(holder_state: Callable[[LeaseInfo], HolderState] | None, current: LeaseInfo) -> HolderState:
    """What Airflow says of the holder's run; ``unknown`` without a way to ask, or when asking fails."""
    if holder_state is None:
        return "unknown"
    try:
        return holder_state(current)
    except Exception as exc:  # Airflow unreachable: fall back to expiry alone
        log.warning("could not ask Airflow about the lease holder %s: %s", current.holder(), exc)
        return "unknown"


def takeover_reason(
    owner: str,
    current: LeaseInfo,
    now: datetime,
    ttl_seconds: float,
    holder_state: Callable[[LeaseInfo], HolderState] | None,
) -> str | None:
    """Why ``owner`` may replace ``current`` (a phrase for the log), or None when it may not."""
    if current.released:
        return "free"
    if current.owner == owner:
        return "own"
    state = ask_holder(holder_state, current)
    if state == "finished":
        return f"Airflow reports its run {current.owner!r} finished"
    if not current.expired(now):
        return None
    ago = format_duration((now - current.expires_at).total_seconds())
    if state == "working":
        return (
            f"its lease expired at {iso(current.expires_at)} ({ago} ago) "
            "while Airflow shows a task of its run running: that task stopped renewing (dead or hung)"
        )
    if state == "running" and now < current.expires_at + timedelta(seconds=ttl_seconds):
        return None  # between tasks in Airflow's eyes: one more TTL before it is presumed stuck
    return f"its lease expired at {iso(current.expires_at)} ({ago} ago) without renewal"


__all__ = ["ask_holder", "takeover_reason"]

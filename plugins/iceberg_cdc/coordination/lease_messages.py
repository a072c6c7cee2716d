"""What a run is told when its table is busy, or when another run took its table over.

Both messages name the holder, the times, the lease object and what to do.
"""

from __future__ import annotations

from datetime import datetime

from iceberg_cdc.coordination.lease_record import LeaseInfo, iso
from iceberg_cdc.units import format_duration


def held_message(table: str, owner: str, current: LeaseInfo, now: datetime) -> str:
    """Run ``owner`` cannot take ``table``: ``current`` holds it."""
    if current.expired(now):
        timing = (
            f"its lease expired at {iso(current.expires_at)}, but Airflow still shows that run as "
            "running, so it gets one more TTL of grace before it is presumed stuck"
        )
    else:
        timing = (
            f"it holds the lease since {iso(current.acquired_at)} "
            f"({format_duration((now - current.acquired_at).total_seconds())} ago) until {iso(current.expires_at)} "
            f"(in {format_duration((current.expires_at - now).total_seconds())}, renewed while it works)"
        )
    return (
        f"table {table!r} is in use by another run, so run {owner!r} must not start: "
        f"{current.holder()}; {timing}. Two runs of one table must never overlap. Wait for that "
        f"run to finish (its cleanup releases the lease) and retry. If that run is dead, mark it "
        f"failed in Airflow (the next run then takes over at once) or wait until its lease expires; "
        f"the lease object is {current.uri}."
    )


def lost_message(table: str, uri: str, owner: str, epoch: int | None, current: LeaseInfo | None) -> str:
    """Run ``owner`` (of ``epoch``) no longer holds ``table``: what happened to the lease."""
    if current is None:
        what = "no lease exists any more (it was deleted by hand)"
    elif current.released:
        what = f"it was released (epoch {current.epoch})"
    else:
        what = f"{current.holder()} holds it since {iso(current.acquired_at)} until {iso(current.expires_at)}"
    return (
        f"run {owner!r} (epoch {epoch}) has lost the lease of table {table!r} ({uri}): {what}. "
        "Another run took over the table, so this run stops without committing or deleting anything "
        "the other run uses; nothing is lost, the holder (or the next run) processes the snapshot. "
        "If this happens often, the run stalls longer than the lease TTL between renewals: raise "
        "tables[].lease_ttl in the config (or the environment variable CDC_LEASE_TTL_SECONDS, which "
        "overrides it)."
    )

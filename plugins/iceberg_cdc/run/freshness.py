"""Freshness of a table's changelog against its source, and the SLO's alert state (fires once, delivered at least once).

**Freshness lag** of a table: the age of the oldest source snapshot not yet in
the changelog -- ``now`` minus that snapshot's commit time (its
``timestamp_ms``) -- and 0 when the changelog holds every snapshot of the
source's current history. It grows while a table is paused, blocked or
slow, whatever the reason, and is what ``tables[].freshness_slo`` promises.
Each of the table's **mirrors** is held to the same promise, measured the
same way from the mirror's own mark (the source snapshot whose state it
holds): a mirror whose DAG is paused or failing breaks it even while the
changelog is fresh.

**Breach**: lag above the SLO. The state (breached or not, since when) is one
small JSON object in the shuffle store, ``_freshness/<table>.json`` (a
mirror's: ``_freshness/<table>/mirror-<name>.json``), changed
only by a conditional write, so a breach **fires** exactly once (the check
whose write turned it on) and **clears** exactly once, however many checkers
run. Airflow-free: the freshness DAG (``iceberg_cdc.airflow.freshness_dag``)
runs :func:`check`, then :func:`deliver` hands the operator's callback what
is owed.

**Delivery** is at least once: a transition made while the table has a
``freshness_callback`` is stored as *undelivered* with the state, in the
same write, and leaves that list only when the callback returned
(:func:`deliver`). A callback that raises leaves it there: the check fails
(its task shows the error) and every later check calls the callback again
with that transition, oldest first, until one returns. So a callback may see
a transition twice (it raised after sending, or two checks raced), never
zero times.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from iceberg_cdc.run.context import Context
from iceberg_cdc.sink.table import read_watermark
from iceberg_cdc.source.history import oldest_pending, pending_count
from iceberg_cdc.source.tables import load_source_table
from iceberg_cdc.units import format_duration
from iceberg_cdc.watermark import Watermark

log = logging.getLogger("iceberg_cdc")

STATE_PREFIX = "_freshness"
Transition = Literal["fired", "cleared"]
# Undelivered transitions kept per state (a callback failing for days on a flapping table):
# beyond this the oldest are dropped, with an error in the log.
MAX_UNDELIVERED = 20


def breaches(lag_seconds: float | None, slo_seconds: float | None) -> bool:
    """The SLO's rule (the checks' and the CDC view's): a lag strictly above a configured SLO."""
    return slo_seconds is not None and lag_seconds is not None and lag_seconds > slo_seconds


@dataclass(frozen=True)
class Freshness:
    """One measurement of a table's freshness (snapshot ids as text: browsers round 19 digits)."""

    source: str
    slo_seconds: float | None
    lag_seconds: float
    pending: int
    oldest_pending: str | None  # the oldest source snapshot not yet in the changelog
    oldest_committed_at: str | None  # its commit time (ISO, UTC)
    measured_at: str
    mirror: str | None = None  # the mirror's name; None: the changelog itself

    @property
    def breached(self) -> bool:
        return breaches(self.lag_seconds, self.slo_seconds)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "breached": self.breached}

    def describe(self) -> str:
        """``shop.orders is 17 min 3 s behind its source (SLO 15 min): snapshot 123 ...``."""
        who = self.source if self.mirror is None else f"{self.source}'s mirror {self.mirror}"
        what = "the changelog" if self.mirror is None else f"the mirror {self.mirror}"
        if not self.pending:
            return f"{who}: {what} holds every source snapshot (lag 0 s)"
        slo = f" (SLO {format_duration(self.slo_seconds)})" if self.slo_seconds is not None else ""
        return (
            f"{who} is {format_duration(self.lag_seconds or 0)} behind its source{slo}: snapshot "
            f"{self.oldest_pending}, committed {self.oldest_committed_at}, is the oldest of "
            f"{self.pending} not yet in {what}"
        )


def measure(ctx: Context, now: datetime | None = None) -> Freshness:
    """The changelog's freshness now; never creates the sink (a missing sink has everything pending)."""
    catalog = ctx.catalog()
    source = load_source_table(catalog, ctx.table)
    watermark = None
    if catalog.table_exists(ctx.table.sink):
        watermark = read_watermark(catalog.load_table(ctx.table.sink), ctx.table.source)
    return freshness_after(ctx, source, watermark, now or datetime.now(UTC))


def freshness_after(
    ctx: Context, source: Any, watermark: Watermark | None, now: datetime, mirror: str | None = None
) -> Freshness:
    """The age of the oldest source snapshot after ``watermark`` (the sink's own next-snapshot rule).

    The changelog's watermark here; a mirror's mark in :mod:`iceberg_cdc.mirror.freshness`.
    """
    bridge = ctx.table.on_history_gap == "bridge"
    pending = oldest_pending(source, watermark, ctx.table.start, bridge=bridge)
    lag, committed_at = 0.0, None
    if pending is not None:
        committed = pending[1]
        lag, committed_at = max(0.0, (now - committed).total_seconds()), committed.isoformat()
    return Freshness(
        source=ctx.table.source,
        slo_seconds=ctx.table.freshness_slo,
        lag_seconds=round(lag, 3),
        pending=0 if pending is None else pending_count(source, watermark, ctx.table.start, bridge=bridge),
        oldest_pending=None if pending is None else str(pending[0]),
        oldest_committed_at=committed_at,
        measured_at=now.isoformat(),
        mirror=mirror,
    )


def state_key(source: str, mirror: str | None = None) -> str:
    return (
        f"{STATE_PREFIX}/{source}.json" if mirror is None else f"{STATE_PREFIX}/{source}/mirror-{mirror}.json"
    )


def check(
    ctx: Context, now: datetime | None = None, measured: Freshness | None = None
) -> tuple[Freshness, Transition | None]:
    """Measure (the changelog, unless ``measured`` is given: a mirror's), and move the alert state on a transition.

    Returns the transition, if this check made it. Two checkers racing on one
    transition: the conditional write lets one win; the other sees no
    transition (it never fires twice).
    """
    measured = measured or measure(ctx, now)
    store = ctx.runtime.store()
    key = state_key(ctx.table.source, measured.mirror)
    found = store.get_with_version(key)
    previous = json.loads(found[0]) if found is not None else {"breached": False}
    if bool(previous.get("breached")) == measured.breached:
        return measured, None
    transition: Transition = "fired" if measured.breached else "cleared"
    owed = list(previous.get("undelivered") or [])
    if ctx.table.freshness_callback:
        owed.append({"transition": transition, "freshness": measured.to_dict()})
    if len(owed) > MAX_UNDELIVERED:
        log.error("%s: %d freshness alerts were never delivered; the oldest are dropped", key, len(owed))
        owed = owed[-MAX_UNDELIVERED:]
    state = {
        "breached": measured.breached,
        "since": measured.measured_at,
        "freshness": measured.to_dict(),
        "undelivered": owed,
    }
    data = json.dumps(state, sort_keys=True).encode()
    version = store.put_if_absent(key, data) if found is None else store.put_if_version(key, data, found[1])
    if version is None:
        log.info("%s: another check moved the freshness state first", key)
        return measured, None
    log.warning("freshness SLO %s: %s", transition, measured.describe())
    return measured, transition


def deliver(ctx: Context, mirror: str | None, send: Callable[[dict[str, Any]], Any]) -> int:
    """Hand ``send`` each undelivered transition, oldest first; each leaves the state once ``send`` returned.

    ``send`` gets ``{"transition", "freshness"}`` (the measurement of the
    check that made the transition). An exception from ``send`` propagates
    and leaves that transition and the later ones owed: the next check
    delivers them. Returns how many were delivered.
    """
    store = ctx.runtime.store()
    key = state_key(ctx.table.source, mirror)
    found = store.get_with_version(key)
    sent = 0
    for alert in list(json.loads(found[0]).get("undelivered") or []) if found is not None else []:
        send(alert)
        _acknowledge(store, key, alert)
        sent += 1
    return sent


def _acknowledge(store: Any, key: str, alert: dict[str, Any], attempts: int = 10) -> None:
    """Take ``alert`` out of the state's undelivered list (a conditional write; retried when another check wrote)."""
    for _ in range(attempts):
        found = store.get_with_version(key)
        if found is None:
            return
        state = json.loads(found[0])
        owed = list(state.get("undelivered") or [])
        if alert not in owed:
            return  # another check delivered it
        owed.remove(alert)
        data = json.dumps({**state, "undelivered": owed}, sort_keys=True).encode()
        if store.put_if_version(key, data, found[1]) is not None:
            return
    log.warning("%s: a delivered freshness alert stays owed (the state kept moving): it may come again", key)


__all__ = [
    "Freshness",
    "Transition",
    "breaches",
    "check",
    "deliver",
    "measure",
    "freshness_after",
    "state_key",
]

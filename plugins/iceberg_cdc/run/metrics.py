"""Per-table figures through Airflow's configured metrics backend (StatsD or OpenTelemetry).

Names carry the table (``cdc.shop__orders.rows.inserts``) so plain StatsD
keeps tables apart; the same ``table`` tag goes along for backends with tags.
Emitted from the commit task (rows by change type, carryover, shuffle bytes,
skewed partitions, seconds per phase) and the watermark task (lag: pending
snapshots). The stats backend is passed in (Airflow's, by
:mod:`iceberg_cdc.airflow.metrics`), so the emission itself is plain code that
tests drive with a recorder.
"""

from __future__ import annotations

import hashlib
import logging
import string
from datetime import timedelta
from typing import Any, Protocol

from iceberg_cdc.verify_status import is_equal

log = logging.getLogger("iceberg_cdc")

COUNTERS = {
    "inserts": "rows.inserts",
    "deletes": "rows.deletes",
    "updates": "rows.updates",
    "carryover_rows": "rows.carryover",  # all carryover, before and after the shuffle
    "cancelled_rows": "rows.cancelled",  # the part cancelled in the write tasks, never shuffled
    "shuffle_bytes": "shuffle.bytes",
}


class StatsBackend(Protocol):
    def incr(
        self, stat: str, count: int | None = None, rate: float | None = None, *, tags: Any = None
    ) -> None: ...

    def gauge(
        self,
        stat: str,
        value: float,
        rate: float | None = None,
        delta: bool | None = None,
        *,
        tags: Any = None,
    ) -> None: ...

    def timing(self, stat: str, dt: Any, *, tags: Any = None) -> None: ...


# What Airflow's StatsD name validator lets through (airflow...metrics.validators.ALLOWED_CHARACTERS,
# less "/"); anything else in a table name is written "_" and the name made unique by a hash.
_NAME_CHARACTERS = frozenset(string.ascii_letters + string.digits + "-")
# StatsD and DogStatsD separators: in a name or a tag they cut the line into other fields.
_STATSD_SEPARATORS = frozenset(":|@#,\n\r")


def _plain(source: str) -> bool:
    """Whether ``namespace.table`` -> ``namespace__table`` can be read back: letters, digits, ``-``, dots,
    and single ``_`` between letters or digits (so ``__`` only ever stands for a dot)."""
    for i, c in enumerate(source):
        if c == "_":
            if not (0 < i < len(source) - 1 and {source[i - 1], source[i + 1]} <= _NAME_CHARACTERS):
                return False
        elif c != "." and c not in _NAME_CHARACTERS:
            return False
    return True


def metric_prefix(source: str) -> str:
    """``cdc.<namespace>__<table>``: a StatsD-safe name, distinct for distinct tables.

    A plain name (``shop.orders``) reads as itself (``cdc.shop__orders``);
    any other (spaces, ``:|@#``, ``__``, non-ASCII) has those characters
    written ``_`` and a hash of the real name appended after ``___``, so two
    tables never share their figures.
    """
    safe = "".join(c if c in _NAME_CHARACTERS else "_" for c in source.replace(".", "__"))
    if not _plain(source):
        safe += "___" + hashlib.sha256(source.encode()).hexdigest()[:12]
    return f"cdc.{safe}"


def table_tag(source: str) -> dict[str, str]:
    """The ``table`` tag: the table's name, or its metric name when the name holds a StatsD separator."""
    if any(c in _STATSD_SEPARATORS for c in source):
        return {"table": metric_prefix(source).removeprefix("cdc.")}
    return {"table": source}


def emit_commit(stats: StatsBackend, source: str, committed: dict[str, Any]) -> None:
    """Rows by change type, carryover, shuffle bytes and seconds per phase of one committed snapshot."""
    if committed.get("snapshot_id") is None:  # caught up: the run had no snapshot to count
        return
    prefix, tags = metric_prefix(source), table_tag(source)
    for key, name in COUNTERS.items():
        value = committed.get(key)
        if isinstance(value, int) and value:
            stats.incr(f"{prefix}.{name}", count=value, tags=tags)
    stats.incr(
        f"{prefix}.snapshots.{'committed' if committed.get('committed') else 'uncommitted'}", tags=tags
    )
    if committed.get("bridge"):  # one commit over a gap in the source's history (source/history.py)
        stats.incr(f"{prefix}.snapshots.bridged", tags=tags)
    if isinstance(committed.get("skewed_partitions"), int):  # shuffled snapshots only
        stats.gauge(f"{prefix}.shuffle.skewed_partitions", float(committed["skewed_partitions"]), tags=tags)
    for phase, seconds in (committed.get("seconds") or {}).items():
        stats.timing(f"{prefix}.phase.{phase}", timedelta(seconds=float(seconds)), tags=tags)


def emit_lag(stats: StatsBackend, source: str, remaining: int) -> None:
    """Snapshots still pending after the watermark."""
    stats.gauge(f"{metric_prefix(source)}.lag.snapshots", float(remaining), tags=table_tag(source))


def emit_freshness(stats: StatsBackend, source: str, freshness: dict[str, Any]) -> None:
    """Age of the oldest source snapshot not yet in the changelog (or a mirror), and whether it breaks the SLO.

    ``freshness.lag_seconds`` (0 when caught up); ``freshness.breached`` is 1 or
    0, sent only for a table with ``freshness_slo`` (run/freshness.py). A
    mirror's: ``cdc.<table>.mirror.<name>.freshness.*``, tagged ``mirror``.
    """
    prefix, tags = metric_prefix(source), table_tag(source)
    if freshness.get("mirror"):
        safe = _mirror_name(freshness["mirror"])
        prefix, tags = f"{prefix}.mirror.{safe}", {**tags, "mirror": safe}
    stats.gauge(f"{prefix}.freshness.lag_seconds", float(freshness.get("lag_seconds") or 0.0), tags=tags)
    if freshness.get("slo_seconds") is not None:
        stats.gauge(f"{prefix}.freshness.breached", 1.0 if freshness.get("breached") else 0.0, tags=tags)


def _mirror_name(name: str) -> str:
    """A mirror's name as a metric name segment."""
    return "".join(c if c in _NAME_CHARACTERS else "_" for c in name)


def emit_retention(stats: StatsBackend, source: str, retention: dict[str, Any] | None) -> None:
    """Seconds until a snapshot the sink needs may be expired (the retention guard), and whether it is protected.

    ``retention.seconds_left`` is sent only when something limits it (a table
    caught up, or protected by ``protect_pending``, has no limit); alert on it
    going below your reaction time. ``retention.protected`` is 1 or 0.
    """
    if not retention:
        return
    prefix, tags = metric_prefix(source), table_tag(source)
    left = retention.get("seconds_left")
    if isinstance(left, int | float):
        stats.gauge(f"{prefix}.retention.seconds_left", float(left), tags=tags)
    stats.gauge(f"{prefix}.retention.protected", 1.0 if retention.get("protected") else 0.0, tags=tags)


def emit_verification(stats: StatsBackend, source: str, mirror_name: str, verified: dict[str, Any]) -> None:
    """A mirror's verification (``mirror.verify``): whether it is equal, keys that differed and were left.

    ``cdc.<table>.mirror.<name>.verify.equal`` is 1 or 0 (alert on 0),
    ``...verify.drifted_keys`` the keys found differing (repaired or not),
    ``...verify.left_keys`` those still differing, ``...verify.seconds`` its time.
    """
    safe = _mirror_name(mirror_name)
    prefix = f"{metric_prefix(source)}.mirror.{safe}.verify"
    tags = {**table_tag(source), "mirror": safe}
    stats.gauge(f"{prefix}.equal", 1.0 if is_equal(verified.get("status")) else 0.0, tags=tags)
    stats.gauge(f"{prefix}.drifted_keys", float(verified.get("drifted_keys") or 0), tags=tags)
    stats.gauge(f"{prefix}.left_keys", float(verified.get("left_keys") or 0), tags=tags)
    total = (verified.get("seconds") or {}).get("total", 0.0)
    stats.timing(f"{prefix}.seconds", timedelta(seconds=float(total)), tags=tags)

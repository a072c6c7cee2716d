"""The commit-in-flight protocol: one rule for every catalog commit the product makes.

The changelog's sink commit and the Iceberg mirror's commit reference files
their tasks staged before. Around the catalog call a ``commit-pending``
marker sits in the run's namespace of the shuffle store, so that no cleanup
or sweep deletes those files while the commit's outcome is not known:

1. :func:`commit_in_flight` puts the marker, *then* proves the run still
   holds its lease (a cleanup or sweep that looked before the marker has
   released or taken the lease, so this check fails and nothing commits),
   runs the commit, and removes the marker once the outcome is known
   (committed, or certainly not: a refusal the caller names). Any other
   error leaves the marker: the outcome is unknown.
2. A run's own teardown releases the lease *first*, then reads the marker
   (:func:`read_marker`) and deletes the staged files only when it is
   :attr:`MarkerState.ABSENT` -- the order that makes a zombie commit either
   fail its lease check or be seen.
3. A later run's sweep of a dead attempt deletes them only when
   :func:`may_sweep` says so: the marker is absent, or readable and older
   than the lease's two TTLs plus :data:`LATE_COMMIT_GRACE_SECONDS`, when
   no commit of the dead run can still land (the table's history then says
   which files are referenced).

Fail-closed: only a store that answers "no such marker" lets files go. A
marker that cannot be read (a storage error after retries, truncated JSON,
a missing or garbled time) keeps them, and the namespace stays so that a
later sweep looks again.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from iceberg_cdc.errors import CdcError, ObjectNotFoundError
from iceberg_cdc.storage.base import ObjectStore

log = logging.getLogger("iceberg_cdc")

# How long past the lease's two TTLs a commit whose outcome is unknown may still land (its process
# stalled between its last lease check and the catalog's answer): its staged files are kept that long.
LATE_COMMIT_GRACE_SECONDS = 600.0

T = TypeVar("T")


class MarkerState(enum.Enum):
    ABSENT = "absent"  # the store says there is no marker: no commit of that attempt is in flight
    PENDING = "pending"  # a readable marker: a commit began at ``written_at`` and its outcome is unknown
    UNREADABLE = "unreadable"  # a marker (or the store) that cannot be read: treated as in flight


@dataclass(frozen=True)
class Marker:
    state: MarkerState
    written_at: float | None = None
    reason: str = ""

    @property
    def keeps_files(self) -> bool:
        """Whether a run's own teardown must keep the staged files (anything but a known absence)."""
        return self.state is not MarkerState.ABSENT


def marker_bytes(run_id: str, epoch: int, *, now: float | None = None) -> bytes:
    """The marker's content: who is committing, and since when (for the sweep's grace)."""
    written_at = time.time() if now is None else now
    return json.dumps({"run_id": run_id, "epoch": int(epoch), "written_at": written_at}).encode()


def read_marker(store: ObjectStore, key: str) -> Marker:
    """The marker at ``key``; only a store's clear "not found" is :attr:`MarkerState.ABSENT`."""
    try:
        raw = store.get(key)
    except ObjectNotFoundError:
        return Marker(MarkerState.ABSENT)
    except CdcError as exc:
        return Marker(MarkerState.UNREADABLE, reason=f"{type(exc).__name__}: {exc}")
    try:
        doc = json.loads(raw)
        # ``at``: the Iceberg mirror's markers before this module owned the format.
        value = doc.get("written_at", doc.get("at")) if isinstance(doc, dict) else None
        written_at = float(value)
    except (ValueError, TypeError) as exc:
        return Marker(MarkerState.UNREADABLE, reason=f"not a commit-pending marker ({exc}): {raw[:80]!r}")
    if written_at != written_at or written_at <= 0:  # NaN or a nonsense time
        return Marker(MarkerState.UNREADABLE, reason=f"no usable time in the marker: {raw[:80]!r}")
    return Marker(MarkerState.PENDING, written_at=written_at)


def may_sweep(marker: Marker, lease_ttl: float, *, now: float | None = None) -> bool:
    """Whether a later run may delete a dead attempt's staged files, given its marker.

    A commit finishes within seconds of its start or not at all, but the run
    that began it may be a zombie past its lease; two TTLs plus the grace after
    the marker, no commit of it can land any more.
    """
    if marker.state is MarkerState.ABSENT:
        return True
    if marker.state is MarkerState.UNREADABLE or marker.written_at is None:
        return False
    return (time.time() if now is None else now) - marker.written_at >= sweep_after(lease_ttl)


def sweep_after(lease_ttl: float) -> float:
    """Seconds after a marker was written when its attempt's staged files may be swept."""
    return 2 * float(lease_ttl) + LATE_COMMIT_GRACE_SECONDS


def commit_in_flight(
    store: ObjectStore,
    key: str,
    *,
    run_id: str,
    epoch: int,
    confirm_lease: Callable[[], Any],
    commit: Callable[[], T],
    certainly_not_committed: tuple[type[BaseException], ...],
) -> T:
    """Run ``commit`` with the marker at ``key`` around it (step 1 of the module doc).

    ``certainly_not_committed``: the errors ``commit`` raises only when its
    outcome is known (refused by the catalog, or raised before the catalog
    call). No default: a broad class (``CdcError``) would let an error raised
    after a commit landed remove the marker, and a teardown then delete the
    files that commit references.
    """
    # The marker goes up *before* the last lease check: a cleanup or sweep that looks after that
    # check sees it (and keeps the staged files); one that looked before has released or taken the
    # lease, so the check fails and nothing is committed.
    store.put(key, marker_bytes(run_id, epoch))
    try:
        confirm_lease()
    except BaseException:
        _remove(store, key)
        raise
    try:
        result = commit()
    except certainly_not_committed:
        _remove(store, key)
        raise
    # Any other error leaves the marker: the outcome is unknown, the files stay.
    _remove(store, key)
    return result


def _remove(store: ObjectStore, key: str) -> None:
    """Remove a marker whose outcome is known; one left behind only keeps files longer."""
    with contextlib.suppress(CdcError):
        store.delete_prefix(key)


def describe(marker: Marker) -> str:
    """For log lines: why a marker keeps (or not) the files."""
    if marker.state is MarkerState.PENDING:
        return f"a commit began at {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(marker.written_at))} UTC"
    if marker.state is MarkerState.UNREADABLE:
        return f"its commit-pending marker cannot be read ({marker.reason}); kept until it can"
    return "no commit in flight"


__all__ = [
    "LATE_COMMIT_GRACE_SECONDS",
    "Marker",
    "MarkerState",
    "commit_in_flight",
    "describe",
    "marker_bytes",
    "may_sweep",
    "read_marker",
    "sweep_after",
]

"""A per-table lease with a fencing token, so that two DAG runs of one table never overlap.

Airflow's ``max_active_runs`` does not cover every case: ``airflow backfill
create`` runs ignore it against scheduled runs (measured), and manual runs
race scheduled ones. So each run takes the table's lease in detect, renews it
at every step (and from a heartbeat while a Spark phase runs), and gives it
back in its cleanup teardown. The lease is one small JSON object in the
shuffle store, ``<shuffle uri>/_leases/<table>.json``::

    {"table": "shop.orders", "owner": "<Airflow run id>", "dag_id": "cdc__shop__orders",
     "try_number": 1, "epoch": 7, "released": false,
     "acquired_at": "...", "renewed_at": "...", "expires_at": "...",
     "host": "worker-1", "pid": 4242, "token": "<random, new on every write>"}

**Fencing.** Every acquisition gets an ``epoch`` one above the previous
holder's, and the object is never deleted (release leaves a ``released``
tombstone that keeps the epoch), so epochs only grow. A run names everything
it writes after its epoch and proves, with a conditional write
(:meth:`TableLease.renew`), that it still holds *that* epoch before it commits
or cleans up. A run that was overtaken (it stalled past its TTL and another
run took over) therefore fails with :class:`~iceberg_cdc.errors.LeaseLostError`
instead of committing or deleting what the new holder works on.

Every change is a conditional write against the store (see
``ObjectStore.put_if_absent`` and friends), so it is atomic:

* **acquire** creates the object only if it does not exist (S3
  ``If-None-Match: *``; ``link(2)`` on a file system), or replaces a released,
  expired or finished holder's object only if it still has the version (ETag)
  that was read (S3 ``If-Match``). Two runs racing: exactly one wins.
* **renew** extends the expiry the same way, only while the epoch is ours.
* **release** writes the tombstone the same way; it never touches another
  run's (or another epoch's) lease and is idempotent.

The random token makes every write's content, hence its version, unique: a
stale version can never match a later write (no A-B-A), and a write whose
answer was lost (retried after a dropped connection) is recognised as ours.

**Dead holders.** A holder that stops renewing is presumed dead once its
lease expires (default TTL: minutes, the config's ``tables[].lease_ttl``). Every
task of a run that holds the lease renews it from a heartbeat thread while it
works, so the lease mirrors Airflow's own view of the task: where the caller
can ask Airflow (``holder_state``), a holder whose run is finished is taken over
at once; one with a task Airflow shows *running* while the lease expired
(``"working"``: the task stopped renewing, it is dead or hung) is taken over at
expiry; one whose run is running between tasks (queued for a slot) gets one
more TTL of grace. A dead task therefore blocks its table for at most two
TTLs, whatever Airflow's own task heartbeat timeout (300 s by default) says.

Limits: expiry is judged by the reader's clock, so hosts' clocks must agree
to well within the TTL (NTP). ``file://`` stores coordinate one machine only.
The store must evaluate conditional requests atomically: AWS S3 does; moto
does not under concurrency (see ``storage.s3``); an S3-compatible store that
ignores the headers is caught by :func:`probe_conditional_writes`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from iceberg_cdc.coordination.lease_messages import held_message, lost_message
from iceberg_cdc.coordination.lease_record import (
    LEASE_PREFIX,
    HolderState,
    LeaseInfo,
    iso,
    lease_key,
    utc,
)
from iceberg_cdc.coordination.store_probe import probe_conditional_writes
from iceberg_cdc.coordination.takeover import takeover_reason
from iceberg_cdc.errors import LeaseHeldError, LeaseLostError
from iceberg_cdc.storage import ObjectStore, open_store

log = logging.getLogger(__name__)


def _is_ours(current: LeaseInfo | None, owner: str, epoch: int | None) -> bool:
    return (
        current is not None
        and not current.released
        and current.owner == owner
        and (epoch is None or current.epoch == epoch)
    )


def _check(owner: str, ttl_seconds: float) -> None:
    if not owner:
        raise ValueError("a lease owner (the Airflow run id) must not be empty")
    if not ttl_seconds > 0:
        raise ValueError(f"lease TTL must be positive, got {ttl_seconds!r}")


def _with_version(info: LeaseInfo, version: str) -> LeaseInfo:
    return dataclasses.replace(info, version=version)


class TableLease:
    """The lease of one source table in one store::

        lease = TableLease.open(shuffle_uri, s3_properties, "shop.orders")
        with lease.hold(run_id, ttl_seconds=300) as held:
            ...  # held.epoch fences everything written here

    or, across the tasks of a DAG run: ``acquire(run_id, ttl)`` in the first
    task, ``renew(run_id, epoch, ttl)`` at every later step and from
    heartbeats, ``release(run_id, epoch)`` in the cleanup teardown.

    ``clock`` (returning an aware datetime) is for tests.
    """

    def __init__(
        self,
        store: ObjectStore,
        table: str | Sequence[str],
        *,
        clock: Callable[[], datetime] | None = None,
        max_attempts: int = 5,
    ) -> None:
        self.store = store
        self.table = table if isinstance(table, str) else ".".join(table)
        self.key = lease_key(self.table)
        self.uri = store.describe(self.key)
        self._clock = clock or (lambda: datetime.now(UTC))
        self.max_attempts = max_attempts

    @classmethod
    def open(
        cls, shuffle_uri: str, properties: Mapping[str, str] | None, table: str | Sequence[str], **kwargs: Any
    ) -> TableLease:
        """The lease of ``table`` in the shuffle store at ``shuffle_uri``."""
        return cls(open_store(shuffle_uri, properties), table, **kwargs)

    def now(self) -> datetime:
        return utc(self._clock())

    # reading

    def current(self) -> LeaseInfo | None:
        """The lease as it is in the store now (expired or released or not), or None."""
        found = self.store.get_with_version(self.key)
        if found is None:
            return None
        data, version = found
        return LeaseInfo.from_json(data, version=version, uri=self.uri, table=self.table)

    def held(self) -> LeaseInfo | None:
        """The lease if some run holds it now (not released, not expired), else None."""
        current = self.current()
        return None if current is None or current.free(self.now()) else current

    # changing

    def _new(
        self,
        previous: LeaseInfo | None,
        *,
        owner: str,
        epoch: int,
        acquired_at: datetime,
        now: datetime,
        ttl_seconds: float,
        released: bool = False,
    ) -> LeaseInfo:
        info = LeaseInfo(
            table=self.table,
            owner=owner,
            acquired_at=acquired_at,
            expires_at=now if released else now + timedelta(seconds=ttl_seconds),
            host=socket.gethostname(),
            pid=os.getpid(),
            token=uuid.uuid4().hex,
            version="",
            uri=self.uri,
            epoch=epoch,
            dag_id=previous.dag_id if previous is not None and previous.owner == owner else "",
            try_number=previous.try_number if previous is not None and previous.owner == owner else None,
            released=released,
            renewed_at=now,
        )
        # what is stored has millisecond times: hand back exactly that
        return LeaseInfo.from_json(info.to_json(), version="", uri=self.uri, table=self.table)

    def acquire(
        self,
        owner: str,
        ttl_seconds: float,
        *,
        dag_id: str = "",
        try_number: int | None = None,
        holder_state: Callable[[LeaseInfo], HolderState] | None = None,
    ) -> LeaseInfo:
        """Take the table's lease for run ``owner`` for ``ttl_seconds``, with a new epoch.

        Succeeds when the table is free (no lease, or released), when
        ``owner`` itself holds it (a retried detect of the same run: the new
        epoch supersedes its earlier attempt), when the holder's run is known
        to be finished (``holder_state`` returns ``"finished"``), or when the
        lease has expired -- after one more TTL of grace if ``holder_state``
        says the holder's run is still running. Raises
        :class:`LeaseHeldError` naming the holder otherwise.
        """
        _check(owner, ttl_seconds)
        mine: set[str] = set()  # tokens we wrote: a write whose answer was lost is still ours
        for _ in range(self.max_attempts):
            now = self.now()
            current = self.current()
            if current is not None and current.token in mine:
                return current
            if current is not None:
                reason = takeover_reason(owner, current, now, ttl_seconds, holder_state)
                if reason is None:
                    raise LeaseHeldError(held_message(self.table, owner, current, now))
            new = dataclasses.replace(
                self._new(
                    None,
                    owner=owner,
                    epoch=(current.epoch + 1) if current is not None else 1,
                    acquired_at=now,
                    now=now,
                    ttl_seconds=ttl_seconds,
                ),
                dag_id=dag_id,
                try_number=try_number,
            )
            new = LeaseInfo.from_json(new.to_json(), version="", uri=self.uri, table=self.table)
            mine.add(new.token)
            if current is None:
                version = self.store.put_if_absent(self.key, new.to_json())
            else:
                version = self.store.put_if_version(self.key, new.to_json(), current.version)
            if version is None:
                continue  # someone was faster: look again
            if current is not None and reason not in ("free", "own"):
                log.warning(
                    "run %r took over the lease of %s (epoch %d) from %s: %s",
                    owner,
                    self.table,
                    new.epoch,
                    current.holder(),
                    reason,
                )
            else:
                log.info(
                    "run %r took the lease of %s (epoch %d) until %s",
                    owner,
                    self.table,
                    new.epoch,
                    iso(new.expires_at),
                )
            return _with_version(new, version)
        raise LeaseHeldError(
            f"run {owner!r} could not take the lease of table {self.table!r} in {self.max_attempts} "
            f"attempts: it kept changing under us ({self.uri}); another run is starting now; retry later"
        )

    def renew(self, owner: str, epoch: int | None, ttl_seconds: float) -> LeaseInfo:
        """Extend ``owner``'s lease of ``epoch`` to ``ttl_seconds`` from now; proves we still hold it.

        ``epoch`` None accepts any epoch of ``owner`` (for callers that never
        fence). Raises :class:`LeaseLostError` when the lease is no longer
        ``owner``'s epoch (another run took it over, or it was released): the
        run must stop without committing or deleting anything shared.
        """
        _check(owner, ttl_seconds)
        mine: set[str] = set()
        for _ in range(self.max_attempts):
            now = self.now()
            current = self.current()
            if current is not None and current.token in mine:
                return current
            if not _is_ours(current, owner, epoch):
                raise LeaseLostError(lost_message(self.table, self.uri, owner, epoch, current))
            assert current is not None
            if current.expired(now):
                log.warning(
                    "run %r renews its lease of %s after it expired at %s (nobody took it over)",
                    owner,
                    self.table,
                    iso(current.expires_at),
                )
            new = dataclasses.replace(
                self._new(
                    current,
                    owner=owner,
                    epoch=current.epoch,
                    acquired_at=current.acquired_at,
                    now=now,
                    ttl_seconds=ttl_seconds,
                )
            )
            mine.add(new.token)
            version = self.store.put_if_version(self.key, new.to_json(), current.version)
            if version is not None:
                return _with_version(new, version)
        raise LeaseLostError(
            f"run {owner!r} could not renew its lease of table {self.table!r} in {self.max_attempts} "
            f"attempts: it kept changing under us ({self.uri})"
        )

    def release(self, owner: str, epoch: int | None = None) -> bool:
        """Give ``owner``'s lease (of ``epoch``, when given) back; True when this call released it.

        The object stays as a ``released`` tombstone that keeps the epoch, so
        the next holder's epoch is higher. Idempotent: with no lease, a
        released one, or another run's (or epoch's) lease, nothing changes and
        False comes back (another holder is logged as a warning).
        """
        for _ in range(self.max_attempts):
            current = self.current()
            if current is None or current.released:
                log.info("run %r: no lease of %s to release", owner, self.table)
                return False
            if not _is_ours(current, owner, epoch):
                log.warning(
                    "run %r (epoch %s) does not release the lease of %s: it is held by %s since %s",
                    owner,
                    epoch,
                    self.table,
                    current.holder(),
                    iso(current.acquired_at),
                )
                return False
            now = self.now()
            tombstone = self._new(
                current,
                owner=owner,
                epoch=current.epoch,
                acquired_at=current.acquired_at,
                now=now,
                ttl_seconds=0,
                released=True,
            )
            if self.store.put_if_version(self.key, tombstone.to_json(), current.version) is not None:
                log.info("run %r released the lease of %s (epoch %d)", owner, self.table, current.epoch)
                return True
            # changed between our read and the write (a concurrent renew or takeover): look again
        log.warning("run %r: the lease of %s kept changing; not released", owner, self.table)
        return False

    @contextlib.contextmanager
    def hold(self, owner: str, ttl_seconds: float) -> Iterator[LeaseInfo]:
        """``with lease.hold(run_id, ttl):`` acquire on entry, release on exit (also on errors)."""
        info = self.acquire(owner, ttl_seconds)
        try:
            yield info
        except BaseException:
            try:
                self.release(owner, info.epoch)
            except Exception:
                log.exception("run %r could not release the lease of %s", owner, self.table)
            raise
        self.release(owner, info.epoch)

    # messages


__all__ = [
    "LEASE_PREFIX",
    "HolderState",
    "LeaseInfo",
    "TableLease",
    "lease_key",
    "probe_conditional_writes",
]

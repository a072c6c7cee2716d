"""A per-table lease, so that two DAG runs of one table never overlap.

Airflow's ``max_active_runs`` does not cover every case: ``airflow backfill
create`` runs ignore it against scheduled runs (measured), and manual runs
race scheduled ones. So each run takes the table's lease first and gives it
back in its cleanup teardown. The lease is one small JSON object in the
shuffle store, ``<shuffle uri>/_leases/<table>.json``::

    {"table": "shop.orders", "owner": "<Airflow run id>",
     "acquired_at": "2025-01-01T00:00:00.000+00:00",
     "expires_at": "2025-01-01T02:00:00.000+00:00",
     "host": "worker-1", "pid": 4242, "token": "<random, new on every write>"}

Every change is a conditional write against the store (see
``ObjectStore.put_if_absent`` and friends), so it is atomic:

* **acquire** creates the object only if it does not exist (S3
  ``If-None-Match: *``; ``link(2)`` on a file system). Two runs racing for a
  free table: exactly one wins.
* **takeover** of an *expired* lease (its holder died without cleanup)
  replaces the object only if it still has the version (ETag) that was read
  and found expired (S3 ``If-Match``). Two runs racing to take over: exactly
  one wins; the other sees the winner's fresh lease and fails.
* **renew** extends the expiry the same way, only while we still hold it.
* **release** deletes the object only if it is still ours, with the version
  we read (S3 ``DELETE`` with ``If-Match``); it never deletes another run's
  lease and is idempotent.

The random token makes every write's content, hence its version, unique: a
stale version can never match a later write (no A-B-A), and a write whose
answer was lost (retried after a dropped connection) is recognised as ours.

Limits: expiry is judged by the reader's clock, so hosts' clocks must agree
to well within the TTL (NTP); a holder that outlives its TTL without renewing
can be taken over while still running (choose the TTL above the longest run,
or renew). ``file://`` stores coordinate one machine only. The store must
evaluate conditional requests atomically: AWS S3 does; moto does not under
concurrency (see ``storage.s3``); an S3-compatible store that ignores the
headers is caught by :func:`probe_conditional_writes`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import socket
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from iceberg_cdc.errors import LeaseHeldError, StorageError
from iceberg_cdc.storage import ObjectStore, open_store

log = logging.getLogger(__name__)

LEASE_PREFIX = "_leases/"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_MAX_NAME = 150


def lease_key(table: str | Sequence[str]) -> str:
    """The store key of a table's lease: ``_leases/<identifier>.json``.

    Identifiers made only of letters, digits, ``.``, ``_`` and ``-`` are used
    as they are; any other character becomes ``_`` and a hash of the exact
    identifier is appended, so distinct identifiers get distinct keys.
    """
    name = table if isinstance(table, str) else ".".join(table)
    if not name:
        raise ValueError("a lease needs a table identifier")
    safe = _UNSAFE.sub("_", name)
    if safe != name or len(safe) > _MAX_NAME:
        digest = hashlib.sha256(name.encode()).hexdigest()[:16]
        safe = f"{safe[:_MAX_NAME]}-{digest}"
    return f"{LEASE_PREFIX}{safe}.json"


def _utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError(f"lease times must be timezone-aware, got {value!r}")
    return value.astimezone(UTC)


def _iso(value: datetime) -> str:
    return value.isoformat(timespec="milliseconds")


def _duration(delta: timedelta) -> str:
    seconds = int(abs(delta.total_seconds()))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{seconds:02d}s" if hours else f"{minutes}m{seconds:02d}s"


@dataclass(frozen=True)
class LeaseInfo:
    """A lease as read from (or just written to) the store."""

    table: str
    owner: str
    acquired_at: datetime
    expires_at: datetime
    host: str
    pid: int | None
    token: str
    version: str  # the store's version of the object (S3 ETag), for conditional writes
    uri: str  # where the lease object is, for messages

    def expired(self, now: datetime) -> bool:
        return _utc(now) >= self.expires_at

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "table": self.table,
                "owner": self.owner,
                "acquired_at": _iso(self.acquired_at),
                "expires_at": _iso(self.expires_at),
                "host": self.host,
                "pid": self.pid,
                "token": self.token,
            },
            indent=1,
        ).encode()

    @classmethod
    def from_json(cls, data: bytes, *, version: str, uri: str, table: str) -> LeaseInfo:
        try:
            doc: dict[str, Any] = json.loads(data)
            return cls(
                table=str(doc.get("table", table)),
                owner=str(doc["owner"]),
                acquired_at=_utc(datetime.fromisoformat(doc["acquired_at"])),
                expires_at=_utc(datetime.fromisoformat(doc["expires_at"])),
                host=str(doc.get("host", "?")),
                pid=doc.get("pid"),
                token=str(doc.get("token", "")),
                version=version,
                uri=uri,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise StorageError(
                f"{uri} is not a valid lease of table {table!r} ({type(exc).__name__}: {exc}); if no "
                f"run of {table!r} is active, delete that object by hand"
            ) from None


class TableLease:
    """The lease of one source table in one store::

        lease = TableLease.open(shuffle_uri, s3_properties, "shop.orders")
        with lease.hold(run_id, ttl_seconds=6 * 3600):
            ...

    or, across the tasks of a DAG run: ``acquire(run_id, ttl)`` in the first
    task, ``renew`` in long tasks, ``release(run_id)`` in the cleanup teardown.

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
        return _utc(self._clock())

    # reading

    def current(self) -> LeaseInfo | None:
        """The lease as it is in the store now (expired or not), or None."""
        found = self.store.get_with_version(self.key)
        if found is None:
            return None
        data, version = found
        return LeaseInfo.from_json(data, version=version, uri=self.uri, table=self.table)

    # changing

    def _new(self, owner: str, acquired_at: datetime, now: datetime, ttl_seconds: float) -> LeaseInfo:
        info = LeaseInfo(
            table=self.table,
            owner=owner,
            acquired_at=acquired_at,
            expires_at=now + timedelta(seconds=ttl_seconds),
            host=socket.gethostname(),
            pid=os.getpid(),
            token=uuid.uuid4().hex,
            version="",
            uri=self.uri,
        )
        # what is stored has millisecond times: hand back exactly that
        return LeaseInfo.from_json(info.to_json(), version="", uri=self.uri, table=self.table)

    def acquire(self, owner: str, ttl_seconds: float) -> LeaseInfo:
        """Take the table's lease for run ``owner`` for ``ttl_seconds``.

        Succeeds when the table is free, when ``owner`` already holds the
        lease (a retried task of the same run: the expiry is extended), or
        when the lease has expired (its holder died: taken over atomically).
        Raises :class:`LeaseHeldError` naming the holder otherwise.
        """
        _check(owner, ttl_seconds)
        mine: set[str] = set()  # tokens we wrote: a write whose answer was lost is still ours
        for _ in range(self.max_attempts):
            now = self.now()
            current = self.current()
            if current is not None and current.token in mine:
                return current
            if current is None:
                new = self._new(owner, now, now, ttl_seconds)
                mine.add(new.token)
                version = self.store.put_if_absent(self.key, new.to_json())
                if version is not None:
                    log.info("run %r took the lease of %s until %s", owner, self.table, _iso(new.expires_at))
                    return _with_version(new, version)
                continue  # someone was faster: look again
            if current.owner == owner or current.expired(now):
                takeover = current.owner != owner
                new = self._new(owner, now if takeover else current.acquired_at, now, ttl_seconds)
                mine.add(new.token)
                version = self.store.put_if_version(self.key, new.to_json(), current.version)
                if version is not None:
                    if takeover:
                        log.warning(
                            "run %r took over the expired lease of %s from run %r (host %s, held since %s, "
                            "expired at %s)",
                            owner,
                            self.table,
                            current.owner,
                            current.host,
                            _iso(current.acquired_at),
                            _iso(current.expires_at),
                        )
                    return _with_version(new, version)
                continue  # changed since we read it: look again
            raise LeaseHeldError(self._held_message(owner, current, now))
        raise LeaseHeldError(
            f"run {owner!r} could not take the lease of table {self.table!r} in {self.max_attempts} "
            f"attempts: it kept changing under us ({self.uri}); another run is starting now; retry later"
        )

    def renew(self, owner: str, ttl_seconds: float) -> LeaseInfo:
        """Extend ``owner``'s lease to ``ttl_seconds`` from now (long runs call this periodically).

        Raises :class:`LeaseHeldError` when ``owner`` no longer holds the
        lease (it expired and another run took it over, or it was deleted):
        the run must stop, another may be running.
        """
        _check(owner, ttl_seconds)
        mine: set[str] = set()
        for _ in range(self.max_attempts):
            now = self.now()
            current = self.current()
            if current is not None and current.token in mine:
                return current
            if current is None or current.owner != owner:
                raise LeaseHeldError(self._lost_message(owner, current, now))
            if current.expired(now):
                log.warning(
                    "run %r renews its lease of %s after it expired at %s (nobody took it over)",
                    owner,
                    self.table,
                    _iso(current.expires_at),
                )
            new = self._new(owner, current.acquired_at, now, ttl_seconds)
            mine.add(new.token)
            version = self.store.put_if_version(self.key, new.to_json(), current.version)
            if version is not None:
                return _with_version(new, version)
        raise LeaseHeldError(
            f"run {owner!r} could not renew its lease of table {self.table!r} in {self.max_attempts} "
            f"attempts: it kept changing under us ({self.uri})"
        )

    def release(self, owner: str) -> bool:
        """Give ``owner``'s lease back; True when this call deleted it.

        Idempotent: with no lease, or another run's lease, nothing is deleted
        and False comes back (another run's lease is logged as a warning).
        """
        for _ in range(self.max_attempts):
            current = self.current()
            if current is None:
                log.info("run %r: no lease of %s to release", owner, self.table)
                return False
            if current.owner != owner:
                log.warning(
                    "run %r does not release the lease of %s: it is held by run %r (host %s) since %s",
                    owner,
                    self.table,
                    current.owner,
                    current.host,
                    _iso(current.acquired_at),
                )
                return False
            if self.store.delete_if_version(self.key, current.version):
                log.info("run %r released the lease of %s", owner, self.table)
                return True
            # changed between our read and the delete (a concurrent renew or takeover): look again
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
                self.release(owner)
            except Exception:
                log.exception("run %r could not release the lease of %s", owner, self.table)
            raise
        self.release(owner)

    # messages

    def _held_message(self, owner: str, current: LeaseInfo, now: datetime) -> str:
        return (
            f"table {self.table!r} is in use by another run, so run {owner!r} must not start: "
            f"run {current.owner!r} (host {current.host}, pid {current.pid}) holds its lease since "
            f"{_iso(current.acquired_at)} ({_duration(now - current.acquired_at)} ago) until "
            f"{_iso(current.expires_at)} (in {_duration(current.expires_at - now)}). Two runs of one "
            f"table must never overlap. Wait for that run to finish (its cleanup releases the lease) "
            f"and retry. If that run is dead, its lease expires at {_iso(current.expires_at)} and the "
            f"next run after that takes it over; if you are sure no run of {self.table!r} is active, "
            f"delete the lease object {current.uri} by hand."
        )

    def _lost_message(self, owner: str, current: LeaseInfo | None, now: datetime) -> str:
        if current is None:
            what = "no lease exists any more (it was released or deleted by hand)"
        else:
            what = (
                f"run {current.owner!r} (host {current.host}) holds it since {_iso(current.acquired_at)} "
                f"until {_iso(current.expires_at)}"
            )
        return (
            f"run {owner!r} has lost the lease of table {self.table!r} ({self.uri}): {what}. Another run "
            f"may have processed the table meanwhile; stop this run and let the next one start from the "
            f"watermark. Renew more often, or use a TTL longer than the longest run."
        )


def _check(owner: str, ttl_seconds: float) -> None:
    if not owner:
        raise ValueError("a lease owner (the Airflow run id) must not be empty")
    if not ttl_seconds > 0:
        raise ValueError(f"lease TTL must be positive, got {ttl_seconds!r}")


def _with_version(info: LeaseInfo, version: str) -> LeaseInfo:
    return dataclasses.replace(info, version=version)


def probe_conditional_writes(store: ObjectStore) -> None:
    """Check that ``store`` honours conditional writes; raise StorageError if not.

    An S3-compatible store that silently ignores ``If-None-Match`` /
    ``If-Match`` would turn every lease operation unconditional. Costs five
    requests on a unique key under ``_leases/``, which it deletes.
    """
    key = f"{LEASE_PREFIX}.probe-{uuid.uuid4().hex}"
    where = store.describe(key)
    first = store.put_if_absent(key, b"probe-1")
    if first is None:
        raise StorageError(f"{where}: a create-if-absent of a new key failed")
    problems = []
    if store.put_if_absent(key, b"probe-2") is not None:
        problems.append("create-if-absent (If-None-Match: *) overwrote an existing object")
    current = store.get_with_version(key)
    if store.put_if_version(key, b"probe-3", "0" * 32) is not None:
        problems.append("replace-if-version (If-Match) wrote despite a wrong version")
        current = store.get_with_version(key)
    if current is not None and store.delete_if_version(key, "0" * 32):
        problems.append("delete-if-version (DELETE If-Match) deleted despite a wrong version")
        current = None
    if current is not None and not store.delete_if_version(key, current[1]):
        problems.append("delete-if-version did not delete with the right version")
    if problems:
        raise StorageError(
            f"{store.uri} does not honour conditional writes: {'; '.join(problems)}. Table leases "
            "cannot be atomic on this store: use AWS S3 or a store that supports S3 preconditions"
        )

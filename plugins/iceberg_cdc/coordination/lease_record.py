"""One table's lease as stored: where it lives (:func:`lease_key`) and what it says (:class:`LeaseInfo`).

The record and its JSON form, apart from the protocol that writes it
(:mod:`iceberg_cdc.coordination.lease`), so readers such as the CDC view need
only this.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from iceberg_cdc.errors import StorageError

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


def utc(value: datetime) -> datetime:
    """``value`` in UTC; a naive time is refused (a lease compared across hosts needs its zone)."""
    if value.tzinfo is None:
        raise ValueError(f"lease times must be timezone-aware, got {value!r}")
    return value.astimezone(UTC)


def iso(value: datetime) -> str:
    """The record's form of a time (ISO 8601, milliseconds), in the object and in messages."""
    return value.isoformat(timespec="milliseconds")


# What Airflow says of a holder's run: "working" (one of its tasks is running), "running" (the run is,
# between tasks), "finished", or "unknown".
HolderState = str


@dataclass(frozen=True)
class LeaseInfo:
    """A lease as read from (or just written to) the store."""

    table: str
    owner: str  # the holder's Airflow run id
    acquired_at: datetime
    expires_at: datetime
    host: str
    pid: int | None
    token: str
    version: str  # the store's version of the object (S3 ETag), for conditional writes
    uri: str  # where the lease object is, for messages
    epoch: int = 0  # fencing token: grows with every acquisition, never reused
    dag_id: str = ""
    try_number: int | None = None
    released: bool = False
    renewed_at: datetime | None = None

    def expired(self, now: datetime) -> bool:
        return utc(now) >= self.expires_at

    def free(self, now: datetime) -> bool:
        return self.released or self.expired(now)

    def holder(self) -> str:
        """The holder as people name it: run, DAG, try, epoch, host."""
        parts = [f"run {self.owner!r}"]
        if self.dag_id:
            parts.append(f"of DAG {self.dag_id}")
        if self.try_number is not None:
            parts.append(f"try {self.try_number}")
        parts.append(f"epoch {self.epoch}, host {self.host}, pid {self.pid}")
        return " ".join(parts[:-1]) + f" ({parts[-1]})"

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "table": self.table,
                "owner": self.owner,
                "dag_id": self.dag_id,
                "try_number": self.try_number,
                "epoch": self.epoch,
                "released": self.released,
                "acquired_at": iso(self.acquired_at),
                "renewed_at": iso(self.renewed_at or self.acquired_at),
                "expires_at": iso(self.expires_at),
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
            renewed = doc.get("renewed_at")
            try_number = doc.get("try_number")
            return cls(
                table=str(doc.get("table", table)),
                owner=str(doc["owner"]),
                acquired_at=utc(datetime.fromisoformat(doc["acquired_at"])),
                expires_at=utc(datetime.fromisoformat(doc["expires_at"])),
                host=str(doc.get("host", "?")),
                pid=doc.get("pid"),
                token=str(doc.get("token", "")),
                version=version,
                uri=uri,
                epoch=int(doc.get("epoch", 0)),
                dag_id=str(doc.get("dag_id") or ""),
                try_number=int(try_number) if try_number is not None else None,
                released=bool(doc.get("released", False)),
                renewed_at=utc(datetime.fromisoformat(renewed)) if renewed else None,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise StorageError(
                f"{uri} is not a valid lease of table {table!r} ({type(exc).__name__}: {exc}); if no "
                f"run of {table!r} is active, delete that object by hand"
            ) from None

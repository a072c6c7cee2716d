"""Whether a store evaluates conditional writes, without which no lease can be atomic."""

from __future__ import annotations

import uuid

from iceberg_cdc.coordination.lease_record import LEASE_PREFIX
from iceberg_cdc.errors import StorageError
from iceberg_cdc.storage import ObjectStore


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
        raise StorageError(
            f"{where}: a create-if-absent (If-None-Match: *) of a new key failed, so table leases cannot be "
            "taken on this store: check its write permissions under _leases/, or use AWS S3 or a store that "
            "supports S3 preconditions"
        )
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


_PROBED: set[str] = set()  # stores whose conditional writes were checked in this process


def probe_once(store: ObjectStore) -> None:
    """:func:`probe_conditional_writes`, once per store and process (before a lease is first taken there)."""
    if store.uri in _PROBED:
        return
    probe_conditional_writes(store)
    _PROBED.add(store.uri)

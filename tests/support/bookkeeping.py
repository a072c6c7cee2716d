"""Objects the shuffle store keeps between runs on purpose: the tables' leases and the tag registry.

A finished or cleaned-up run leaves nothing else there; tests that check so
leave these out, from one list.
"""

from __future__ import annotations

from iceberg_cdc.coordination.lease_record import LEASE_PREFIX
from iceberg_cdc.source.protection import REGISTRY_PREFIX

BOOKKEEPING_PREFIXES = (LEASE_PREFIX, REGISTRY_PREFIX)


def is_bookkeeping(key: str) -> bool:
    """Whether ``key`` (relative to the store's root, or with a leading prefix such as ``cdc/``) is a lease
    or a registry record."""
    return any(key.startswith(p) or f"/{p}" in key for p in BOOKKEEPING_PREFIXES)

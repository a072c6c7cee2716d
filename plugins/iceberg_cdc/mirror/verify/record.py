"""The last verification of each mirror, kept in the object store beside its runs.

One small JSON object per mirror (``<table>/mirror-<name>/verified.json``,
outside every run's ``epoch-<n>/`` namespace so no sweep removes it): what
the mirror DAG reads to decide whether a verification is due, and what the
CDC view shows.
"""

from __future__ import annotations

import json
import time
from typing import Any

from iceberg_cdc.errors import ObjectNotFoundError
from iceberg_cdc.mirror.staging import mirror_prefix
from iceberg_cdc.storage import ObjectStore


def record_key(table: str, mirror_name: str) -> str:
    return f"{mirror_prefix(table, mirror_name)}verified.json"


def save_verification(store: ObjectStore, table: str, mirror_name: str, result: dict[str, Any]) -> None:
    store.put(record_key(table, mirror_name), json.dumps(result, sort_keys=True).encode())


def last_verification(store: ObjectStore, table: str, mirror_name: str) -> dict[str, Any] | None:
    """The last verification's result, or None (never verified, or unreadable: verify again)."""
    try:
        return json.loads(store.get(record_key(table, mirror_name)))
    except ObjectNotFoundError:
        return None
    except ValueError:
        return None


def due(every: float | None, last: dict[str, Any] | None, now: float | None = None) -> bool:
    """Whether a mirror run should verify: ``every`` seconds since the last (0: always; None: never)."""
    if every is None:
        return False
    if last is None or every == 0:
        return True
    return (now if now is not None else time.time()) - float(last.get("verified_at", 0)) >= every

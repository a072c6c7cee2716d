"""Format-v3 table metadata: written by the catalog's own commit, which pyiceberg 0.12 refuses.

``TableMetadataV3.model_dump_json`` raises ``NotImplementedError``
(apache/iceberg-python#1551) although the model holds every v3 field and its
generic JSON dump writes them by their spec names. A mirror of a v3 source is
a v3 table (its deletes are deletion vectors), so its commits must write v3
metadata: :func:`writing_v3_metadata` lifts the guard for the duration of one
catalog call, keeping the catalog's optimistic-concurrency check (the SQL
catalog's compare-and-swap, a REST catalog's requirements) intact.

pyiceberg 0.12 also leaves a new v3 table without ``next-row-id`` (and keeps
it unset through every later snapshot), which the spec requires and Iceberg's
Java implementation refuses to load without: :func:`next_row_id` derives it
from the snapshots' row ranges, and :func:`dump_v3` writes it.

The guard is process-wide while lifted; commits are short and the lift is
re-entrant (a counter), so nested or concurrent commits in one process
restore it only when the last one leaves.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from pyiceberg.table.metadata import TableMetadataV3
from pyiceberg.typedef import IcebergBaseModel

_GUARD = TableMetadataV3.model_dump_json
_lock = threading.Lock()
_depth = 0


def next_row_id(metadata: Any) -> int:
    """The table's next row id: its own field, else past the highest row range a snapshot assigned.

    Row ids only grow (each snapshot's ``first-row-id`` is the table's
    ``next-row-id`` before it, which then grows by its ``added-rows``), so the
    highest ``first-row-id + added-rows`` over the retained snapshots -- the
    current one's at least -- is where the next range starts.
    """
    if getattr(metadata, "next_row_id", None) is not None:
        return int(metadata.next_row_id)
    return max(
        (
            int(s.first_row_id) + int(s.added_rows or 0)
            for s in getattr(metadata, "snapshots", ())
            if getattr(s, "first_row_id", None) is not None
        ),
        default=0,
    )


def dump_v3(metadata: TableMetadataV3, **kwargs: Any) -> str:
    """v3 metadata as JSON, with pyiceberg's own defaults for its metadata files and ``next-row-id`` set."""
    if metadata.next_row_id is None:
        metadata = metadata.model_copy(update={"next_row_id": next_row_id(metadata)})
    kwargs.setdefault("exclude_none", True)
    kwargs.setdefault("by_alias", True)
    return IcebergBaseModel.model_dump_json(metadata, **kwargs)


@contextlib.contextmanager
def writing_v3_metadata() -> Iterator[None]:
    """Within the block, pyiceberg writes v3 table metadata JSON instead of refusing."""
    global _depth
    with _lock:
        _depth += 1
        TableMetadataV3.model_dump_json = dump_v3  # type: ignore[method-assign]
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                TableMetadataV3.model_dump_json = _GUARD  # type: ignore[method-assign]

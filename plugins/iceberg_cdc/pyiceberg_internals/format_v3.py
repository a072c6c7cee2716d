"""Format-v3 table metadata: written by the catalog's own commit, which pyiceberg 0.12 refuses.

``TableMetadataV3.model_dump_json`` raises ``NotImplementedError``
(apache/iceberg-python#1551) although the model holds every v3 field and its
generic JSON dump writes them by their spec names. A mirror of a v3 source is
a v3 table (its deletes are deletion vectors), so its commits must write v3
metadata: :func:`writing_v3_metadata` lifts the guard for the duration of one
catalog call, keeping the catalog's optimistic-concurrency check (the SQL
catalog's compare-and-swap, a REST catalog's requirements) intact.

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


def dump_v3(metadata: TableMetadataV3, **kwargs: Any) -> str:
    """v3 metadata as JSON, with pyiceberg's own defaults for its metadata files."""
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

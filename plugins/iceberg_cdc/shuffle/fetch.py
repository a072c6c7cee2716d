"""Fetch one read range from every map output, concurrently.

A SHUFFLE_READ task needs partitions ``[start, end)`` of every map output:
one ranged GET each. The GETs are independent and I/O bound, so a small
thread pool keeps several in flight while earlier ones are decoded (LZ4 and
Arrow release the GIL). Results are assembled in map-output order, so the
rows a task sees do not depend on which GET finished first.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa

from iceberg_cdc.shuffle.layout import MapOutputIndex
from iceberg_cdc.shuffle.reader import read_range
from iceberg_cdc.storage.base import ObjectStore

DEFAULT_FETCH_THREADS = 8


def fetch_range(
    store: ObjectStore,
    indexes: Sequence[MapOutputIndex],
    start: int,
    end: int,
    schema: pa.Schema,
    *,
    threads: int = DEFAULT_FETCH_THREADS,
) -> pa.Table:
    """All rows of partitions ``[start, end)`` over ``indexes``, as one table of ``schema``."""
    wanted = [index for index in indexes if index.offsets[end] > index.offsets[start]]

    def one(index: MapOutputIndex) -> list[pa.RecordBatch]:
        return list(read_range(store, index, start, end, schema))

    if threads <= 1 or len(wanted) <= 1:
        parts = [one(index) for index in wanted]
    else:
        with ThreadPoolExecutor(max_workers=min(threads, len(wanted))) as pool:
            parts = list(pool.map(one, wanted))
    return pa.Table.from_batches([batch for part in parts for batch in part], schema=schema)

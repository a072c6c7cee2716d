"""Reading a map output's partitions in tests, by the function the read tasks use.

The read tasks get a range's offsets from coalesce and call
:func:`~iceberg_cdc.shuffle.reader.read_partitions`; a test holds the map
output's whole index instead, and slices it here.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from iceberg_cdc.shuffle.layout import MapOutputIndex
from iceberg_cdc.shuffle.reader import read_partitions
from iceberg_cdc.storage.base import ObjectStore


def read_span(
    store: ObjectStore, index: MapOutputIndex, start: int, end: int, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """Partitions ``[start, end)`` of the map output ``index`` describes."""
    assert 0 <= start <= end <= index.num_partitions, (start, end, index.num_partitions)
    return read_partitions(store, index.name, index.offsets[start : end + 1], start, schema)

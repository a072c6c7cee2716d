"""Fetch one read range from every map output, concurrently.

A SHUFFLE_READ task needs partitions ``[start, end)`` of every map output:
one ranged GET each. The GETs are independent and I/O bound, so a small
thread pool keeps several in flight while earlier ones are decoded (LZ4 and
Arrow release the GIL). Results are assembled in map-output order, so the
rows a task sees do not depend on which GET finished first.

Read tasks get their offsets as :class:`MapOutputSpan` slices from coalesce,
which already read and validated every index: no index is read twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa

from iceberg_cdc.shuffle.layout import MapOutputIndex
from iceberg_cdc.shuffle.reader import read_partitions
from iceberg_cdc.storage.base import ObjectStore

DEFAULT_FETCH_THREADS = 8


@dataclass(frozen=True)
class MapOutputSpan:
    """Partitions ``first_partition .. first_partition + len(offsets) - 2`` of one map output."""

    name: str
    first_partition: int
    offsets: tuple[int, ...]  # index offsets off[p0] .. off[p1]

    @property
    def size(self) -> int:
        return self.offsets[-1] - self.offsets[0]

    @classmethod
    def of(cls, index: MapOutputIndex, start: int, end: int) -> MapOutputSpan:
        if not 0 <= start <= end <= index.num_partitions:
            raise ValueError(
                f"partition range [{start}, {end}) is outside map output {index.name!r} "
                f"with {index.num_partitions} partitions"
            )
        return cls(index.name, start, tuple(int(o) for o in index.offsets[start : end + 1]))

    def to_dict(self) -> dict:
        return {"name": self.name, "first_partition": self.first_partition, "offsets": list(self.offsets)}

    @classmethod
    def from_dict(cls, data: dict) -> MapOutputSpan:
        return cls(data["name"], int(data["first_partition"]), tuple(int(o) for o in data["offsets"]))


def fetch_spans(
    store: ObjectStore,
    spans: Sequence[MapOutputSpan],
    schema: pa.Schema,
    *,
    threads: int = DEFAULT_FETCH_THREADS,
) -> pa.Table:
    """All rows of the spans, one ranged GET each (empty spans cost nothing), as one table."""
    return fetch_spans_counted(store, spans, schema, threads=threads)[0]


def fetch_spans_counted(
    store: ObjectStore,
    spans: Sequence[MapOutputSpan],
    schema: pa.Schema,
    *,
    threads: int = DEFAULT_FETCH_THREADS,
) -> tuple[pa.Table, list[int]]:
    """:func:`fetch_spans` and the rows each span gave, in the order of ``spans`` (for conservation)."""
    wanted = [span for span in spans if span.size > 0]

    def one(span: MapOutputSpan) -> list[pa.RecordBatch]:
        return list(read_partitions(store, span.name, span.offsets, span.first_partition, schema))

    if threads <= 1 or len(wanted) <= 1:
        parts = [one(span) for span in wanted]
    else:
        with ThreadPoolExecutor(max_workers=min(threads, len(wanted))) as pool:
            parts = list(pool.map(one, wanted))
    rows = {
        span.name: sum(batch.num_rows for batch in part) for span, part in zip(wanted, parts, strict=True)
    }
    table = pa.Table.from_batches([batch for part in parts for batch in part], schema=schema)
    return table, [rows.get(span.name, 0) for span in spans]


def fetch_range(
    store: ObjectStore,
    indexes: Sequence[MapOutputIndex],
    start: int,
    end: int,
    schema: pa.Schema,
    *,
    threads: int = DEFAULT_FETCH_THREADS,
) -> pa.Table:
    """All rows of partitions ``[start, end)`` over ``indexes``."""
    spans = [MapOutputSpan.of(index, start, end) for index in indexes]
    return fetch_spans(store, spans, schema, threads=threads)

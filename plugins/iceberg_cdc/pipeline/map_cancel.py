"""A write task cancels carryover between one partition's removed and added files before the shuffle.

Detect keeps the removed and added files of a partition (same spec id and
partition values) in one write task (:func:`~iceberg_cdc.source.planning.cancel_groups`),
because a copy-on-write rewrite copies rows within their partition. The task
reads both sides of such a partition into a :class:`CancelBuffer`, cancels
identical DELETE/INSERT rows by multiplicity
(:func:`~iceberg_cdc.changelog.carryover.cancel_carryover`: exact comparison,
or matching row lineage on format v3), and writes only the rest to its map
output. Files of a partition that only lost or only gained files stream
straight to the writer, as all files do with ``cancel_before_shuffle: false``.

**Memory stays bounded by ``cancel_memory``, not by the partition.** Rows are
held in memory while they fit; past the budget the buffer switches to hash
buckets on local disk: every row goes to bucket ``hash(key) mod B`` (key: the
identifier columns, or the whole row), ``B`` chosen from the rows seen so far
and the manifests' record counts so that a bucket is about half the budget.
Identical rows have identical keys, so they land in the same bucket, and each
bucket is cancelled on its own -- the same result as cancelling the whole
partition at once. (Copies of one row cannot be split: a bucket holding a
huge number of identical rows is held whole.) Partitions above
``shuffle.cancel_partition_max_size`` were never grouped: their carryover is
left to the shuffle, so one partition cannot make one task run far longer
than the others.

Every row is accounted for: rows in = rows out + cancelled, per operation,
and the DELETE and INSERT rows cancelled are equal in number.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from iceberg_cdc.changelog.carryover import Lineage, cancel_carryover
from iceberg_cdc.shuffle.partitioner import combined_hash, key_columns
from iceberg_cdc.shuffle.rows import OP_COLUMN, Op
from iceberg_cdc.shuffle.writer import release_memory
from iceberg_cdc.source.lineage import LINEAGE_COLUMNS, ROW_ID_COLUMN, SEQUENCE_COLUMN
from iceberg_cdc.source.planning import InputFile

MAX_BUCKETS = 1024


@dataclass(frozen=True)
class FileGroup:
    """Files a write task reads together: one partition's both sides (``cancels``), or files to stream."""

    files: tuple[InputFile, ...]
    cancels: bool


def file_groups(files: Sequence[InputFile], cancel: bool) -> list[FileGroup]:
    """The task's files by cancel group: groups with both operations cancel; the rest stream, in plan order."""
    if not cancel:
        return [FileGroup(tuple(files), False)] if files else []
    by_group: dict[str, list[InputFile]] = {}
    for f in files:
        if f.cancel_group is not None:
            by_group.setdefault(f.cancel_group, []).append(f)
    cancelling = {key for key, members in by_group.items() if {f.op for f in members} == {"DELETE", "INSERT"}}
    groups = [FileGroup(tuple(by_group[key]), True) for key in sorted(cancelling)]
    rest = tuple(f for f in files if f.cancel_group not in cancelling)
    return groups + ([FileGroup(rest, False)] if rest else [])


@dataclass
class CancelStats:
    """What a task's cancel buffers did (JSON-able; summed into the write task's figures)."""

    cancelled: dict[str, int] = field(default_factory=lambda: {"DELETE": 0, "INSERT": 0})
    by_lineage: int = 0
    groups: int = 0
    spilled_groups: int = 0
    buckets: int = 0
    spill_bytes: int = 0

    def add(self, other: CancelStats) -> None:
        for op in self.cancelled:
            self.cancelled[op] += other.cancelled[op]
        self.by_lineage += other.by_lineage
        self.groups += other.groups
        self.spilled_groups += other.spilled_groups
        self.buckets += other.buckets
        self.spill_bytes += other.spill_bytes

    @property
    def rows(self) -> int:
        return sum(self.cancelled.values())


class CancelBuffer:
    """The rows of one partition's removed and added files; :meth:`survivors` gives what is not carryover.

    ``expected_rows``: the manifests' record count of the group's files (an
    upper bound: deletes may mask some), to size the buckets. Batches may
    carry the two lineage columns (then every batch must), which never leave
    the buffer.
    """

    def __init__(
        self,
        identifier_columns: Sequence[str] | None,
        *,
        memory_bytes: int,
        expected_rows: int,
        spill_dir: str | None = None,
    ) -> None:
        if memory_bytes <= 0:
            raise ValueError(f"memory_bytes must be positive, not {memory_bytes}")
        self.identifier_columns = list(identifier_columns or []) or None
        self.memory_bytes = memory_bytes
        self.expected_rows = expected_rows
        self.spill_dir = spill_dir
        self.stats = CancelStats(groups=1)
        self._held: list[pa.RecordBatch] = []
        self._held_bytes = 0
        self._rows_seen = 0
        self._bytes_seen = 0
        self._schema: pa.Schema | None = None
        self._buckets: list[tuple[str, pa.NativeFile, pa.ipc.RecordBatchStreamWriter]] = []
        self._closed = False

    # -- input -------------------------------------------------------------------------------------

    def add(self, batch: pa.RecordBatch, op: Op) -> None:
        if self._closed:
            raise RuntimeError("the cancel buffer was already drained")
        if batch.num_rows == 0:
            return
        tagged = batch.append_column(OP_COLUMN, pa.array(np.full(batch.num_rows, int(op), dtype=np.int8)))
        if self._schema is None:
            self._schema = tagged.schema
        elif not tagged.schema.equals(self._schema):
            tagged = tagged.select(self._schema.names).cast(self._schema)
        self._rows_seen += tagged.num_rows
        self._bytes_seen += tagged.nbytes
        if self._buckets:
            self._to_buckets(tagged)
            return
        self._held.append(tagged)
        self._held_bytes += tagged.nbytes
        if self._held_bytes > self.memory_bytes:
            self._start_spilling()

    def _key(self, table: pa.Table | pa.RecordBatch) -> list[pa.Array | pa.ChunkedArray]:
        if self.identifier_columns:
            return key_columns(table, self.identifier_columns)
        return [
            table.column(name) for name in table.schema.names if name not in (OP_COLUMN, *LINEAGE_COLUMNS)
        ]

    def _start_spilling(self) -> None:
        """Too big for memory: open B bucket files and move what is held into them."""
        per_row = self._bytes_seen / max(self._rows_seen, 1)
        expected = max(self.expected_rows, self._rows_seen) * per_row * 1.1
        count = min(MAX_BUCKETS, max(2, math.ceil(expected / max(self.memory_bytes // 2, 1))))
        assert self._schema is not None
        for _ in range(count):
            fd, path = tempfile.mkstemp(prefix="cdc-cancel-", suffix=".arrow", dir=self.spill_dir)
            os.close(fd)
            sink = pa.OSFile(path, "wb")
            self._buckets.append((path, sink, pa.ipc.new_stream(sink, self._schema)))
        held, self._held, self._held_bytes = self._held, [], 0
        for batch in held:
            self._to_buckets(batch)
        del held
        release_memory()
        self.stats.spilled_groups, self.stats.buckets = 1, count

    def _to_buckets(self, batch: pa.RecordBatch) -> None:
        count = len(self._buckets)
        buckets = combined_hash(self._key(batch)) % np.uint32(count)
        order = np.argsort(buckets.astype(np.uint16) if count <= 1 << 16 else buckets, kind="stable")
        counts = np.bincount(buckets, minlength=count)
        ordered = pc.take(batch, pa.array(order), boundscheck=False)
        start = 0
        for bucket in np.flatnonzero(counts):
            end = start + int(counts[bucket])
            piece = ordered.slice(start, end - start)
            self._buckets[bucket][2].write_batch(piece)
            self.stats.spill_bytes += piece.nbytes
            start = end

    # -- output ------------------------------------------------------------------------------------

    def survivors(self) -> Iterator[tuple[pa.Table, Op]]:
        """The rows that are not carryover, as (table's columns, operation) pieces, bucket by bucket."""
        self._closed = True
        try:
            if not self._buckets:
                held, self._held = self._held, []
                if held:
                    # No contiguous copy here (a bucket gets one): in a Spark worker the copy's fresh
                    # pages cost more than the gathers over the batches save (write phase +6%).
                    yield from self._cancel(pa.Table.from_batches(held))
                return
            for _, sink, writer in self._buckets:
                writer.close()
                sink.close()
            for path, _, _ in self._buckets:
                with pa.memory_map(path) as source:
                    # One contiguous copy: the gathers that compare rows are much slower over the
                    # hundreds of pieces a bucket is written in.
                    table = pa.ipc.open_stream(source).read_all().combine_chunks()
                yield from self._cancel(table)
                del table
                os.unlink(path)
                release_memory()
        finally:
            self.close()

    def _cancel(self, table: pa.Table) -> Iterator[tuple[pa.Table, Op]]:
        if table.num_rows == 0:
            return
        inserts = table.column(OP_COLUMN).to_numpy() == Op.INSERT
        lineage = None
        if ROW_ID_COLUMN in table.schema.names:
            lineage = Lineage(table.column(ROW_ID_COLUMN), table.column(SEQUENCE_COLUMN))
        data = table.select([n for n in table.schema.names if n not in (OP_COLUMN, *LINEAGE_COLUMNS)])
        result = cancel_carryover(data, inserts, self.identifier_columns, lineage)
        kept_inserts = inserts[result.kept]
        self.stats.cancelled["DELETE"] += int((~inserts).sum()) - int((~kept_inserts).sum())
        self.stats.cancelled["INSERT"] += int(inserts.sum()) - int(kept_inserts.sum())
        self.stats.by_lineage += result.by_lineage
        if len(result.kept) == 0:
            return
        for op, rows in ((Op.DELETE, result.kept[~kept_inserts]), (Op.INSERT, result.kept[kept_inserts])):
            if len(rows):
                yield data.take(pa.array(rows)), op

    def close(self) -> None:
        """Drop held rows and bucket files (idempotent; after an error too)."""
        self._closed = True
        self._held = []
        for path, sink, writer in self._buckets:
            with contextlib.suppress(Exception):
                writer.close()
            with contextlib.suppress(Exception):
                sink.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self._buckets = []

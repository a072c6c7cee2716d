"""Map output writer: rows in, one ``NAME.data`` + ``NAME.index`` pair out.

Memory is bounded by ``buffer_bytes`` whatever the input size. Incoming
batches are tagged with their operation and partition and buffered; when the
buffer fills, it is sorted by partition and flushed as compressed blocks into
a *spill*: a local file holding the blocks of every partition in order, with
its own in-memory offsets. At commit the data object is assembled by
streaming, for each partition, that partition's bytes from every spill, so a
partition may hold several blocks (one or more per spill). A task that never
fills its buffer writes straight from memory without touching the disk.

The index is written last, after the data object is complete: it is the
commit marker. Keys are deterministic, so a retried task overwrites its own
output and a reader never mixes two attempts.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import tempfile
from dataclasses import dataclass, field
from typing import BinaryIO

import numpy as np
import pyarrow as pa

from iceberg_cdc.shuffle.codec import encode_block
from iceberg_cdc.shuffle.layout import BLOCK_HEADER, MapOutputIndex, data_key, index_key
from iceberg_cdc.shuffle.partitioner import HashPartitioner
from iceberg_cdc.shuffle.rows import Op, shuffle_schema
from iceberg_cdc.storage.base import ObjectStore

DEFAULT_BUFFER_BYTES = 128 * 1024 * 1024
DEFAULT_BLOCK_BYTES = 4 * 1024 * 1024
_COPY_CHUNK = 8 * 1024 * 1024


def _load_malloc_trim():
    """glibc's ``malloc_trim``, when available: returns freed heap pages to the OS."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _load_malloc_trim()


def release_memory() -> None:
    """Hand memory freed by a flush back to the OS.

    Without this, the compressed blocks of earlier spills (Python bytes, glibc
    heap) and Arrow's allocator caches keep RSS growing with the number of
    spills, so task memory would depend on input size after all.
    """
    pa.default_memory_pool().release_unused()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


@dataclass
class MapOutputStats:
    """What one map task did; small enough to travel through XCom."""

    name: str
    rows: dict[str, int] = field(default_factory=lambda: {"DELETE": 0, "INSERT": 0})
    input_bytes: int = 0  # Arrow bytes of the rows written
    data_bytes: int = 0  # size of NAME.data
    spills: int = 0
    partition_sizes: list[int] = field(default_factory=list)


class _Spill:
    """Blocks of every partition, in partition order, plus their offsets.

    Held in memory (``blobs``) until the writer decides to move it to disk.
    """

    def __init__(self, num_partitions: int) -> None:
        self.sizes = np.zeros(num_partitions, dtype=np.int64)
        self.blobs: list[bytes] = []
        self.path: str | None = None

    @property
    def offsets(self) -> np.ndarray:
        offsets = np.zeros(len(self.sizes) + 1, dtype=np.int64)
        np.cumsum(self.sizes, out=offsets[1:])
        return offsets

    def to_disk(self, directory: str | None) -> None:
        fd, self.path = tempfile.mkstemp(prefix="cdc-spill-", suffix=".bin", dir=directory)
        with os.fdopen(fd, "wb") as fh:
            for blob in self.blobs:
                fh.write(blob)
        self.blobs = []

    def discard(self) -> None:
        self.blobs = []
        if self.path:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            self.path = None


class MapOutputWriter:
    """Writes the map output ``name`` of one SHUFFLE_WRITE task.

    Use as a context manager: leaving the block with an exception aborts
    (deletes spills, writes nothing); :meth:`commit` publishes the output.
    """

    def __init__(
        self,
        store: ObjectStore,
        name: str,
        data_schema: pa.Schema,
        partitioner: HashPartitioner,
        *,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
        block_bytes: int = DEFAULT_BLOCK_BYTES,
        spill_dir: str | None = None,
    ) -> None:
        self.store = store
        self.name = name
        self.data_schema = data_schema
        self.schema = shuffle_schema(data_schema)
        self.partitioner = partitioner
        self.buffer_bytes = buffer_bytes
        self.block_bytes = block_bytes
        self.spill_dir = spill_dir
        self.stats = MapOutputStats(name)
        self._buffer: list[pa.RecordBatch] = []
        self._buffer_partitions: list[np.ndarray] = []
        self._buffered = 0
        self._spills: list[_Spill] = []
        self._closed = False

    # -- input ------------------------------------------------------------------------------

    def write(self, data: pa.RecordBatch | pa.Table, op: Op) -> None:
        """Add rows of one operation. ``data`` must have the data schema's columns."""
        if self._closed:
            raise RuntimeError(f"map output {self.name!r} is already closed")
        batches = data.to_batches() if isinstance(data, pa.Table) else [data]
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if not batch.schema.equals(self.data_schema):
                batch = batch.select(self.data_schema.names).cast(self.data_schema)
            # Keep each buffered piece well under the buffer so one huge batch cannot blow it.
            rows_per_piece = max(1, int(batch.num_rows * (self.buffer_bytes / 4) / max(batch.nbytes, 1)))
            for start in range(0, batch.num_rows, rows_per_piece):
                self._add(batch.slice(start, rows_per_piece), op)

    def _add(self, batch: pa.RecordBatch, op: Op) -> None:
        partitions = self.partitioner.partitions(batch)
        tagged = pa.RecordBatch.from_arrays(
            [*batch.columns, pa.array(np.full(batch.num_rows, int(op), dtype=np.int8))],
            schema=self.schema,
        )
        self._buffer.append(tagged)
        self._buffer_partitions.append(partitions)
        self._buffered += tagged.nbytes
        self.stats.rows[op.name] += batch.num_rows
        self.stats.input_bytes += batch.nbytes
        if self._buffered >= self.buffer_bytes:
            self._flush()

    # -- buffer -> spill ----------------------------------------------------------------------

    def _flush(self) -> None:
        if not self._buffer:
            return
        num_partitions = self.partitioner.num_partitions
        # Take straight from the buffered batches: no buffer-sized concatenation copy.
        buffered = pa.Table.from_batches(self._buffer, schema=self.schema)
        partitions = np.concatenate(self._buffer_partitions)
        self._buffer, self._buffer_partitions, self._buffered = [], [], 0

        # Partition ids below 2^16 sort as uint16, for which NumPy uses an O(n) radix sort
        # (10x faster than sorting int32 here).
        keys = partitions.astype(np.uint16) if num_partitions <= 1 << 16 else partitions
        order = np.argsort(keys, kind="stable")
        counts = np.bincount(partitions, minlength=num_partitions)
        ordered = buffered.take(pa.array(order))
        del buffered, order

        spill = _Spill(num_partitions)
        rows_per_block = max(1, int(ordered.num_rows * self.block_bytes / max(ordered.nbytes, 1)))
        start = 0  # first row of the current partition in `ordered`
        for partition in np.flatnonzero(counts):
            count = int(counts[partition])
            for block_start in range(start, start + count, rows_per_block):
                length = min(rows_per_block, start + count - block_start)
                for piece in ordered.slice(block_start, length).to_batches():
                    usize, compressed = encode_block(piece)
                    spill.blobs.append(BLOCK_HEADER.pack(usize, len(compressed)))
                    spill.blobs.append(compressed)
                    spill.sizes[partition] += BLOCK_HEADER.size + len(compressed)
            start += count
        del ordered
        # Earlier spills go to disk; the newest stays in memory only if it is the last one.
        for previous in self._spills:
            if previous.path is None:
                previous.to_disk(self.spill_dir)
        self._spills.append(spill)
        self.stats.spills = len(self._spills)
        release_memory()

    # -- commit ---------------------------------------------------------------------------------

    def commit(self) -> MapOutputStats:
        """Assemble and publish ``NAME.data``, then ``NAME.index``."""
        try:
            self._flush()
            num_partitions = self.partitioner.num_partitions
            sizes = np.zeros(num_partitions, dtype=np.int64)
            for spill in self._spills:
                sizes += spill.sizes
            with self.store.open_writer(data_key(self.name)) as out:
                self._assemble(out)
            index = MapOutputIndex.from_sizes(self.name, sizes)
            self.store.put(index_key(self.name), index.to_bytes())
            self.stats.data_bytes = index.data_size
            self.stats.partition_sizes = sizes.tolist()
            return self.stats
        finally:
            self.close()

    def _assemble(self, out) -> None:
        if len(self._spills) == 1 and self._spills[0].path is None:
            for blob in self._spills[0].blobs:  # already in partition order
                out.write(blob)
            return
        for spill in self._spills:
            if spill.path is None:
                spill.to_disk(self.spill_dir)
        handles: list[BinaryIO] = [open(spill.path, "rb") for spill in self._spills]  # noqa: SIM115
        try:
            offsets = [spill.offsets for spill in self._spills]
            pending = bytearray()
            for partition in range(self.partitioner.num_partitions):
                for handle, spill_offsets in zip(handles, offsets, strict=True):
                    start, end = int(spill_offsets[partition]), int(spill_offsets[partition + 1])
                    if end > start:
                        pending += os.pread(handle.fileno(), end - start, start)
                        if len(pending) >= _COPY_CHUNK:
                            out.write(bytes(pending))
                            pending.clear()
            if pending:
                out.write(bytes(pending))
        finally:
            for handle in handles:
                handle.close()

    def close(self) -> None:
        """Release buffers and spill files (idempotent)."""
        self._closed = True
        self._buffer, self._buffer_partitions = [], []
        for spill in self._spills:
            spill.discard()
        self._spills = []

    def __enter__(self) -> MapOutputWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

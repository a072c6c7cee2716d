"""Map output writer: rows in, one ``NAME.data`` + ``NAME.index`` pair out.

Memory stays bounded whatever the input size, in two stages:

* **Sort runs.** Incoming batches are tagged with their operation and
  partition and collected until ``sort_bytes`` (default 16 MiB) of Arrow
  data; then the run is ordered by partition and encoded into compressed
  blocks, one or more per partition. Runs are kept small on purpose: the
  partition-ordered gather stays in cache (a 16 MiB run writes about 40%
  faster than a 128 MiB one here).
* **Spills.** Encoded blocks wait in memory, grouped by partition, until they
  reach ``buffer_bytes`` (default 64 MiB); then they are written to a local
  spill file in partition order, with offsets kept in memory.

At commit the data object is assembled partition by partition: that
partition's bytes from every spill, then its blocks still in memory. So a
partition may hold several blocks, and a task whose blocks never fill the
buffer never touches the disk.

The index is written last, after the data object is complete: it is the
commit marker. Keys are deterministic, so a retried task overwrites its own
output and a reader never mixes two attempts.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from iceberg_cdc.libc import libc_function
from iceberg_cdc.shuffle.codec import encode_block
from iceberg_cdc.shuffle.layout import BLOCK_HEADER, MapOutputIndex, data_key, index_key
from iceberg_cdc.shuffle.partitioner import HashPartitioner
from iceberg_cdc.shuffle.rows import Op, shuffle_schema
from iceberg_cdc.storage.base import ObjectStore, ObjectWriter

DEFAULT_SORT_BYTES = 16 * 1024 * 1024
DEFAULT_BUFFER_BYTES = 64 * 1024 * 1024
DEFAULT_BLOCK_BYTES = 4 * 1024 * 1024
_COPY_CHUNK = 8 * 1024 * 1024


_MALLOC_TRIM = libc_function("malloc_trim")  # returns freed heap pages to the OS


def release_memory() -> None:
    """Hand memory freed by a spill back to the OS.

    Without this, freed blocks (Python bytes on the glibc heap) and Arrow's
    allocator caches keep RSS growing with the number of spills, so task
    memory would depend on input size after all.
    """
    pa.default_memory_pool().release_unused()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _flush(out: ObjectWriter, pending: bytearray) -> None:
    """Hand the buffered bytes to ``out`` without another copy, then empty the buffer."""
    with memoryview(pending) as view:
        out.write(view)
    pending.clear()


@dataclass
class MapOutputStats:
    """What one map task did; small enough to travel through XCom."""

    name: str
    rows: dict[str, int] = field(default_factory=lambda: {"DELETE": 0, "INSERT": 0})
    input_bytes: int = 0  # Arrow bytes of the rows written
    data_bytes: int = 0  # size of NAME.data
    sort_runs: int = 0
    spills: int = 0
    partition_sizes: list[int] = field(default_factory=list)
    partition_rows: list[int] = field(default_factory=list)  # rows per partition: read tasks check them


@dataclass
class _SpillFile:
    path: str
    offsets: np.ndarray  # P + 1 offsets of each partition's bytes in the file


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
        sort_bytes: int = DEFAULT_SORT_BYTES,
        block_bytes: int = DEFAULT_BLOCK_BYTES,
        spill_dir: str | None = None,
    ) -> None:
        self.store = store
        self.name = name
        self.data_schema = data_schema
        self.schema = shuffle_schema(data_schema)
        self.partitioner = partitioner
        self.buffer_bytes = buffer_bytes
        self.sort_bytes = min(sort_bytes, buffer_bytes)
        self.block_bytes = block_bytes
        self.spill_dir = spill_dir
        self.stats = MapOutputStats(name)
        num_partitions = partitioner.num_partitions
        self._run: list[pa.RecordBatch] = []
        self._run_partitions: list[np.ndarray] = []
        self._run_bytes = 0
        self._blocks: list[list[bytes]] = [[] for _ in range(num_partitions)]
        self._block_sizes = np.zeros(num_partitions, dtype=np.int64)
        self._partition_rows = np.zeros(num_partitions, dtype=np.int64)
        self._spills: list[_SpillFile] = []
        self._closed = False

    # -- input ----------------------------------------------------------------------------------

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
            # Slice large batches so one of them cannot overfill a sort run.
            rows = max(1, int(batch.num_rows * (self.sort_bytes / 4) / max(batch.nbytes, 1)))
            for start in range(0, batch.num_rows, rows):
                self._add(batch.slice(start, rows), op)

    def _add(self, batch: pa.RecordBatch, op: Op) -> None:
        partitions = self.partitioner.partitions(batch)
        tagged = pa.RecordBatch.from_arrays(
            [*batch.columns, pa.array(np.full(batch.num_rows, int(op), dtype=np.int8))],
            schema=self.schema,
        )
        self._run.append(tagged)
        self._run_partitions.append(partitions)
        self._run_bytes += tagged.nbytes
        self.stats.rows[op.name] += batch.num_rows
        self.stats.input_bytes += batch.nbytes
        if self._run_bytes >= self.sort_bytes:
            self._encode_run()
            if self._block_sizes.sum() >= self.buffer_bytes:
                self._spill()

    # -- sort run -> blocks -> spill ------------------------------------------------------------

    def _encode_run(self) -> None:
        """Order the current run by partition and encode it into each partition's blocks."""
        if not self._run:
            return
        num_partitions = self.partitioner.num_partitions
        run = pa.Table.from_batches(self._run, schema=self.schema)
        partitions = np.concatenate(self._run_partitions)
        self._run, self._run_partitions, self._run_bytes = [], [], 0
        # Partition ids below 2^16 sort as uint16, for which NumPy uses an O(n) radix sort.
        keys = partitions.astype(np.uint16) if num_partitions <= 1 << 16 else partitions
        order = np.argsort(keys, kind="stable")
        counts = np.bincount(partitions, minlength=num_partitions)
        self._partition_rows += counts
        ordered = pc.take(run, pa.array(order), boundscheck=False)  # a permutation: always in bounds
        del run, order
        rows_per_block = max(1, int(ordered.num_rows * self.block_bytes / max(ordered.nbytes, 1)))
        start = 0  # first row of the current partition in `ordered`
        for partition in np.flatnonzero(counts):
            end = start + int(counts[partition])
            for block_start in range(start, end, rows_per_block):
                piece = ordered.slice(block_start, min(rows_per_block, end - block_start))
                for batch in piece.to_batches():
                    usize, compressed = encode_block(batch, self.name)
                    self._blocks[partition].append(BLOCK_HEADER.pack(usize, len(compressed)))
                    self._blocks[partition].append(compressed)
                    self._block_sizes[partition] += BLOCK_HEADER.size + len(compressed)
            start = end
        self.stats.sort_runs += 1

    def _spill(self) -> None:
        """Move every block held in memory to a spill file, in partition order."""
        fd, path = tempfile.mkstemp(prefix="cdc-spill-", suffix=".bin", dir=self.spill_dir)
        self._spills.append(_SpillFile(path, MapOutputIndex.from_sizes(self.name, self._block_sizes).offsets))
        with os.fdopen(fd, "wb") as fh:
            for blocks in self._blocks:
                for blob in blocks:
                    fh.write(blob)
        self._blocks = [[] for _ in self._blocks]
        self._block_sizes[:] = 0
        self.stats.spills = len(self._spills)
        release_memory()

    # -- commit -----------------------------------------------------------------------------------

    def commit(self) -> MapOutputStats:
        """Assemble and publish ``NAME.data``, then ``NAME.index``."""
        try:
            self._encode_run()
            sizes = self._block_sizes.copy()
            for spill in self._spills:
                sizes += np.diff(spill.offsets)
            with self.store.open_writer(data_key(self.name)) as out:
                self._assemble(out)
            index = MapOutputIndex.from_sizes(self.name, sizes)
            self.store.put(index_key(self.name), index.to_bytes())
            self.stats.data_bytes = index.data_size
            self.stats.partition_sizes = sizes.tolist()
            self.stats.partition_rows = self._partition_rows.tolist()
            return self.stats
        finally:
            self.close()

    def _assemble(self, out: ObjectWriter) -> None:
        """Stream partition p's bytes from every spill, then from memory, for p = 0..P-1."""
        with contextlib.ExitStack() as stack:
            handles = [stack.enter_context(open(spill.path, "rb")) for spill in self._spills]
            pending = bytearray()
            for partition, blocks in enumerate(self._blocks):
                for handle, spill in zip(handles, self._spills, strict=True):
                    start, end = int(spill.offsets[partition]), int(spill.offsets[partition + 1])
                    if end > start:
                        pending += os.pread(handle.fileno(), end - start, start)
                for blob in blocks:
                    pending += blob
                if len(pending) >= _COPY_CHUNK:
                    _flush(out, pending)
            if pending:
                _flush(out, pending)

    def close(self) -> None:
        """Release buffers and spill files (idempotent)."""
        self._closed = True
        self._run, self._run_partitions = [], []
        self._blocks = [[] for _ in self._blocks]
        for spill in self._spills:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(spill.path)
        self._spills = []

    def __enter__(self) -> MapOutputWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

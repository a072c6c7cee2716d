"""A read range fetched to local disk, then decoded and merged a few partitions at a time.

A SHUFFLE_READ task's range spans many partitions of every map output. Holding
all of it decoded while merging made a read task's memory follow the coalesce
target (726 MB peaks at a 64 MB target). Keys never cross a partition, so the
merge may take the range piece by piece; this module makes that cheap:

1. **Fetch**: one ranged GET per map output, as before, but each body is
   streamed straight into one local spill file (``get_range_into``, at the
   span's offset in the file), so no span is ever held whole in memory.
2. **Decode by partition groups**: :meth:`FetchedRange.groups` cuts the range
   into consecutive partitions of about ``merge_bytes`` compressed bytes (a
   partition larger than that is a group of its own), and
   :meth:`FetchedRange.read` decodes one group from every map output.

So a read task holds one group's rows at a time: its memory is bounded by the
larger of ``merge_bytes`` and the largest partition, not by the range. Rows
per map output are counted as groups are read (:attr:`FetchedRange.span_rows`)
for the conservation check.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from iceberg_cdc.errors import SHUFFLE_RETRY_HINT, CorruptShuffleError, ObjectNotFoundError, ShortObjectError
from iceberg_cdc.shuffle.codec import decode_block
from iceberg_cdc.shuffle.fetch import DEFAULT_FETCH_THREADS, MapOutputSpan
from iceberg_cdc.shuffle.layout import data_key, iter_blocks
from iceberg_cdc.shuffle.reader import in_store
from iceberg_cdc.storage.base import ObjectStore

DEFAULT_MERGE_BYTES = 16 << 20  # compressed shuffle bytes decoded and merged together


class _At:
    """A file-like sink writing at an advancing offset of a shared file (``pwrite``: no shared cursor)."""

    def __init__(self, fd: int, offset: int) -> None:
        self.fd, self.offset = fd, offset

    def write(self, data: bytes | memoryview) -> int:
        view = memoryview(data)
        while len(view):
            written = os.pwrite(self.fd, view, self.offset)
            self.offset += written
            view = view[written:]
        return len(data)


class FetchedRange:
    """One read range of every map output, on local disk; use as a context manager (deletes the file)."""

    def __init__(
        self,
        store: ObjectStore,
        spans: Sequence[MapOutputSpan],
        schema: pa.Schema,
        *,
        spill_dir: str | None = None,
        threads: int = DEFAULT_FETCH_THREADS,
    ) -> None:
        self.store, self.spans, self.schema = store, list(spans), schema
        counts = {len(s.offsets) for s in self.spans}
        firsts = {s.first_partition for s in self.spans}
        if len(counts) > 1 or len(firsts) > 1:
            raise ValueError("the spans of one read range must cover the same partitions")
        self.first_partition = firsts.pop() if firsts else 0
        self.partitions = (counts.pop() - 1) if counts else 0
        sizes = [s.size for s in self.spans]
        self._base = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.span_rows = [0] * len(self.spans)
        self.fetched_bytes = int(self._base[-1])
        self._threads = threads
        fd, self._path = tempfile.mkstemp(prefix="cdc-range-", suffix=".bin", dir=spill_dir)
        self._fd: int | None = fd

    def __enter__(self) -> FetchedRange:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path)

    # -- fetch -------------------------------------------------------------------------------------

    def _fetch_one(self, i: int) -> None:
        span = self.spans[i]
        start, end = span.offsets[0], span.offsets[-1]
        assert self._fd is not None
        try:
            self.store.get_range_into(data_key(span.name), start, end, _At(self._fd, int(self._base[i])))
        except ShortObjectError as exc:
            raise CorruptShuffleError(
                f"shuffle data {data_key(span.name)!r}, partitions {span.first_partition}.."
                f"{span.first_partition + len(span.offsets) - 2}: the object is truncated: shorter than "
                f"its index says ({exc}); rerun the snapshot from the write phase."
            ) from None
        except ObjectNotFoundError:
            raise ObjectNotFoundError(
                f"shuffle data {self.store.describe(data_key(span.name))} does not exist, though its index "
                "does: it was deleted after the write phase (a lifecycle rule, or another run's cleanup). "
                f"{SHUFFLE_RETRY_HINT}"
            ) from None

    def fetch(self) -> FetchedRange:
        """Every non-empty span into the local file, concurrently (I/O bound; one GET each)."""
        wanted = [i for i, span in enumerate(self.spans) if span.size > 0]
        if self._threads <= 1 or len(wanted) <= 1:
            for i in wanted:
                self._fetch_one(i)
        else:
            with ThreadPoolExecutor(max_workers=min(self._threads, len(wanted))) as pool:
                list(pool.map(self._fetch_one, wanted))
        return self

    # -- decode ------------------------------------------------------------------------------------

    def partition_sizes(self) -> np.ndarray:
        """Compressed bytes of each partition of the range, over every map output."""
        sizes = np.zeros(self.partitions, dtype=np.int64)
        for span in self.spans:
            sizes += np.diff(np.asarray(span.offsets, dtype=np.int64))
        return sizes

    def groups(self, merge_bytes: int = DEFAULT_MERGE_BYTES) -> list[tuple[int, int]]:
        """Consecutive partitions ``[lo, hi)`` (relative to the range) of about ``merge_bytes`` each.

        Empty partitions join their neighbours; a partition above the budget
        is a group of its own. Keys never cross partitions, so any grouping
        merges to the same changes.
        """
        out: list[tuple[int, int]] = []
        lo, held = 0, 0
        for p, size in enumerate(self.partition_sizes().tolist()):
            if held and held + size > merge_bytes:
                out.append((lo, p))
                lo, held = p, 0
            held += size
        if held:
            out.append((lo, self.partitions))
        return out

    def read(self, lo: int, hi: int) -> pa.Table:
        """Rows of partitions ``[lo, hi)`` (relative to the range) of every map output, in span order."""
        assert self._fd is not None
        batches: list[pa.RecordBatch] = []
        for i, span in enumerate(self.spans):
            offsets = [int(o) for o in span.offsets[lo : hi + 1]]
            length = offsets[-1] - offsets[0]
            if length == 0:
                continue
            raw = os.pread(self._fd, length, int(self._base[i]) + offsets[0] - int(span.offsets[0]))
            first = span.first_partition + lo
            try:
                for block in iter_blocks(span.name, memoryview(raw), offsets, first):
                    batch = decode_block(span.name, block, self.schema)
                    self.span_rows[i] += batch.num_rows
                    batches.append(batch)
            except CorruptShuffleError as exc:
                raise in_store(self.store, exc) from None
        return pa.Table.from_batches(batches, schema=self.schema)

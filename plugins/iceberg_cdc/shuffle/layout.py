"""Byte layout of a map output, as fixed by the public contract.

A map output is two objects side by side:

* ``NAME.data`` -- partitions 0..P-1 one after the other, each a sequence of
  blocks ``[uncompressed size: u32 BE][compressed size: u32 BE][LZ4 block]``;
* ``NAME.index`` -- P + 1 big-endian signed 64-bit offsets, the first 0 and the
  last the size of ``NAME.data``; partition p is bytes ``[off[p], off[p+1])``.

The index is written after the data object and is the map output's commit
marker: a reader never looks at a data object whose index does not exist.
This mirrors Spark's ``IndexShuffleBlockResolver``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from iceberg_cdc.errors import CorruptShuffleError

DATA_SUFFIX = ".data"
INDEX_SUFFIX = ".index"

BLOCK_HEADER = struct.Struct(">II")
BLOCK_HEADER_SIZE = BLOCK_HEADER.size
MAX_BLOCK_SIZE = 0xFFFFFFFF


def data_key(name: str) -> str:
    return name + DATA_SUFFIX


def index_key(name: str) -> str:
    return name + INDEX_SUFFIX


@dataclass(frozen=True)
class MapOutputIndex:
    """The P + 1 offsets of one map output."""

    name: str
    offsets: np.ndarray  # int64, length P + 1

    @property
    def num_partitions(self) -> int:
        return len(self.offsets) - 1

    @property
    def data_size(self) -> int:
        return int(self.offsets[-1])

    def partition_sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    def byte_range(self, start: int, end: int) -> tuple[int, int]:
        """Bytes of partitions ``[start, end)``: contiguous, so one ranged GET reads them."""
        return int(self.offsets[start]), int(self.offsets[end])

    def to_bytes(self) -> bytes:
        return self.offsets.astype(">i8").tobytes()

    @classmethod
    def from_sizes(cls, name: str, sizes: Sequence[int] | np.ndarray) -> MapOutputIndex:
        offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(np.asarray(sizes, dtype=np.int64), out=offsets[1:])
        return cls(name, offsets)

    @classmethod
    def from_bytes(
        cls,
        name: str,
        raw: bytes,
        num_partitions: int | None = None,
        data_size: int | None = None,
    ) -> MapOutputIndex:
        """Decode and validate an index object.

        ``num_partitions`` and ``data_size`` (from a LIST of the data object),
        when known, are checked too, so a stale or truncated index is caught
        before any data is read.
        """
        where = index_key(name)
        if len(raw) % 8 != 0 or len(raw) < 16:
            raise CorruptShuffleError(
                f"shuffle index {where!r} is {len(raw)} bytes; expected a whole number of "
                "8-byte offsets (at least 2). The object is truncated or not a shuffle index: "
                "rerun the snapshot from the write phase."
            )
        offsets = np.frombuffer(raw, dtype=">i8").astype(np.int64)
        if num_partitions is not None and len(offsets) != num_partitions + 1:
            raise CorruptShuffleError(
                f"shuffle index {where!r} has {len(offsets) - 1} partitions; the plan expects "
                f"{num_partitions}. It was written by another plan: rerun the snapshot from the "
                "write phase."
            )
        if offsets[0] != 0:
            raise CorruptShuffleError(
                f"shuffle index {where!r} starts at offset {offsets[0]}, not 0: rerun the "
                "snapshot from the write phase."
            )
        steps = np.diff(offsets)
        if (steps < 0).any():
            bad = int(np.argmax(steps < 0))
            raise CorruptShuffleError(
                f"shuffle index {where!r}: partition {bad} has negative size "
                f"({offsets[bad]} -> {offsets[bad + 1]}): rerun the snapshot from the write phase."
            )
        if data_size is not None and offsets[-1] != data_size:
            raise CorruptShuffleError(
                f"shuffle index {where!r} ends at {offsets[-1]} but {data_key(name)!r} is "
                f"{data_size} bytes: the data object is truncated or from another attempt; "
                "rerun the snapshot from the write phase."
            )
        return cls(name, offsets)


@dataclass(frozen=True)
class RawBlock:
    partition: int
    uncompressed_size: int
    compressed: memoryview


def iter_blocks(
    name: str, buf: memoryview, partition_offsets: Sequence[int], first_partition: int
) -> Iterator[RawBlock]:
    """Walk the blocks of consecutive partitions held in ``buf``.

    ``partition_offsets`` are the index offsets of partitions
    ``first_partition .. first_partition + k`` (k + 1 values) and ``buf`` holds
    bytes ``[partition_offsets[0], partition_offsets[-1])`` of the data object.
    Every block must end exactly on its partition's boundary; anything else is
    reported as corruption naming the object and the partition.
    """
    base = partition_offsets[0]
    if len(buf) != partition_offsets[-1] - base:
        raise CorruptShuffleError(
            f"shuffle data {data_key(name)!r}: read {len(buf)} bytes for partitions "
            f"{first_partition}..{first_partition + len(partition_offsets) - 2}, expected "
            f"{partition_offsets[-1] - base}: the object is truncated; rerun the snapshot "
            "from the write phase."
        )
    for i in range(len(partition_offsets) - 1):
        partition = first_partition + i
        pos = partition_offsets[i] - base
        end = partition_offsets[i + 1] - base
        while pos < end:
            if end - pos < BLOCK_HEADER_SIZE:
                raise CorruptShuffleError(
                    f"shuffle data {data_key(name)!r}, partition {partition}: {end - pos} "
                    f"trailing bytes at offset {base + pos} are too short for a block header; "
                    "rerun the snapshot from the write phase."
                )
            usize, csize = BLOCK_HEADER.unpack_from(buf, pos)
            pos += BLOCK_HEADER_SIZE
            if csize > end - pos:
                raise CorruptShuffleError(
                    f"shuffle data {data_key(name)!r}, partition {partition}: block at offset "
                    f"{base + pos - BLOCK_HEADER_SIZE} claims {csize} compressed bytes but only "
                    f"{end - pos} remain in the partition; rerun the snapshot from the write phase."
                )
            yield RawBlock(partition, usize, buf[pos : pos + csize])
            pos += csize

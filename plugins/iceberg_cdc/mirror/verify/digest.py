"""Order-independent digests of a table's rows, per bucket of the key, in NumPy.

Each compared column is first put in its canonical form (:mod:`.canonical`):
fixed-width values as int64 (floats as their bits, NaN made one NaN),
everything else as bytes. A fixed-width value enters the row's hash as its own
64 bits (the fold, SplitMix64 of ``acc * 31 + value``, is a bijection in the
value, so changing one fixed-width value always changes the row's hash) and, for bytes, two independent 31-bit Murmur3 hashes (Iceberg's own,
``pyiceberg-core``, in Rust) of the value and of the value with a salt
appended (:func:`_bytes_hash`); a decimal is its two 64-bit halves. A row's hash folds its columns' hashes
in column order.

A bucket's digest is the count of its rows and the sum of their hashes modulo
2^64, so it does not depend on the order rows are read in, and two sides
whose digests agree in every bucket hold the same multiset of rows except
with probability about 2^-60 per differing row. The bucket of a row is a hash
of its key columns only, so a row that moved or changed stays in one bucket
on both sides and the buckets that differ name where to look.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg_core.transform import bucket

_HASH_SPACE = 2**31 - 1
_NULL = np.uint64(0x9AE16A3B2F90404F)
_SALT = b"\x00cdc-verify"
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_SEED = np.uint64(0x243F6A8885A308D3)


def splitmix64(values: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer over uint64 values: a bijection whose every input bit moves every output bit.

    In place on one copy (one temporary): at 5 M rows a pass per operation is what it costs.
    """
    z = values.astype(np.uint64, copy=True)
    t = np.empty_like(z)
    with np.errstate(over="ignore"):
        z += _GOLDEN
        np.right_shift(z, np.uint64(30), out=t)
        z ^= t
        z *= np.uint64(0xBF58476D1CE4E5B9)
        np.right_shift(z, np.uint64(27), out=t)
        z ^= t
        z *= np.uint64(0x94D049BB133111EB)
        np.right_shift(z, np.uint64(31), out=t)
        z ^= t
    return z


def _bytes_hash(array: pa.Array) -> np.ndarray:
    """Two independent 31-bit Murmur3 hashes of each value (Iceberg's own, in Rust): of it and of it salted.

    One call covers every bytes column of a batch (:func:`fold` concatenates
    them): ``pyiceberg-core``'s ``bucket`` costs a fixed overhead per call, and
    per value about 0.1 µs -- half of what a NumPy tabulation hash of the bytes
    cost here.
    """
    salted = pc.binary_join_element_wise(array, pa.scalar(_SALT, array.type), pa.scalar(b"", array.type))
    high = bucket(array, _HASH_SPACE).fill_null(0).to_numpy().astype(np.uint64)
    low = bucket(salted, _HASH_SPACE).fill_null(0).to_numpy().astype(np.uint64)
    return splitmix64((high << np.uint64(32)) | low)


def value_hashes(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """One 64-bit word per value of a canonical column (int64, bytes or a decimal's 128 bits); nulls a constant.

    Fixed-width values are their own bits (the row's fold mixes them): two
    different int64 never give the same word. Bytes are hashed; a decimal's
    halves are combined.
    """
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if pa.types.is_fixed_size_binary(array.type) and array.type.byte_width == 16:  # a decimal's 128 bits
        halves = np.frombuffer(array.buffers()[1], dtype=np.uint64)[
            2 * array.offset : 2 * (array.offset + len(array))
        ]
        with np.errstate(over="ignore"):
            words = splitmix64(halves[0::2]) + halves[1::2]
    elif pa.types.is_int64(array.type):
        words = array.fill_null(0).to_numpy(zero_copy_only=False).view(np.uint64).copy()
    elif pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type):
        words = _bytes_hash(array)
    elif pa.types.is_null(array.type):
        return np.full(len(array), _NULL, dtype=np.uint64)
    else:
        raise TypeError(f"not a canonical column: {array.type} (expected int64, binary or fixed[16])")
    if array.null_count:
        words[np.asarray(array.is_null())] = _NULL
    return words


def _is_bytes(array: pa.Array) -> bool:
    return pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type)


def _lengths(array: pa.Array) -> np.ndarray:
    """Each value's byte length, -1 for null: with them a row's values joined end to end are unambiguous."""
    lengths = pc.binary_length(array).fill_null(-1).to_numpy().astype(np.int64)
    return lengths


def fold(columns: Sequence[pa.Array | pa.ChunkedArray], rows: int) -> np.ndarray:
    """One 64-bit hash per row over ``columns`` in order (position matters: (a, b) != (b, a)).

    A row's bytes values are joined end to end and hashed once (two Murmur3
    calls per batch, not two per column: the per-value cost dominates), and
    their lengths (-1 for null) folded in with the fixed-width columns, which
    makes the join unambiguous.
    """
    arrays = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in columns]
    texts = [a.cast(pa.large_binary()) for a in arrays if _is_bytes(a)]
    acc = np.full(rows, _SEED, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for array in arrays:
            if _is_bytes(array):
                acc = splitmix64(acc * np.uint64(31) + _lengths(array).view(np.uint64))
            else:
                acc = splitmix64(acc * np.uint64(31) + value_hashes(array))
        if texts:
            empty = pa.scalar(b"", pa.large_binary())
            joined = (
                pc.binary_join_element_wise(*texts, empty, null_handling="replace", null_replacement=b"")
                if len(texts) > 1
                else texts[0].fill_null(empty)
            )
            acc = splitmix64(acc * np.uint64(31) + _bytes_hash(joined))
    return acc


def bucket_of(key_hashes: np.ndarray, buckets: int) -> np.ndarray:
    """The bucket of each row from its key hash (the high bits: the low ones also feed the row hash)."""
    return ((key_hashes >> np.uint64(16)) % np.uint64(buckets)).astype(np.int64)


def bucket_count(rows: int) -> int:
    """About 1,000 rows per bucket, a power of two between 16 and 65,536: a drift re-reads few rows."""
    target = max(rows // 1000, 1)
    return int(min(max(1 << (target - 1).bit_length(), 16), 65536))


@dataclass
class Digests:
    """Rows and the sum of row hashes (mod 2^64) per bucket, for one side."""

    buckets: int
    counts: np.ndarray
    sums: np.ndarray
    bytes: int = 0

    @classmethod
    def empty(cls, buckets: int) -> Digests:
        return cls(buckets, np.zeros(buckets, dtype=np.int64), np.zeros(buckets, dtype=np.uint64))

    def add(self, bucket_ids: np.ndarray, row_hashes: np.ndarray) -> None:
        self.counts += np.bincount(bucket_ids, minlength=self.buckets)
        np.add.at(self.sums, bucket_ids, row_hashes)  # uint64: wraps modulo 2^64

    @property
    def rows(self) -> int:
        return int(self.counts.sum())

    def differing(self, other: Digests) -> np.ndarray:
        """The buckets whose rows differ between the two sides (sorted bucket ids)."""
        if other.buckets != self.buckets:
            raise ValueError(f"bucket counts differ: {self.buckets} and {other.buckets}")
        return np.flatnonzero((self.counts != other.counts) | (self.sums != other.sums))

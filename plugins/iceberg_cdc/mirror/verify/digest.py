"""Order-independent digests of a table's rows, per bucket of the key, in NumPy.

Each compared column is first put in its canonical form (:mod:`.canonical`):
fixed-width values as int64 (floats as their bits, NaN made one NaN),
everything else as bytes. Every value becomes one 64-bit word
(:func:`value_hashes`): a fixed-width value is its own 64 bits, a decimal its
two 64-bit halves combined, and a bytes value the word hash of
:func:`bytes_hashes` (its 8-byte words, each mixed with its position, summed,
then mixed with the length). A row's hash folds its columns' words in column
order with SplitMix64 of ``acc * 31 + word``, a bijection in the word: changing
one fixed-width value, or one 8-byte word of a bytes value, always changes
the row's hash.

Every step is a NumPy ufunc or an Arrow kernel over whole columns, which
release the GIL: the two sides of a verification hash in two threads at once
(``pyiceberg-core``'s Murmur3, which this replaced, held the GIL for most of
the work, so the sides took turns).

A bucket's digest is the count of its rows and the sum of their hashes modulo
2^64, so it does not depend on the order rows are read in, and two sides
whose digests agree in every bucket hold the same multiset of rows except
with probability about 2^-60 per differing row (64-bit row hashes, with
margin for a non-cryptographic hash not being ideal). The bucket
of a row is a hash of its key columns only, so a row that moved or changed
stays in one bucket on both sides and the buckets that differ name where to
look. Digests are compared only within one verification, between two sides
hashed by the same code: the definition may change between versions.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

_NULL = np.uint64(0x9AE16A3B2F90404F)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_SEED = np.uint64(0x243F6A8885A308D3)


def splitmix64(values: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer over uint64 values: a bijection whose every input bit moves every output bit."""
    return _mix(values.astype(np.uint64, copy=True))


def _mix(z: np.ndarray) -> np.ndarray:
    """:func:`splitmix64` in place (one temporary): at 5 M rows a pass per operation is what it costs."""
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


_MASKS = np.array([0] + [(1 << (8 * r)) - 1 for r in range(1, 8)] + [2**64 - 1], dtype=np.uint64)
_CHUNK_BYTES = 8 << 20  # the bytes hashed at once: the per-word temporaries stay a few times this
_LOOP_WORDS = 4  # up to this many words per value, a pass per word position; beyond, all words at once


def _position_keys(words: int) -> np.ndarray:
    """The key each word position is mixed with (SplitMix64 of the position): a word moved is a word changed."""
    return splitmix64(np.arange(words, dtype=np.uint64) ^ _SEED)


def _per_word(values: np.ndarray, nonempty: np.ndarray, firsts: np.ndarray, total: int) -> np.ndarray:
    """Each value's ``values`` entry repeated for each of its words: ``np.repeat``, which holds the GIL, as a cumsum.

    The steps between successive non-empty values are scattered at their
    first words and summed up (int64: exact).
    """
    kept = values[nonempty]
    steps = np.zeros(total, dtype=np.int64)
    if len(kept):
        steps[firsts[nonempty]] = np.diff(kept, prepend=0)
    return np.cumsum(steps, out=steps)


def _sums_by_position(
    unaligned: np.ndarray, starts: np.ndarray, lengths: np.ndarray, counts: np.ndarray, words: int
) -> np.ndarray:
    """The sums of :func:`bytes_hashes` for short values: one pass over all values per word position.

    A value with no word ``k`` reads it as zero (its mask), and the terms of
    the zero words it does not have are taken off at the end, at once.
    """
    keys = _position_keys(words)
    # The mask of word k of a value of L bytes is _MASKS[clip(L - 8k, 0, 8)]: one lookup at L - 8k + 8 * words.
    masks = np.concatenate([np.zeros(8 * words, dtype=np.uint64), _MASKS, np.full(8 * words, _MASKS[8])])
    sums = np.zeros(len(starts), dtype=np.uint64)
    with np.errstate(over="ignore"):
        absent = _mix(keys.copy())  # the term of a zero word at each position
        for k in range(words):
            word = unaligned[starts + 8 * k]
            word &= masks[lengths + (8 * words - 8 * k)]
            word ^= keys[k]
            sums += _mix(word)
        beyond = np.concatenate([np.cumsum(absent[::-1])[::-1], np.zeros(1, dtype=np.uint64)])
        sums -= beyond[counts]  # the zero words past each value's end
    return sums


def _sums_by_word(
    unaligned: np.ndarray, starts: np.ndarray, lengths: np.ndarray, counts: np.ndarray
) -> np.ndarray:
    """The sums of :func:`bytes_hashes` over all words of all values at once (no loop however long the values)."""
    firsts = np.cumsum(counts) - counts  # each value's first word among all
    total = int(counts.sum())
    every = np.arange(total, dtype=np.int64)
    nonempty = counts > 0
    position = every - _per_word(firsts, nonempty, firsts, total)  # a word's position in its value
    words = unaligned[_per_word(starts - 8 * firsts, nonempty, firsts, total) + 8 * every]
    words[(firsts + counts - 1)[nonempty]] &= _MASKS[(lengths - 8 * (counts - 1))[nonempty]]
    words ^= _position_keys(int(counts.max()))[position]
    terms = _mix(words)
    sums = np.zeros(total + 1, dtype=np.uint64)
    np.cumsum(terms, out=sums[1:])  # uint64: wraps modulo 2^64, and empty values sum to 0
    return sums[firsts + counts] - sums[firsts]


def bytes_hashes(array: pa.Array) -> np.ndarray:
    """One 64-bit hash per value of a binary column: its words, each mixed with its position, summed; then its length.

    A value of ``L`` bytes is read as ``ceil(L / 8)`` little-endian 8-byte
    words ``w_k`` (the last one zero-padded); its hash is
    ``splitmix64(splitmix64(S) + L)`` with ``S`` the sum modulo 2^64 of
    ``splitmix64(w_k ^ key_k)``. Each term is a bijection of its word, so
    values of one length differing in one word always hash apart. The sum
    is the same whatever order it is taken in: short values a pass per word
    position, long ones all words at once -- NumPy ufuncs over whole columns
    (no GIL held) either way, and no loop over a long value's words.
    Nulls hash like their (ignored) bytes; :func:`value_hashes` replaces them.
    """
    n = len(array)
    if not n:
        return np.empty(0, dtype=np.uint64)
    offsets = np.frombuffer(
        array.buffers()[1], dtype=np.int64 if pa.types.is_large_binary(array.type) else np.int32
    )[array.offset : array.offset + n + 1].astype(np.int64)
    if offsets[-1] - offsets[0] > _CHUNK_BYTES:  # long values: a few rows at a time
        cuts = np.searchsorted(offsets, np.arange(offsets[0], offsets[-1], _CHUNK_BYTES), side="right") - 1
        bounds = sorted({0, n, *(int(c) for c in cuts if 0 < c < n)})
        if len(bounds) > 2:
            return np.concatenate(
                [bytes_hashes(array.slice(a, b - a)) for a, b in itertools.pairwise(bounds)]
            )
    low, high = int(offsets[0]), int(offsets[-1])
    lengths = np.diff(offsets)
    counts = (lengths + 7) >> 3  # words per value
    most = int(counts.max())
    # Zeros past the end: every 8-byte read stays inside, a pass per position reads past short values.
    data = np.zeros(high - low + 8 * (min(most, _LOOP_WORDS) + 1), dtype=np.uint8)
    if high > low:
        data[: high - low] = np.frombuffer(array.buffers()[2], dtype=np.uint8)[low:high]
    unaligned = np.ndarray((len(data) - 7,), dtype="<u8", buffer=data, strides=(1,))
    starts = offsets[:-1] - low
    if most <= _LOOP_WORDS:
        sums = _sums_by_position(unaligned, starts, lengths, counts, most)
    else:
        sums = _sums_by_word(unaligned, starts, lengths, counts)
    with np.errstate(over="ignore"):
        sums = _mix(sums)
        sums += lengths.view(np.uint64)
        return _mix(sums)


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
        words = array.fill_null(0).to_numpy(zero_copy_only=False).view(np.uint64)
        words = words.copy() if array.null_count else words  # read-only: nulls are written below
    elif _is_bytes(array):
        words = bytes_hashes(array)
    elif pa.types.is_null(array.type):
        return np.full(len(array), _NULL, dtype=np.uint64)
    else:
        raise TypeError(f"not a canonical column: {array.type} (expected int64, binary or fixed[16])")
    if array.null_count:
        words[np.asarray(array.is_null())] = _NULL
    return words


def _is_bytes(array: pa.Array) -> bool:
    return pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type)


def fold_words(words: Sequence[np.ndarray], rows: int) -> np.ndarray:
    """One 64-bit hash per row over columns' :func:`value_hashes`, in order (position matters: (a, b) != (b, a))."""
    acc = np.full(rows, _SEED, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for column in words:
            acc *= np.uint64(31)
            acc += column
            _mix(acc)
    return acc


def fold(columns: Sequence[pa.Array | pa.ChunkedArray], rows: int) -> np.ndarray:
    """One 64-bit hash per row over canonical ``columns`` in order."""
    return fold_words([value_hashes(c) for c in columns], rows)


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

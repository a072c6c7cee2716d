"""Deletion vectors (format v3): a data file's deleted positions, as one Puffin blob.

A deletion vector (DV) is a ``deletion-vector-v1`` blob inside a Puffin file;
its manifest entry says where (``content_offset``, ``content_size_in_bytes``)
and for which data file (``referenced_data_file``). The blob is (spec:
"Deletion Vectors")::

    length (4 bytes, big-endian: magic + vector)
    magic  D1 D3 39 64
    vector: 64-bit Roaring bitmap, "portable" layout:
            count of 32-bit bitmaps (8 bytes, little-endian), then for each
            key (4 bytes LE, the positions' high 32 bits) and a 32-bit Roaring
            bitmap in the portable format (the low 32 bits)
    CRC-32 of magic + vector (4 bytes, big-endian)

Only the blob is read (one ranged read), never the whole Puffin file, which
may hold the DVs of many data files. Positions are decoded with numpy, one
operation per Roaring container (at most 65,536 positions each), and every
count the layout declares is checked, so a damaged blob fails with its
location instead of deleting the wrong rows.
"""

from __future__ import annotations

import zlib

import numpy as np
from pyiceberg.io import FileIO

from iceberg_cdc.errors import CorruptDeleteFileError

DV_MAGIC = b"\xd1\xd3\x39\x64"
# Roaring's portable format (RoaringFormatSpec).
_SERIAL_COOKIE_NO_RUNCONTAINER = 12346
_SERIAL_COOKIE = 12347
_NO_OFFSET_THRESHOLD = 4
_ARRAY_MAX = 4096  # a container with more values is a bitset of 8 KiB
_BITSET_BYTES = 8192


class _Reader:
    """Little-endian reads from a buffer that fail with the blob's location, never past its end."""

    def __init__(self, data: bytes, where: str) -> None:
        self.data = data
        self.where = where
        self.at = 0

    def fail(self, problem: str) -> CorruptDeleteFileError:
        return CorruptDeleteFileError(
            f"deletion vector {self.where} does not decode: {problem}. The table's delete file is "
            "damaged (truncated or overwritten); nothing was committed. Restore the file, or roll the "
            "table back to the snapshot before the one that added it."
        )

    def take(self, n: int) -> bytes:
        if n < 0 or self.at + n > len(self.data):
            raise self.fail(f"needs {n} bytes at byte {self.at}, the vector has {len(self.data)}")
        chunk = self.data[self.at : self.at + n]
        self.at += n
        return chunk

    def uint(self, n: int) -> int:
        return int.from_bytes(self.take(n), "little")

    def uint16s(self, count: int) -> np.ndarray:
        return np.frombuffer(self.take(2 * count), dtype="<u2").astype(np.int64)


def _container(reader: _Reader, is_run: bool, cardinality: int) -> np.ndarray:
    """The low 16 bits of one container's values, ascending."""
    if is_run:
        runs = reader.uint16s(2 * reader.uint(2))
        starts, lengths = runs[0::2], runs[1::2] + 1
        total = int(lengths.sum())
        # starts repeated over each run, plus 0..length-1 within it
        offsets = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        values = np.repeat(starts, lengths) + offsets
    elif cardinality > _ARRAY_MAX:
        bits = np.unpackbits(np.frombuffer(reader.take(_BITSET_BYTES), dtype=np.uint8), bitorder="little")
        values = np.flatnonzero(bits)
    else:
        values = reader.uint16s(cardinality)
    if len(values) != cardinality:
        raise reader.fail(f"a container holds {len(values)} positions, its header says {cardinality}")
    if len(values) > 1 and not (np.diff(values) > 0).all():
        raise reader.fail("a container's positions are not ascending")
    if len(values) and values[-1] > 0xFFFF:
        raise reader.fail("a run goes past its container")
    return values


def _bitmap32(reader: _Reader) -> np.ndarray:
    """One 32-bit Roaring bitmap in the portable format, as ascending int64 values."""
    cookie = reader.uint(4)
    if cookie & 0xFFFF == _SERIAL_COOKIE:
        size = (cookie >> 16) + 1
        run_flags = np.unpackbits(
            np.frombuffer(reader.take((size + 7) // 8), dtype=np.uint8), bitorder="little"
        )[:size].astype(bool)
        has_offsets = size >= _NO_OFFSET_THRESHOLD
    elif cookie == _SERIAL_COOKIE_NO_RUNCONTAINER:
        size = reader.uint(4)
        run_flags = np.zeros(size, dtype=bool)
        has_offsets = True
    else:
        raise reader.fail(f"a Roaring bitmap starts with cookie {cookie}, not a portable-format cookie")
    header = reader.uint16s(2 * size)
    keys, cardinalities = header[0::2], header[1::2] + 1
    if size > 1 and not (np.diff(keys) > 0).all():
        raise reader.fail("container keys are not ascending")
    if has_offsets:
        reader.take(4 * size)  # container offsets: the containers follow in order anyway
    parts = [
        (int(key) << 16) + _container(reader, bool(is_run), int(card))
        for key, is_run, card in zip(keys, run_flags, cardinalities, strict=True)
    ]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def decode_deletion_vector(blob: bytes, where: str) -> np.ndarray:
    """The ascending positions a ``deletion-vector-v1`` blob deletes (int64)."""
    reader = _Reader(blob, where)
    length = int.from_bytes(reader.take(4), "big")
    if length + 8 != len(blob):
        raise reader.fail(f"the blob is {len(blob)} bytes, its length field says {length + 8}")
    body = blob[4 : 4 + length]
    if body[:4] != DV_MAGIC:
        raise reader.fail(f"magic bytes {body[:4].hex()} instead of {DV_MAGIC.hex()}")
    expected_crc = int.from_bytes(blob[4 + length :], "big")
    if zlib.crc32(body) & 0xFFFFFFFF != expected_crc:
        raise reader.fail("its CRC-32 does not match")
    vector = _Reader(body[4:], where)
    parts = []
    last_key = -1
    for _ in range(vector.uint(8)):
        key = vector.uint(4)
        if key <= last_key:
            raise vector.fail("bitmap keys are not ascending")
        last_key = key
        parts.append((key << 32) + _bitmap32(vector))
    if vector.at != len(vector.data):
        raise vector.fail(f"{len(vector.data) - vector.at} bytes follow the last bitmap")
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def read_deletion_vector(
    io: FileIO, path: str, offset: int, length: int, cardinality: int | None = None
) -> np.ndarray:
    """Read one DV blob (a ranged read of ``length`` bytes at ``offset``) and decode it."""
    where = f"{path} (blob at byte {offset}, {length} bytes)"
    with io.new_input(path).open() as stream:
        stream.seek(offset)
        blob = stream.read(length)
    if len(blob) != length:
        raise _Reader(blob, where).fail(f"the file ends after {len(blob)} of the blob's bytes")
    positions = decode_deletion_vector(blob, where)
    if cardinality is not None and len(positions) != cardinality:
        raise _Reader(blob, where).fail(
            f"it holds {len(positions)} positions, its manifest entry says {cardinality}"
        )
    return positions

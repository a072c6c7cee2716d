"""Deletion-vector blobs: decoded exactly as CRoaring (through pyiceberg) reads them, or refused by name."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyiceberg.table.deletion_vector import DeletionVector, _extract_vector_payload
from pyroaring import BitMap

from cdc_devtools.format_v3 import encode_deletion_vector
from iceberg_cdc.errors import CorruptDeleteFileError
from iceberg_cdc.source.deletion_vectors import DV_MAGIC, decode_deletion_vector

# Positions that exercise every container kind: sparse arrays, dense bitsets (> 4096 in 65,536),
# runs, and positions past 2**32 (a second 32-bit bitmap).
positions = st.one_of(
    st.lists(st.integers(0, 2**20), max_size=300),
    st.builds(
        lambda start, n, extra: list(range(start, start + n)) + extra,
        st.integers(0, 2**17),
        st.integers(0, 20_000),
        st.lists(st.integers(0, 2**18), max_size=50),
    ),
    st.lists(st.integers(0, 2**34), max_size=100),
    st.builds(
        lambda seed: np.random.default_rng(seed).choice(70_000, 9_000, replace=False).tolist(),
        st.integers(0, 99),
    ),
)


def _reference(blob: bytes) -> list[int]:
    """pyiceberg's own decoder (CRoaring through pyroaring)."""
    bitmaps = DeletionVector._deserialize_bitmap(_extract_vector_payload(blob))
    return [(key << 32) + low for key, bitmap in enumerate(bitmaps) for low in bitmap]


@settings(max_examples=150, deadline=None)
@given(positions)
def test_decode_matches_croaring(deleted):
    blob = encode_deletion_vector(deleted)
    decoded = decode_deletion_vector(blob, "t.puffin")
    assert decoded.dtype == np.int64
    assert decoded.tolist() == sorted(set(deleted)) == _reference(blob)


def test_containers_without_run_optimization_decode_too():
    """A writer need not run-optimize: the no-run cookie layout (with offsets) is read as well."""
    values = [*range(0, 20_000, 3), 70_000, 70_001]
    bitmap = BitMap(values)  # pyroaring serializes it without run containers unless asked
    vector = (1).to_bytes(8, "little") + (0).to_bytes(4, "little") + bitmap.serialize()
    body = DV_MAGIC + vector
    blob = len(body).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")
    assert decode_deletion_vector(blob, "t.puffin").tolist() == values


def _reframe(vector: bytes) -> bytes:
    body = DV_MAGIC + vector
    return len(body).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda b: b[:-1], "length field says"),
        (lambda b: b[:4] + b"\x00\x00\x00\x00" + b[8:], "magic bytes"),
        (lambda b: b[:-4] + bytes(4), "CRC-32"),
        (lambda b: _reframe(b[8:-4] + b"\x00"), "follow the last bitmap"),
        (lambda b: _reframe(b[8:-8]), "needs"),
        (lambda b: _reframe((2).to_bytes(8, "little") + b[16:-4]), "needs"),
        (lambda b: _reframe(b[8:16] + b[16:20] + (99).to_bytes(4, "little") + b[24:-4]), "cookie"),
    ],
)
def test_a_damaged_blob_fails_naming_where_and_what(damage, says):
    blob = encode_deletion_vector([1, 2, 3, 100_000])
    with pytest.raises(CorruptDeleteFileError) as raised:
        decode_deletion_vector(damage(blob), "s3://w/t/data/dv-1.puffin (blob at byte 4, 40 bytes)")
    message = str(raised.value)
    assert says in message and "dv-1.puffin (blob at byte 4" in message
    assert "nothing was committed" in message


def test_the_empty_vector_deletes_nothing():
    assert decode_deletion_vector(encode_deletion_vector([]), "t.puffin").tolist() == []

"""The verification's hash of bytes values (:func:`bytes_hashes`): a function of each value alone.

Its NumPy kernel reads all of a column's 8-byte words at once, from Arrow's
buffers: a value's hash must not depend on its neighbours, the array's
offset, 32- or 64-bit offsets, or how a long column is cut into chunks; and
the changes real data makes -- one byte, a word moved, a zero byte appended
-- must change it.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iceberg_cdc.mirror.verify import digest
from iceberg_cdc.mirror.verify.digest import bytes_hashes

values = st.lists(st.binary(max_size=40), min_size=1, max_size=30)


def _each(items: list[bytes]) -> list[int]:
    return [int(bytes_hashes(pa.array([v], pa.binary()))[0]) for v in items]


@settings(max_examples=100, deadline=None)
@given(values, st.integers(0, 5), st.sampled_from([pa.binary(), pa.large_binary()]))
def test_a_value_hashes_alike_wherever_it_sits(items, skip, typ):
    alone = _each(items)
    array = pa.array([b"x" * 13] * skip + items, typ).slice(skip)
    assert bytes_hashes(array).tolist() == alone


@settings(max_examples=50, deadline=None)
@given(values, st.integers(1, 64))
def test_chunked_long_columns_hash_alike(items, chunk):
    whole = bytes_hashes(pa.array(items, pa.binary())).tolist()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(digest, "_CHUNK_BYTES", chunk)
        assert bytes_hashes(pa.array(items, pa.binary())).tolist() == whole


@settings(max_examples=100, deadline=None)
@given(values, st.sampled_from([pa.binary(), pa.large_binary()]))
def test_short_and_long_value_paths_agree(items, typ):
    """Short values are hashed a pass per word position, long ones all words at once: one hash either way."""
    array = pa.array(items, typ)
    hashes = []
    for loop_words in (0, 2, 100):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(digest, "_LOOP_WORDS", loop_words)
            hashes.append(bytes_hashes(array).tolist())
    assert hashes[0] == hashes[1] == hashes[2]


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=40), st.data())
def test_one_changed_byte_changes_the_hash(value, data):
    at = data.draw(st.integers(0, len(value) - 1))
    byte = data.draw(st.integers(0, 255).filter(lambda b: b != value[at]))
    changed = value[:at] + bytes([byte]) + value[at + 1 :]
    assert len(set(_each([value, changed]))) == 2


@settings(max_examples=100, deadline=None)
@given(st.binary(min_size=8, max_size=8), st.binary(min_size=8, max_size=8), st.binary(max_size=12))
def test_moved_words_and_trailing_zeros_change_the_hash(a, b, tail):
    variants = {a + b + tail, b + a + tail, a + b + tail + b"\x00", a + b + b"\x00" + tail}
    assert len(set(_each(sorted(variants)))) == len(variants)


def test_empty_and_long_values():
    blob = bytes(range(256)) * 300
    items = [b"", blob, b"", blob[:-1], blob[1:]]
    hashes = _each(items)
    assert hashes[0] == hashes[2]
    assert len({hashes[0], hashes[1], hashes[3], hashes[4]}) == 4
    assert bytes_hashes(pa.array(items, pa.binary())).tolist() == hashes

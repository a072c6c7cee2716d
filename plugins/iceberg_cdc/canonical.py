"""Exact, comparable forms of Arrow columns, computed a whole column at a time.

Carryover removal needs full-row equality and the partitioner needs a hash of
every value, including struct, list and map values that Arrow's hash kernels
(``dictionary_encode``, ``group_by``, ``equal``) do not accept. This module
gives each column a *comparable form*:

* primitive columns stay as they are, except floats, which become the
  integers of their bit patterns with every NaN rewritten to one canonical
  NaN: equality is then Spark's (Java's ``Double.equals``) -- every NaN equals
  every NaN whatever its payload and sign, ``-0.0`` differs from ``0.0`` --
  which IEEE comparison (NaN != NaN, -0.0 == 0.0) gets wrong on both counts;
* dictionary columns are decoded, extension columns (uuid) use their storage;
* nested columns become a binary column holding an injective byte encoding
  of each value: equal values, equal bytes; different values, different bytes.

The encoding is built with NumPy over the column's buffers, never per row:
every value is ``[tag byte]`` followed, for valid values, by its payload
(fixed-width little-endian bytes; ``u32 length + bytes`` for strings; ``u32
count + elements`` for lists and maps; the fields in order for structs).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_NULL = 0
_VALID = 1


def _is_nested(typ: pa.DataType) -> bool:
    return pa.types.is_nested(typ)


def plain(array: pa.Array | pa.ChunkedArray) -> pa.Array:
    """One chunk, dictionary decoded, extension unwrapped."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    if isinstance(array.type, pa.BaseExtensionType):  # uuid, and Python-defined extensions
        array = array.storage
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    return array


def _field_path(fields: list[pa.Field], name: str) -> list[int] | None:
    """Child indices that lead to ``name``: an exact field name first, else ``struct.rest`` recursively."""
    for index, field in enumerate(fields):
        if field.name == name:
            return [index]
    for index, field in enumerate(fields):
        if pa.types.is_struct(field.type) and name.startswith(field.name + "."):
            rest = _field_path(list(field.type), name[len(field.name) + 1 :])
            if rest is not None:
                return [index, *rest]
    return None


def column_at(data: pa.Table | pa.RecordBatch, name: str) -> pa.Array | pa.ChunkedArray:
    """The column ``name`` of ``data``, or the struct field a dotted path names.

    Iceberg allows identifier fields inside structs and names them by their
    full path (``k.a``: field ``a`` of struct column ``k``), so key columns
    are resolved here instead of with ``data.column(name)``. A column whose
    own name contains a dot wins over a path (its name is exact). A null
    parent struct gives a null value (``struct_field`` carries its validity).
    Raises ``KeyError`` naming the column when nothing matches.
    """
    path = _field_path(list(data.schema), name)
    if path is None:
        raise KeyError(name)
    column = data.column(path[0])
    for index in path[1:]:
        column = pc.struct_field(column, [index])
    return column


def comparable(array: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The column's comparable form (see the module docstring)."""
    array = plain(array)
    typ = array.type
    if _is_nested(typ):
        return encode(array)
    if pa.types.is_floating(typ):
        return _float_bits(array)
    if pa.types.is_null(typ):
        return pa.array(np.zeros(len(array), dtype=np.int8), mask=np.ones(len(array), bool))
    return array


# Java's Float.NaN / Double.NaN bit patterns (and the half-float quiet NaN): what
# Float.floatToIntBits / Double.doubleToLongBits map every NaN to.
_CANONICAL_NAN_BITS = {16: 0x7E00, 32: 0x7FC00000, 64: 0x7FF8000000000000}
_BITS_DTYPE = {16: np.uint16, 32: np.uint32, 64: np.uint64}


def _float_bits(array: pa.Array) -> pa.Array:
    """Float column as unsigned integers of its bit pattern, every NaN canonical; nulls stay null.

    Bits rather than values so that ``-0.0`` and ``0.0`` stay distinct and the
    hash kernels can group them; NaNs canonicalized so that a NaN written by
    one engine (any payload, any sign) equals a NaN written by another, as in
    Spark's carryover removal.
    """
    width = array.type.bit_width
    dtype = _BITS_DTYPE[width]
    values = array.to_numpy(zero_copy_only=False)
    if values.dtype.kind == "O":  # nulls present in a half-float column (older pyarrow)
        values = np.asarray(array.fill_null(0).to_numpy(), dtype=array.type.to_pandas_dtype())
    values = np.ascontiguousarray(values)
    bits = values.view(dtype)
    nan = np.isnan(values)
    if nan.any():
        bits = np.where(nan, dtype(_CANONICAL_NAN_BITS[width]), bits)
    mask = None if array.null_count == 0 else np.asarray(array.is_null())
    return pa.array(bits, mask=mask)


# --- byte encoding -----------------------------------------------------------------------------


def _validity(array: pa.Array) -> np.ndarray:
    if array.null_count == 0:
        return np.ones(len(array), dtype=bool)
    return np.asarray(array.is_valid())


def _rowwise_concat(parts: list[tuple[np.ndarray, np.ndarray]], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate per-row byte strings of several encoded columns, row by row.

    Each part is ``(offsets[n + 1], data)`` where row i is
    ``data[offsets[i]:offsets[i + 1]]``. Fixed-width parts (equal lengths) are
    interleaved by reshaping; variable ones by a scatter of byte positions.
    """
    lengths = [np.diff(offsets) for offsets, _ in parts]
    total = np.zeros(n, dtype=np.int64)
    for length in lengths:
        total += length
    out_offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(total, out=out_offsets[1:])
    out = np.empty(int(out_offsets[-1]), dtype=np.uint8)
    cursor = out_offsets[:-1].copy()
    rows = np.arange(n, dtype=np.int64)
    for (offsets, data), length in zip(parts, lengths, strict=True):
        if n == 0:
            break
        used = data[offsets[0] : offsets[-1]]
        if len(used) == 0:
            continue
        row_of_byte = np.repeat(rows, length)
        position = np.arange(len(used), dtype=np.int64) - (offsets[row_of_byte] - offsets[0])
        out[cursor[row_of_byte] + position] = used
        cursor += length
    return out_offsets, out


def _fixed(tag: np.ndarray, payload: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ``[tag][payload row]`` where payload is (n, width) uint8."""
    n = len(tag)
    width = payload.shape[1] + 1
    out = np.empty((n, width), dtype=np.uint8)
    out[:, 0] = tag
    out[:, 1:] = payload
    return np.arange(n + 1, dtype=np.int64) * width, out.reshape(-1)


def _u32_rows(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values.astype("<u4")).view(np.uint8).reshape(-1, 4)


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenation of ``range(start, start + count)`` for every pair, vectorized."""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    owner = np.repeat(np.arange(len(counts)), counts)
    first = np.cumsum(counts) - counts
    return starts[owner] + (np.arange(total, dtype=np.int64) - first[owner])


def _list_parts(tag: np.ndarray, counts: np.ndarray, elements: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ``[tag][u32 count][elements...]`` where each row's elements are consecutive."""
    n = len(tag)
    element_start = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=element_start[1:])
    child_offsets, child_data = _encode_parts(elements)
    head = _fixed(tag, _u32_rows(counts))
    return _rowwise_concat([head, (child_offsets[element_start], child_data)], n)


def _encode_parts(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    array = plain(array)
    typ = array.type
    n = len(array)
    valid = _validity(array)
    tag = valid.astype(np.uint8)

    if pa.types.is_null(typ):
        return np.arange(n + 1, dtype=np.int64), np.zeros(n, dtype=np.uint8)

    if pa.types.is_struct(typ):
        children = [_encode_parts(child) for child in array.flatten()]
        head = (np.arange(n + 1, dtype=np.int64), tag)
        return _rowwise_concat([head, *children], n)

    if pa.types.is_map(typ):
        # A map is a list of (key, value) entries, compared in their stored order.
        offsets = np.asarray(array.offsets, dtype=np.int64)  # absolute into keys/items
        counts = np.diff(offsets) * valid
        entries = pa.StructArray.from_arrays([array.keys, array.items], ["key", "value"])
        if np.array_equal(counts, np.diff(offsets)):
            entries = entries.slice(offsets[0], offsets[-1] - offsets[0])
        else:  # entries hidden under null maps are skipped
            entries = entries.take(pa.array(_ranges(offsets[:-1], counts)))
        return _list_parts(tag, counts, entries)

    if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
        counts = pc.fill_null(pc.list_value_length(array), 0).to_numpy(zero_copy_only=False)
        return _list_parts(tag, counts.astype(np.int64), array.flatten())  # flatten skips nulls

    if (
        pa.types.is_string(typ)
        or pa.types.is_binary(typ)
        or pa.types.is_large_string(typ)
        or (pa.types.is_large_binary(typ))
    ):
        filled = array if array.null_count == 0 else pc.if_else(valid, array, pa.scalar(b"", typ))
        filled = plain(filled)
        buffers = filled.buffers()
        off_type = np.int64 if (pa.types.is_large_string(typ) or pa.types.is_large_binary(typ)) else np.int32
        offsets = np.frombuffer(buffers[1], dtype=off_type)[filled.offset : filled.offset + n + 1].astype(
            np.int64
        )
        data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
        head = _fixed(tag, _u32_rows(np.diff(offsets)))
        return _rowwise_concat([head, (offsets, data)], n)

    if pa.types.is_fixed_size_binary(typ):
        width = typ.byte_width
        buffer = array.buffers()[1]
        raw = np.frombuffer(buffer, dtype=np.uint8)[array.offset * width : (array.offset + n) * width]
        payload = raw.reshape(n, width).copy()
        payload[~valid] = 0
        return _fixed(tag, payload)

    if pa.types.is_boolean(typ):
        values = pc.fill_null(array, False).to_numpy(zero_copy_only=False).astype(np.uint8)
        return _fixed(tag, values.reshape(n, 1))

    if pa.types.is_decimal(typ):
        width = typ.byte_width
        raw = np.frombuffer(array.buffers()[1], dtype=np.uint8)[
            array.offset * width : (array.offset + n) * width
        ]
        payload = raw.reshape(n, width).copy()
        payload[~valid] = 0
        return _fixed(tag, payload)

    # Fixed-width primitives: integers, floats (as canonical bits), dates, times, timestamps, durations.
    if pa.types.is_floating(typ):
        array = _float_bits(array)
        typ = array.type
    width = typ.bit_width // 8
    raw = np.frombuffer(array.buffers()[1], dtype=np.uint8)[array.offset * width : (array.offset + n) * width]
    payload = raw.reshape(n, width).copy()
    payload[~valid] = 0
    return _fixed(tag, payload)


def encode(array: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Injective byte encoding of every value of ``array`` as a large_binary column.

    Nulls at the top level stay null (so null == null is decided by the caller,
    as for any other column); nulls inside nested values are part of the bytes.
    """
    array = plain(array)
    offsets, data = _encode_parts(array)
    mask = None if array.null_count == 0 else pa.py_buffer(np.packbits(_validity(array), bitorder="little"))
    return pa.Array.from_buffers(
        pa.large_binary(), len(array), [mask, pa.py_buffer(offsets), pa.py_buffer(data)], array.null_count
    )

"""Each compared column in one canonical form, whichever side it was read from.

The source (pyiceberg), an Iceberg mirror (pyiceberg) and a PostgreSQL mirror
(ADBC, through the SELECT expressions of :func:`postgres_select`) hand back
the same values in different Arrow types. Before hashing, every column becomes
int64 (booleans, integers, dates, times, timestamps: their stored integer;
floats: the bits of the equal double, every NaN one NaN, -0.0 kept) or bytes
(strings, binary, fixed, uuid), 128 bits (decimals at the column's scale),
lists as :func:`iceberg_cdc.canonical.encode` of their canonical elements).

Structs and maps are stored as ``jsonb`` in PostgreSQL. No Arrow kernel
renders JSON, so for a PostgreSQL mirror those columns (only those) are
compared as canonical JSON built in Python on both sides (:func:`json_value`):
a cost per nested value, said in docs/mirrors.md. ``jsonb`` keeps no -0.0,
so inside nested values -0.0 and 0.0 are the same there.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import uuid
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    ListType,
    MapType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from iceberg_cdc import canonical as encoding
from iceberg_cdc.mirror.postgres.types import quote

_NAN_BITS = np.float64("nan").view(np.int64)


def _plain(array: pa.Array | pa.ChunkedArray) -> pa.Array:
    array = encoding.plain(array)
    if isinstance(array.type, pa.BaseExtensionType):
        array = array.storage
    return array


def _float_bits(array: pa.Array) -> pa.Array:
    values = pc.cast(array, pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False)
    bits = np.ascontiguousarray(values).view(np.int64).copy()
    bits[np.isnan(values)] = _NAN_BITS
    return pa.array(bits, mask=np.asarray(array.is_null()) if array.null_count else None)


def _as_int64(array: pa.Array) -> pa.Array:
    typ = array.type
    if pa.types.is_boolean(typ):
        return pc.cast(array, pa.int64())
    if pa.types.is_timestamp(typ):
        if typ.unit != "us":
            array = pc.cast(array, pa.timestamp("us", typ.tz))
        return array.view(pa.int64())
    if pa.types.is_time(typ):
        return pc.cast(array, pa.time64("us")).view(pa.int64())
    if pa.types.is_date(typ):
        return pc.cast(pc.cast(array, pa.date32()).view(pa.int32()), pa.int64())
    return pc.cast(array, pa.int64())


def _decimal_bits(array: pa.Array, typ: DecimalType) -> pa.Array:
    """A decimal (Arrow's, or PostgreSQL's numeric read as text) as its 128-bit value at the column's scale."""
    values = pc.cast(array, pa.decimal128(38, typ.scale))
    return pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(16), len(values), values.buffers(), offset=values.offset
    )


def encoding_is_bytes(typ: pa.DataType) -> bool:
    return (
        pa.types.is_string(typ)
        or pa.types.is_large_string(typ)
        or pa.types.is_binary(typ)
        or pa.types.is_large_binary(typ)
    )


def canonical_column(array: pa.Array | pa.ChunkedArray, typ: IcebergType) -> pa.Array:
    """``array`` (a column of Iceberg type ``typ``, as Arrow from any reader) in its canonical form."""
    array = _plain(array)
    if isinstance(typ, FloatType | DoubleType):
        return _float_bits(array)
    if isinstance(typ, DecimalType):
        return _decimal_bits(array, typ)
    if isinstance(typ, UUIDType | FixedType | BinaryType):
        return pc.cast(array, pa.binary())
    if isinstance(typ, ListType):
        offsets = array.offsets  # a slice's own offsets; .values is the whole child array
        start = offsets[0].as_py() if len(offsets) else 0
        end = offsets[-1].as_py() if len(offsets) else 0
        elements = canonical_column(array.values.slice(start, end - start), typ.element_type)
        rebuilt = pa.ListArray.from_arrays(
            pc.subtract(offsets, pa.scalar(start, offsets.type)),
            elements,
            mask=pc.is_null(array) if array.null_count else None,
        )
        return encoding.encode(rebuilt).cast(pa.binary())
    if isinstance(typ, StructType | MapType):
        return encoding.encode(array).cast(pa.binary())
    if typ.is_primitive:
        if encoding_is_bytes(array.type):
            return pc.cast(array, pa.binary())
        return _as_int64(array)
    raise TypeError(f"no canonical form for {typ}")


# ----------------------------------------------------------------------------- PostgreSQL


def postgres_select(name: str, typ: IcebergType) -> str:
    """The SELECT expression that reads a mirror column in a form :func:`canonical_column` takes."""
    column = quote(name)
    if isinstance(typ, DecimalType):
        return f"{column}::text"
    if isinstance(typ, UUIDType):
        return f"uuid_send({column})"
    if isinstance(typ, StructType | MapType):
        return f"{column}::text"
    if isinstance(typ, ListType) and isinstance(typ.element_type, DecimalType):
        return f"{column}::text[]"
    if isinstance(typ, ListType) and isinstance(typ.element_type, UUIDType):
        return (
            f"CASE WHEN {column} IS NULL THEN NULL ELSE ARRAY(SELECT uuid_send(u) FROM unnest({column}) "
            "WITH ORDINALITY AS t(u, i) ORDER BY i) END"
        )
    return column


def is_json(typ: IcebergType) -> bool:
    """Whether a PostgreSQL mirror keeps this column as ``jsonb`` (compared as canonical JSON)."""
    return isinstance(typ, StructType | MapType)


def _float_text(value: float, single: bool) -> str:
    if single:
        value = float(np.float32(value))
    if math.isnan(value):
        return "NaN"
    if value == 0:
        return "0.0"  # jsonb keeps no -0.0
    return repr(value)


def _time_text(value: Any, typ: IcebergType) -> str:
    if isinstance(typ, DateType):
        return value if isinstance(value, str) else value.isoformat()
    if isinstance(typ, TimeType):
        parsed = dt.time.fromisoformat(value) if isinstance(value, str) else value
        return parsed.isoformat(timespec="microseconds")
    parsed = dt.datetime.fromisoformat(value) if isinstance(value, str) else value
    if isinstance(typ, TimestamptzType):
        parsed = parsed.astimezone(dt.UTC)
    return parsed.isoformat(timespec="microseconds")


def _leaf(value: Any, typ: IcebergType) -> Any:
    if isinstance(typ, FloatType | DoubleType):
        return _float_text(float(value), isinstance(typ, FloatType))
    if isinstance(typ, DecimalType):
        return format(decimal.Decimal(str(value)).quantize(decimal.Decimal(1).scaleb(-typ.scale)), "f")
    if isinstance(typ, DateType | TimeType | TimestampType | TimestamptzType):
        return _time_text(value, typ)
    if isinstance(typ, UUIDType):
        if isinstance(value, bytes):
            return str(uuid.UUID(bytes=value))
        return str(uuid.UUID(str(value)))
    if isinstance(typ, BinaryType | FixedType):
        if isinstance(value, str):  # bytea in jsonb: "\\x0102"
            return value[2:] if value.startswith("\\x") else value
        return bytes(value).hex()
    if isinstance(typ, BooleanType):
        return bool(value)
    if typ.is_primitive and isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else str(value)
    return value


def _map_key(value: Any, typ: IcebergType) -> str:
    """A map key as PostgreSQL's ``jsonb_object_agg`` renders it: the key's text output."""
    if isinstance(value, str) and not isinstance(typ, BinaryType | FixedType):
        return value
    if isinstance(typ, BooleanType):
        return "true" if value else "false"
    if isinstance(typ, TimestampType | TimestamptzType) and isinstance(value, dt.datetime):
        text = value.astimezone(dt.UTC) if isinstance(typ, TimestamptzType) else value
        return str(text.isoformat(sep=" ", timespec="microseconds"))
    leaf = _leaf(value, typ)
    return leaf if isinstance(leaf, str) else json.dumps(leaf)


def json_value(value: Any, typ: IcebergType) -> Any:
    """A nested value (from Arrow's ``to_pylist`` or parsed PostgreSQL JSON) as canonical JSON data."""
    if value is None:
        return None
    if isinstance(typ, StructType):
        return {f.name: json_value(value.get(f.name), f.field_type) for f in typ.fields}
    if isinstance(typ, MapType):
        items = value.items() if isinstance(value, dict) else value
        out = {}
        for key, item in items:
            if not isinstance(value, dict):
                key = _map_key(key, typ.key_type)
            elif isinstance(typ.key_type, TimestampType | TimestamptzType):
                key = _map_key(dt.datetime.fromisoformat(key), typ.key_type)
            out[str(key)] = json_value(item, typ.value_type)
        return out
    if isinstance(typ, ListType):
        return [json_value(v, typ.element_type) for v in value]
    return _leaf(value, typ)


def json_column(array: pa.Array | pa.ChunkedArray, typ: IcebergType, *, from_postgres: bool) -> pa.Array:
    """A struct or map column as canonical JSON bytes (one Python call per value: see the module doc)."""
    values = array.to_pylist()
    if from_postgres:
        values = [None if v is None else json.loads(v, parse_float=decimal.Decimal) for v in values]
    return pa.array(
        [
            None
            if v is None
            else json.dumps(json_value(v, typ), sort_keys=True, separators=(",", ":")).encode()
            for v in values
        ],
        pa.binary(),
    )

"""Iceberg types as PostgreSQL types, and Arrow columns in a form PostgreSQL's binary COPY takes.

=====================  ==============================  ==========================================
Iceberg                PostgreSQL                      note
=====================  ==============================  ==========================================
boolean                boolean
int / long             integer / bigint
float / double         real / double precision         NaN, infinities and -0.0 kept
decimal(p, s)          numeric(p, s)
date / time            date / time                     microseconds
timestamp              timestamp                       microseconds, no time zone
timestamptz            timestamptz
string                 text
uuid                   uuid
fixed(n) / binary      bytea
list<primitive>        <element type>[]                one dimension
struct                 jsonb                           an object; fields by name
map                    jsonb                           an object; keys as text
=====================  ==============================  ==========================================

Anything else -- nanosecond timestamps (PostgreSQL keeps microseconds), a
list of lists, structs or maps, a map with nested keys or values, variant or
geometry -- is a :class:`~iceberg_cdc.errors.MirrorSchemaError` naming the
column, with the fix (``exclude_columns`` leaves it out of the mirror).

**Nested values stay vectorized.** ADBC's COPY writer takes primitives and
lists but not structs or maps, and turning a struct into JSON text in Python
would cost a call per value. So a struct is sent as its leaf columns plus a
validity column, a map as its key and value lists plus a validity column,
and PostgreSQL builds the ``jsonb`` (``jsonb_build_object``,
``jsonb_object_agg``) inside the same INSERT. :class:`LoadColumns` holds the
flat Arrow columns (named ``c0``, ``c1``, ... so no source name needs
quoting in the temporary table) and the SQL expression of each mirror column.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

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
    IntegerType,
    ListType,
    LongType,
    MapType,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from iceberg_cdc.errors import MirrorSchemaError

_PRIMITIVES: dict[type, str] = {
    BooleanType: "boolean",
    IntegerType: "integer",
    LongType: "bigint",
    FloatType: "real",
    DoubleType: "double precision",
    DateType: "date",
    TimeType: "time without time zone",
    TimestampType: "timestamp without time zone",
    TimestamptzType: "timestamp with time zone",
    StringType: "text",
    UUIDType: "uuid",
    FixedType: "bytea",
    BinaryType: "bytea",
}

# What PostgreSQL may widen in place (ALTER COLUMN ... TYPE), as Iceberg widens its own types.
_WIDER = {("integer", "bigint"), ("real", "double precision")}


def quote(name: str) -> str:
    """A PostgreSQL identifier, quoted: ``a"b`` -> ``"a""b"``."""
    return '"' + name.replace('"', '""') + '"'


def qualified(table: str) -> str:
    """``schema.name`` quoted part by part."""
    schema, name = table.split(".", 1)
    return f"{quote(schema)}.{quote(name)}"


def _fix(column: str) -> str:
    return (
        f"leave the column out of the mirror (tables[].mirrors[].exclude_columns: [{column}]) or change its "
        "type in the source"
    )


def _primitive(iceberg: IcebergType) -> str | None:
    if isinstance(iceberg, DecimalType):
        return f"numeric({iceberg.precision},{iceberg.scale})"
    return _PRIMITIVES.get(type(iceberg))


def pg_type(column: str, iceberg: IcebergType) -> str:
    """The PostgreSQL type of a mirror column (as ``format_type`` spells it), or MirrorSchemaError."""
    primitive = _primitive(iceberg)
    if primitive is not None:
        return primitive
    if isinstance(iceberg, ListType):
        element = _primitive(iceberg.element_type)
        if element is None:
            raise MirrorSchemaError(
                f"column {column!r} is {iceberg}: a PostgreSQL mirror holds lists of primitive values only "
                f"(as arrays); {_fix(column)}"
            )
        return element + "[]"
    if isinstance(iceberg, StructType | MapType):
        _check_nested(column, iceberg)
        return "jsonb"
    raise MirrorSchemaError(
        f"column {column!r} is {iceberg}, which PostgreSQL cannot hold exactly"
        + (" (it keeps microseconds, not nanoseconds)" if "ns" in str(iceberg) else "")
        + f"; {_fix(column)}"
    )


def _check_nested(column: str, iceberg: IcebergType) -> None:
    """Structs of primitives, lists of primitives, maps and structs; maps of primitive keys and values."""
    if isinstance(iceberg, StructType):
        for child in iceberg.fields:
            path = f"{column}.{child.name}"
            if isinstance(child.field_type, StructType | MapType):
                _check_nested(path, child.field_type)
            else:
                pg_type(path, child.field_type)
    elif isinstance(iceberg, MapType):
        for part, typ in (("key", iceberg.key_type), ("value", iceberg.value_type)):
            if _primitive(typ) is None:
                raise MirrorSchemaError(
                    f"column {column!r} is {iceberg}: a PostgreSQL mirror holds maps of primitive keys and "
                    f"values only (its {part} is {typ}); {_fix(column.split('.')[0])}"
                )


def widens(narrow: str, wide: str) -> bool:
    """True when a PostgreSQL column of type ``narrow`` may become ``wide`` in place (or they are equal)."""
    if narrow == wide or (narrow, wide) in _WIDER:
        return True
    if narrow.startswith("numeric(") and wide.startswith("numeric("):
        p1, s1 = (int(x) for x in narrow[8:-1].split(","))
        p2, s2 = (int(x) for x in wide[8:-1].split(","))
        return s1 == s2 and p1 <= p2
    if narrow.endswith("[]") and wide.endswith("[]"):
        return widens(narrow[:-2], wide[:-2])
    return False


@dataclass
class LoadColumns:
    """Flat Arrow columns for the temporary table, and one SQL expression per mirror column."""

    names: list[str] = field(default_factory=list)
    arrays: list[pa.Array] = field(default_factory=list)
    expressions: dict[str, str] = field(default_factory=dict)

    def add(self, array: pa.Array) -> str:
        name = f"c{len(self.names)}"
        self.names.append(name)
        self.arrays.append(array)
        return name

    def table(self) -> pa.Table:
        return pa.Table.from_arrays(self.arrays, names=self.names) if self.names else pa.table({})


def _plain(array: pa.Array, iceberg: IcebergType) -> pa.Array:
    """The column as ADBC's COPY writer takes it: dictionaries decoded, uuid as Arrow's uuid type."""
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if isinstance(iceberg, UUIDType) and not isinstance(array.type, pa.UuidType):
        storage = array.storage if isinstance(array.type, pa.BaseExtensionType) else array
        array = pa.ExtensionArray.from_storage(pa.uuid(), storage.cast(pa.binary(16)))
    elif isinstance(iceberg, FixedType) and pa.types.is_fixed_size_binary(array.type):
        array = array.cast(pa.binary())
    return array


def _load(out: LoadColumns, array: pa.Array, iceberg: IcebergType, alias: str, column: str) -> str:
    """Add ``array``'s flat columns to ``out``; returns the SQL expression that rebuilds its value."""
    if isinstance(iceberg, StructType):
        valid = out.add(pc.is_valid(array))
        children = array.flatten()  # parent nulls applied to each child
        pairs = []
        for child_field, child in zip(iceberg.fields, children, strict=True):
            expression = _load(out, child, child_field.field_type, alias, f"{column}.{child_field.name}")
            pairs.append(f"'{child_field.name.replace(chr(39), chr(39) * 2)}', {expression}")
        body = f"jsonb_build_object({', '.join(pairs)})" if pairs else "'{}'::jsonb"
        return f"CASE WHEN {alias}.{valid} THEN {body} END"
    if isinstance(iceberg, MapType):
        valid = out.add(pc.is_valid(array))
        offsets = array.offsets
        keys = out.add(pa.ListArray.from_arrays(offsets, _plain(array.keys, iceberg.key_type)))
        values = out.add(pa.ListArray.from_arrays(offsets, _plain(array.items, iceberg.value_type)))
        return (
            f"CASE WHEN {alias}.{valid} THEN (SELECT COALESCE(jsonb_object_agg(k, v), '{{}}'::jsonb) "
            f"FROM unnest({alias}.{keys}, {alias}.{values}) AS u(k, v)) END"
        )
    if isinstance(iceberg, ListType):
        values = _plain(array.values, iceberg.element_type)
        if values is not array.values:
            array = pa.ListArray.from_arrays(array.offsets, values, mask=pc.is_null(array))
        return f"{alias}.{out.add(array)}"
    return f"{alias}.{out.add(_plain(array, iceberg))}"


def load_columns(
    data: pa.Table, types: dict[str, IcebergType], alias: str = "n", cast: Callable[[str], str] | None = None
) -> LoadColumns:
    """The flat columns of ``data`` (mirror columns named in ``types``) and their SQL expressions.

    Each expression reads from the temporary table under ``alias``. Chunked
    columns are combined first, so map and list offsets start at zero.
    """
    out = LoadColumns()
    for name in data.column_names:
        column = data.column(name)
        array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        if array.offset:
            array = pa.concat_arrays([array])
        expression = _load(out, array, types[name], alias, name)
        out.expressions[name] = cast(expression) if cast else expression
    return out

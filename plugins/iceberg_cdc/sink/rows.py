"""Change rows in exactly the sink's Arrow schema: the last step before a staged Parquet file.

The merge (or an insert task) produces source columns plus ``_change_type``;
:func:`to_sink_arrow` turns them into the sink's columns, in the sink's order,
with Iceberg field ids on every field, the source columns cast to the sink's
(possibly wider) types, and the constant per-snapshot change columns
(``_change_ordinal``, ``_commit_snapshot_id``, ``_commit_timestamp``) added.
Casts are checked first (:func:`_castable`): Arrow would also parse strings
into numbers or drop struct fields, and neither may happen silently.

Rows arrive named by the processed snapshot's schema. Given that schema and
the sink's field-id mapping (:mod:`iceberg_cdc.sink.field_ids`),
:func:`to_sink_arrow` first renames them -- nested struct fields too -- to the
sink fields their source field ids map to (:func:`_sink_named`, a zero-copy
view), so a column renamed in the source since lands in the renamed sink column
and a column that took a dropped column's name does not land in the old one.

Split from :mod:`iceberg_cdc.sink.schema` (which derives and evolves the
Iceberg schema): this module only shapes rows for a schema it is given.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.schema import Schema
from pyiceberg.types import IcebergType, ListType, MapType, StructType

from iceberg_cdc.errors import SinkSchemaError
from iceberg_cdc.pyiceberg_internals.arrow_schema import to_arrow_schema
from iceberg_cdc.sink import field_ids as sink_field_ids
from iceberg_cdc.sink.columns import (
    CHANGE_ORDINAL,
    CHANGE_TYPE,
    CHANGE_TYPES,
    COMMIT_SNAPSHOT_ID,
    COMMIT_TIMESTAMP,
    FIX_CONFLICT,
)


def sink_arrow_schema(sink_schema: Schema) -> pa.Schema:
    """The sink's Arrow schema, with Iceberg field ids in every field's metadata.

    Parquet written from it carries the field ids, which is what lets the files
    be committed as they are and read back by id.
    """
    return to_arrow_schema(sink_schema, include_field_ids=True)


def _plain_type(typ: pa.DataType) -> pa.DataType:
    if pa.types.is_dictionary(typ):
        return typ.value_type
    return typ


def _is_stringish(typ: pa.DataType) -> bool:
    return pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_string_view(typ)


def _is_binaryish(typ: pa.DataType) -> bool:
    return pa.types.is_binary(typ) or pa.types.is_large_binary(typ) or pa.types.is_binary_view(typ)


def _is_listish(typ: pa.DataType) -> bool:
    return pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_list_view(typ)


def _castable(source: pa.DataType, target: pa.DataType, path: str) -> str | None:
    """Why ``source`` cannot be cast to ``target`` without changing values, or None if it can.

    Arrow's ``cast`` would also parse strings into numbers or drop struct
    fields; neither may happen silently on the way into the sink.
    """
    source = _plain_type(source)
    if pa.types.is_null(source):
        return None
    if isinstance(target, pa.BaseExtensionType):  # uuid
        if isinstance(source, pa.BaseExtensionType):
            return None if source == target else f"'{path}' is {source}, the sink has {target}"
        if pa.types.is_fixed_size_binary(source) and source.byte_width == target.storage_type.byte_width:
            return None
        return f"'{path}' is {source}, the sink has {target}"
    if isinstance(source, pa.BaseExtensionType):
        source = source.storage_type
    if pa.types.is_struct(target):
        if not pa.types.is_struct(source):
            return f"'{path}' is {source}, the sink has a struct"
        target_names = {target.field(i).name: target.field(i) for i in range(target.num_fields)}
        for i in range(source.num_fields):
            child = source.field(i)
            if child.name not in target_names:
                return (
                    f"'{path}.{child.name}' is not in the sink schema (evolve the sink with "
                    "evolve_sink_schema before writing)"
                )
            why = _castable(child.type, target_names[child.name].type, f"{path}.{child.name}")
            if why:
                return why
        return None
    if _is_listish(target):
        if not _is_listish(source) and not pa.types.is_fixed_size_list(source):
            return f"'{path}' is {source}, the sink has a list"
        return _castable(source.value_type, target.value_type, f"{path}.element")
    if pa.types.is_map(target):
        if not pa.types.is_map(source):
            return f"'{path}' is {source}, the sink has a map"
        return _castable(source.key_type, target.key_type, f"{path}.key") or _castable(
            source.item_type, target.item_type, f"{path}.value"
        )
    if source == target:
        return None
    if _is_stringish(target):
        ok = _is_stringish(source)
    elif _is_binaryish(target):
        ok = _is_binaryish(source)
    elif pa.types.is_integer(target):
        ok = pa.types.is_signed_integer(source) and source.bit_width <= target.bit_width
    elif pa.types.is_floating(target):
        ok = pa.types.is_floating(source) and source.bit_width <= target.bit_width
    elif pa.types.is_decimal(target):
        ok = (
            pa.types.is_decimal(source)
            and source.scale == target.scale
            and source.precision <= target.precision
        )
    elif pa.types.is_timestamp(target):
        ok = pa.types.is_timestamp(source) and (source.tz is None) == (target.tz is None)
    elif pa.types.is_time(target):
        ok = pa.types.is_time(source)
    elif pa.types.is_date(target):
        ok = pa.types.is_date(source)
    else:
        ok = False
    return None if ok else f"'{path}' is {source}, the sink has {target}"


def to_sink_arrow(
    changes: pa.Table,
    sink_schema: Schema,
    ordinal: int,
    snapshot_id: int,
    commit_timestamp_ms: int | None = None,
    *,
    source_schema: Schema | None = None,
    field_ids: Mapping[int, int] | None = None,
) -> pa.Table:
    """Change rows in exactly the sink's Arrow schema, field ids included.

    ``changes`` is the merge output: source columns plus ``_change_type``. The
    result has every sink column in the sink's order: source columns cast to the
    sink's (wider) types, sink columns the source no longer has filled with null,
    and the constant ``_change_ordinal``, ``_commit_snapshot_id`` and
    ``_commit_timestamp`` added. ``commit_timestamp_ms`` is the source snapshot's
    ``timestamp-ms``; it is required when the sink has ``_commit_timestamp`` (a
    sink from before that column existed, not yet evolved, does not).

    With ``field_ids`` (the sink's mapping) the columns are matched to sink
    columns by the field ids ``source_schema`` (the snapshot's schema, which
    names the columns of ``changes``) gives them; without it, by name.
    """
    target = sink_arrow_schema(sink_schema)
    if field_ids is not None:
        if source_schema is None:
            raise ValueError("field_ids need the source_schema that names the columns of changes")
        changes = _sink_named(changes, source_schema, sink_schema, sink_field_ids.reverse(field_ids))
    names = set(changes.column_names)
    for name in (CHANGE_ORDINAL, COMMIT_SNAPSHOT_ID, COMMIT_TIMESTAMP):
        if name in names:
            raise ValueError(f"changes must not carry '{name}': it is set from the commit's arguments")
    if CHANGE_TYPE not in names:
        raise ValueError(f"changes have no '{CHANGE_TYPE}' column; pass the merge output")
    unknown = [n for n in changes.column_names if target.get_field_index(n) < 0]
    if unknown:
        raise SinkSchemaError(
            f"column(s) {', '.join(repr(n) for n in unknown)} of the changes are not in the sink "
            "schema; evolve the sink (evolve_sink_schema / ensure_sink_table) before writing"
        )
    constants: dict[str, object] = {CHANGE_ORDINAL: ordinal, COMMIT_SNAPSHOT_ID: snapshot_id}
    if target.get_field_index(COMMIT_TIMESTAMP) >= 0:
        if commit_timestamp_ms is None:
            raise ValueError(
                f"the sink has '{COMMIT_TIMESTAMP}': pass commit_timestamp_ms, the source snapshot's "
                "timestamp-ms"
            )
        constants[COMMIT_TIMESTAMP] = commit_timestamp_ms * 1000  # timestamptz: microseconds, UTC
    rows = changes.num_rows
    arrays: list[pa.ChunkedArray | pa.Array] = []
    for target_field in target:
        name = target_field.name
        if name in constants:
            arrays.append(pa.repeat(pa.scalar(constants[name], target_field.type), rows))
            continue
        if name not in names:
            if not target_field.nullable:
                raise SinkSchemaError(
                    f"sink column '{name}' is required but the changes do not have it; "
                    "evolve the sink (evolve_sink_schema makes dropped columns optional)"
                )
            arrays.append(pa.nulls(rows, target_field.type))
            continue
        column = changes.column(name)
        why = _castable(column.type, target_field.type, name)
        if why:
            raise SinkSchemaError(f"cannot write the changes to the sink: {why}; {FIX_CONFLICT}")
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        if not column.type.equals(target_field.type, check_metadata=True):
            # Also when only child metadata differs: the cast puts the field ids on nested fields.
            column = column.cast(target_field.type)
        if not target_field.nullable and column.null_count:
            raise SinkSchemaError(
                f"sink column '{name}' is required but {column.null_count} change rows have null in it"
            )
        arrays.append(column)
    _check_change_types(arrays[target.get_field_index(CHANGE_TYPE)])
    return pa.Table.from_arrays(arrays, schema=target)


def _sink_named(changes: pa.Table, source: Schema, sink: Schema, by_source: Mapping[int, int]) -> pa.Table:
    """``changes`` with every column and nested struct field renamed to its sink field's name, by field id."""
    source_struct, sink_struct = source.as_struct(), sink.as_struct()
    names: list[str] = []
    columns: list[pa.ChunkedArray] = []
    for name, column in zip(changes.column_names, changes.columns, strict=True):
        if name == CHANGE_TYPE:
            names.append(name)
            columns.append(column)
            continue
        source_field = source_struct.field_by_name(name, case_sensitive=True)
        if source_field is None:
            raise SinkSchemaError(f"column '{name}' of the changes is not in the snapshot's schema")
        sink_field = _mapped(sink_struct, source_field.field_id, by_source, name)
        typ = _renamed(column.type, source_field.field_type, sink_field.field_type, by_source, name)
        if typ != column.type:
            column = pa.chunked_array([chunk.view(typ) for chunk in column.chunks], type=typ)
        names.append(sink_field.name)
        columns.append(column)
    return pa.Table.from_arrays(columns, names=names)


def _mapped(sink: StructType, source_id: int, by_source: Mapping[int, int], path: str):
    sink_id = by_source.get(source_id)
    found = next((f for f in sink.fields if f.field_id == sink_id), None) if sink_id is not None else None
    if found is None:
        raise SinkSchemaError(
            f"'{path}' (source field id {source_id}) has no column in the sink schema; evolve the sink "
            "(evolve_sink_schema / ensure_sink_table) before writing"
        )
    return found


def _renamed(
    typ: pa.DataType, source: IcebergType, sink: IcebergType, by_source: Mapping[int, int], path: str
) -> pa.DataType:
    """``typ`` with struct field names replaced by the sink's; the physical layout is unchanged."""
    if pa.types.is_struct(typ) and isinstance(source, StructType) and isinstance(sink, StructType):
        fields = []
        for i in range(typ.num_fields):
            child = typ.field(i)
            source_field = source.field_by_name(child.name, case_sensitive=True)
            if source_field is None:
                raise SinkSchemaError(f"'{path}.{child.name}' of the changes is not in the snapshot's schema")
            sink_field = _mapped(sink, source_field.field_id, by_source, f"{path}.{child.name}")
            inner = _renamed(
                child.type, source_field.field_type, sink_field.field_type, by_source, f"{path}.{child.name}"
            )
            fields.append(pa.field(sink_field.name, inner, child.nullable, child.metadata))
        return pa.struct(fields)
    if (
        isinstance(source, ListType)
        and isinstance(sink, ListType)
        and (pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ))
    ):
        value = typ.value_field
        inner = value.with_type(
            _renamed(value.type, source.element_type, sink.element_type, by_source, f"{path}.element")
        )
        if pa.types.is_large_list(typ):
            return pa.large_list(inner)
        if pa.types.is_fixed_size_list(typ):
            return pa.list_(inner, typ.list_size)
        return pa.list_(inner)
    if pa.types.is_map(typ) and isinstance(source, MapType) and isinstance(sink, MapType):
        item = typ.item_field
        inner = item.with_type(
            _renamed(item.type, source.value_type, sink.value_type, by_source, f"{path}.value")
        )
        return pa.map_(typ.key_field, inner, typ.keys_sorted)
    return typ


def _check_change_types(column: pa.ChunkedArray | pa.Array) -> None:
    valid = pc.is_in(column, value_set=pa.array(CHANGE_TYPES, column.type))
    if column.null_count or not pc.all(valid, min_count=0).as_py():
        bad = pc.unique(pc.filter(column, pc.invert(pc.fill_null(valid, False)))).to_pylist()
        raise ValueError(
            f"'{CHANGE_TYPE}' must be one of {', '.join(CHANGE_TYPES)}; found {bad[:5]!r}"
            + (" and nulls" if column.null_count else "")
        )

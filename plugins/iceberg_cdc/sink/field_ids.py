"""Which sink field holds which source field: the sink's durable field-id mapping.

The sink has its own field ids (the catalog assigns them), so following the
source's renames needs a record of which sink field stands for which source
field. It is kept in the sink's table property :data:`PROPERTY` and covers every
source-derived field, nested ones too (struct fields, a list's element, a map's
key and value). The change columns are not in it; neither are history columns
of a legacy sink that no source field maps to any more.

Format (versioned, compact, sorted by sink id)::

    cdc.source-field-ids = 1:1=1,2=2,5=3

i.e. ``<version>:<sink id>=<source id>,...``. The property is only ever written in
the commit that changes the sink's schema (:mod:`iceberg_cdc.sink.schema`) or
creates the sink (:mod:`iceberg_cdc.sink.table`), so schema and mapping never
disagree after a crash.

A sink without the property (made before it existed) is paired by *name*
against the source's current schema on its first evolution
(:func:`pair_by_name`); sink columns whose name no source column has any more
stay unmapped history.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyiceberg.types import IcebergType, ListType, MapType, NestedField, StructType

from iceberg_cdc.errors import SinkSchemaError

PROPERTY = "cdc.source-field-ids"
VERSION = 1

FieldIds = dict[int, int]  # sink field id -> source field id


def encode(mapping: Mapping[int, int]) -> str:
    """The property value for ``mapping`` (sink id -> source id)."""
    return f"{VERSION}:" + ",".join(f"{sink}={source}" for sink, source in sorted(mapping.items()))


def read(properties: Mapping[str, str]) -> FieldIds | None:
    """The mapping stored in a sink's properties, or None for a sink that has none yet.

    A value that cannot be parsed was edited by hand or written by a newer
    release: that is an error, because guessing would put values under the
    wrong columns.
    """
    value = properties.get(PROPERTY)
    return None if value is None else decode(value)


def decode(value: str) -> FieldIds:
    """Parse a :data:`PROPERTY` value (as stored in the sink, or carried in a snapshot plan)."""
    fix = (
        f"remove the sink table property '{PROPERTY}' (the next run pairs the sink's columns with the "
        "source's by name again), or upgrade the pipeline if a newer release wrote it"
    )
    version, sep, body = value.partition(":")
    if not sep or version != str(VERSION):
        raise SinkSchemaError(f"the sink's '{PROPERTY}' has version {version!r}, expected {VERSION}; {fix}")
    mapping: FieldIds = {}
    try:
        for pair in filter(None, body.split(",")):
            sink, source = pair.split("=")
            mapping[int(sink)] = int(source)
    except ValueError:
        raise SinkSchemaError(
            f"the sink's '{PROPERTY}' is not '<sink id>=<source id>,...': {value!r}; {fix}"
        ) from None
    check_one_to_one(mapping)
    return mapping


def check_one_to_one(mapping: Mapping[int, int]) -> None:
    """Two sink fields for one source field would silently merge or split its values."""
    seen: dict[int, int] = {}
    for sink, source in sorted(mapping.items()):
        if source in seen:
            raise SinkSchemaError(
                f"the sink's '{PROPERTY}' maps source field id {source} to two sink fields "
                f"({seen[source]} and {sink}); remove the property to pair the columns by name again"
            )
        seen[source] = sink


def reverse(mapping: Mapping[int, int]) -> dict[int, int]:
    """Source field id -> sink field id."""
    check_one_to_one(mapping)
    return {source: sink for sink, source in mapping.items()}


def pair_fields(sink: NestedField, source: NestedField) -> FieldIds:
    """The mapping of a sink field made from ``source`` (same shape): it and all its nested fields."""
    pairs = {sink.field_id: source.field_id}
    pairs.update(_pair_types(sink.field_type, source.field_type))
    return pairs


def pair_by_name(sink: StructType, source: StructType, skip: tuple[str, ...] = ()) -> FieldIds:
    """Pair fields of equal name (case-sensitive), recursively; ``skip`` are top-level sink names to leave out.

    Used for sinks made before the mapping existed and for a sink just created
    from the source schema (where every name matches). A pair whose kinds differ
    (struct vs primitive) is still paired at the top, so the type conflict is
    reported by the planner instead of the column being treated as new.
    """
    pairs: FieldIds = {}
    for source_field in source.fields:
        if source_field.name in skip:
            continue
        sink_field = sink.field_by_name(source_field.name, case_sensitive=True)
        if sink_field is not None:
            pairs.update(pair_fields(sink_field, source_field))
    return pairs


def _pair_types(sink: IcebergType, source: IcebergType) -> FieldIds:
    if isinstance(sink, StructType) and isinstance(source, StructType):
        return pair_by_name(sink, source)
    if isinstance(sink, ListType) and isinstance(source, ListType):
        return pair_fields(sink.element_field, source.element_field)
    if isinstance(sink, MapType) and isinstance(source, MapType):
        return {
            **pair_fields(sink.key_field, source.key_field),
            **pair_fields(sink.value_field, source.value_field),
        }
    return {}

"""The sink table's schema: derived from the source's, and kept following it.

The sink holds every source column (same names, types, nullability, nested
types and docs) followed by three change columns:

* ``_change_type`` -- ``INSERT``, ``DELETE``, ``UPDATE_BEFORE`` or ``UPDATE_AFTER``;
* ``_change_ordinal`` -- one value per source snapshot, increasing along the
  source's history (consumers read "everything after ordinal N");
* ``_commit_snapshot_id`` -- the source snapshot the row comes from.

The source schema changes over time and the sink follows it without manual
steps (:func:`evolve_sink_schema`):

* **Added columns** (top level or nested) are added to the sink, always
  optional because the rows already in the sink do not have them; new top-level
  columns are placed before ``_change_type`` so the change columns stay last.
* **Widened types** (``int -> long``, ``float -> double``, a decimal's precision)
  are widened in the sink. A sink column that is already wider stays as it is
  and new rows are cast up when they are written.
* **Dropped columns stay in the sink**: old rows keep their values, new rows get
  null. A dropped column that was required is made optional for that reason.
* **Renames are not followed**: the sink matches columns by *name* (the source's
  field ids mean nothing in the sink, which has its own). A renamed source
  column therefore shows up as a new sink column; the old one stays and is null
  in new rows.
* **Anything else is a conflict** -- a sink column whose type cannot hold the
  source's (``string`` vs ``long``, a struct vs a primitive, a changed map key):
  :class:`~iceberg_cdc.errors.SinkSchemaError` names each column, both types and
  the fix, before anything is changed.

Only Iceberg's own promotions count as widening. pyiceberg's ``promote`` also
accepts ``string <-> binary`` and ``fixed[16] -> uuid`` (for reading files) and,
in 0.12, ignores a decimal's scale; none of those is a safe schema change, so
this module has its own rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import (
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
)

from iceberg_cdc.changelog.change_types import CHANGE_TYPE_COLUMN, CHANGE_TYPES
from iceberg_cdc.errors import SinkSchemaError

CHANGE_TYPE = CHANGE_TYPE_COLUMN
CHANGE_ORDINAL = "_change_ordinal"
COMMIT_SNAPSHOT_ID = "_commit_snapshot_id"
CHANGE_COLUMNS = (CHANGE_TYPE, CHANGE_ORDINAL, COMMIT_SNAPSHOT_ID)

_CHANGE_COLUMN_TYPES: dict[str, IcebergType] = {
    CHANGE_TYPE: StringType(),
    CHANGE_ORDINAL: IntegerType(),
    COMMIT_SNAPSHOT_ID: LongType(),
}
_CHANGE_COLUMN_DOCS = {
    CHANGE_TYPE: "Kind of change: INSERT, DELETE, UPDATE_BEFORE or UPDATE_AFTER",
    CHANGE_ORDINAL: "Position of the source snapshot in the source table's history (increasing)",
    COMMIT_SNAPSHOT_ID: "Id of the source snapshot that made this change",
}
_FIX_NAME_CLASH = (
    "rename the source column (ALTER TABLE ... RENAME COLUMN) -- names starting with "
    "'_change_' and '_commit_snapshot_id' are reserved for the sink's change columns"
)
_FIX_CONFLICT = (
    "to fix, rename the sink column out of the way (ALTER TABLE <sink> RENAME COLUMN <col> TO <col>_old; "
    "the sink then gains a new column with the source's type) or drop and recreate the sink table "
    "and reset its watermark"
)
_EVOLVE_ATTEMPTS = 4

Path = tuple[str, ...]


def _dotted(path: Path) -> str:
    return ".".join(path)


def _check_no_reserved_names(source_schema: Schema) -> None:
    clashes = [f.name for f in source_schema.fields if f.name in CHANGE_COLUMNS]
    if clashes:
        raise SinkSchemaError(
            f"source column(s) {', '.join(repr(c) for c in clashes)} use a name the sink table "
            f"reserves for its change columns; {_FIX_NAME_CLASH}"
        )


def sink_schema_for(source_schema: Schema) -> Schema:
    """The sink schema for a source schema: every source column, then the change columns.

    Source field ids are kept (the catalog assigns fresh ids when the table is
    created anyway); identifier fields are dropped because a changelog holds
    many rows per key.
    """
    _check_no_reserved_names(source_schema)
    next_id = source_schema.highest_field_id + 1
    change_fields = [
        NestedField(
            field_id=next_id + offset,
            name=name,
            field_type=_CHANGE_COLUMN_TYPES[name],
            required=True,
            doc=_CHANGE_COLUMN_DOCS[name],
        )
        for offset, name in enumerate(CHANGE_COLUMNS)
    ]
    return Schema(*source_schema.fields, *change_fields, schema_id=0, identifier_field_ids=[])


# ----------------------------------------------------------------------------- evolution


def widens(narrow: IcebergType, wide: IcebergType) -> bool:
    """True if Iceberg's schema evolution may promote ``narrow`` to ``wide`` (or they are equal)."""
    if narrow == wide:
        return True
    if isinstance(narrow, IntegerType) and isinstance(wide, LongType):
        return True
    if isinstance(narrow, FloatType) and isinstance(wide, DoubleType):
        return True
    return (
        isinstance(narrow, DecimalType)
        and isinstance(wide, DecimalType)
        and narrow.scale == wide.scale
        and narrow.precision <= wide.precision
    )


@dataclass
class SchemaEvolution:
    """What :func:`evolve_sink_schema` changed (or would change), as dotted column paths."""

    added: list[str] = field(default_factory=list)
    widened: list[str] = field(default_factory=list)
    made_optional: list[str] = field(default_factory=list)
    docs_updated: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.added or self.widened or self.made_optional or self.docs_updated)


@dataclass
class _Plan:
    adds: list[tuple[Path, NestedField]] = field(default_factory=list)  # (parent path, source field)
    widen: list[tuple[Path, IcebergType]] = field(default_factory=list)
    relax: list[Path] = field(default_factory=list)
    docs: list[tuple[Path, str]] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)

    def summary(self) -> SchemaEvolution:
        return SchemaEvolution(
            added=[_dotted((*parent, f.name)) for parent, f in self.adds],
            widened=[_dotted(p) for p, _ in self.widen],
            made_optional=[_dotted(p) for p in self.relax],
            docs_updated=[_dotted(p) for p, _ in self.docs],
        )


class _Planner:
    """Walks the source schema against the sink's, by name, collecting changes and conflicts."""

    def __init__(self) -> None:
        self.plan = _Plan()

    def conflict(self, path: Path, sink_type: IcebergType, source_type: IcebergType, why: str) -> None:
        self.plan.conflicts.append(
            f"column '{_dotted(path)}': the sink has {sink_type}, the source has {source_type} ({why})"
        )

    def struct(self, source: StructType, sink: StructType, path: Path, top_level: bool = False) -> None:
        source_names = set()
        for source_field in source.fields:
            source_names.add(source_field.name)
            sink_field = sink.field_by_name(source_field.name, case_sensitive=True)
            if sink_field is None:
                self.plan.adds.append((path, source_field))
            else:
                self.field(source_field, sink_field, (*path, source_field.name))
        for sink_field in sink.fields:
            if top_level and sink_field.name in CHANGE_COLUMNS:
                continue
            if sink_field.name not in source_names and sink_field.required:
                # Dropped from the source: new rows will hold null, so it cannot stay required.
                self.plan.relax.append((*path, sink_field.name))

    def field(self, source: NestedField, sink: NestedField, path: Path, is_map_key: bool = False) -> None:
        if source.optional and sink.required and not is_map_key:
            self.plan.relax.append(path)
        if source.doc and source.doc != sink.doc and not is_map_key:
            self.plan.docs.append((path, source.doc))
        self.type(source.field_type, sink.field_type, path, is_map_key)

    def type(self, source: IcebergType, sink: IcebergType, path: Path, is_map_key: bool = False) -> None:
        if source.is_primitive and sink.is_primitive:
            if widens(source, sink):
                return  # equal, or the sink is already wider: rows are cast up on write
            if widens(sink, source) and not is_map_key:
                self.plan.widen.append((path, source))
                return
            why = (
                "Iceberg cannot change the type of a map key"
                if is_map_key and widens(sink, source)
                else "Iceberg cannot convert between these types"
            )
            self.conflict(path, sink, source, why)
        elif isinstance(source, StructType) and isinstance(sink, StructType):
            self.struct(source, sink, path)
        elif isinstance(source, ListType) and isinstance(sink, ListType):
            self.field(source.element_field, sink.element_field, (*path, "element"))
        elif isinstance(source, MapType) and isinstance(sink, MapType):
            self.field(source.key_field, sink.key_field, (*path, "key"), is_map_key=True)
            self.field(source.value_field, sink.value_field, (*path, "value"))
        else:
            self.conflict(path, sink, source, "a column cannot change between nested and primitive kinds")


def _check_change_columns(sink_schema: Schema) -> None:
    for name, expected in _CHANGE_COLUMN_TYPES.items():
        try:
            found = sink_schema.find_field(name)
        except ValueError:
            raise SinkSchemaError(
                f"the sink table has no '{name}' column, so it is not a change table made by this "
                "pipeline; nothing was changed in it. Point tables[].sink at another table name (the "
                "pipeline creates it), or rename or drop this table if it is not needed"
            ) from None
        if found.field_type != expected:
            raise SinkSchemaError(
                f"the sink's change column '{name}' is {found.field_type}, expected {expected}; "
                "recreate the sink table"
            )


def plan_sink_evolution(sink_schema: Schema, source_schema: Schema) -> SchemaEvolution:
    """What :func:`evolve_sink_schema` would change, without changing anything.

    Raises :class:`SinkSchemaError` for a reserved source column name, missing
    change columns or a type conflict.
    """
    return _plan(sink_schema, source_schema).summary()


def _plan(sink_schema: Schema, source_schema: Schema) -> _Plan:
    _check_no_reserved_names(source_schema)
    _check_change_columns(sink_schema)
    planner = _Planner()
    planner.struct(source_schema.as_struct(), sink_schema.as_struct(), (), top_level=True)
    plan = planner.plan
    if plan.conflicts:
        raise SinkSchemaError(
            "the sink table's schema cannot follow the source's: "
            + "; ".join(plan.conflicts)
            + f". Nothing was changed; {_FIX_CONFLICT}"
        )
    return plan


def evolve_sink_schema(sink_table: Table, source_schema: Schema) -> SchemaEvolution:
    """Make the sink's schema hold the source's current columns, in one schema commit.

    See the module docstring for the rules. A concurrent schema change makes the
    commit fail its ``AssertCurrentSchemaId`` requirement; the table is then
    reloaded and the plan made again. Returns what was changed.
    """
    for attempt in range(_EVOLVE_ATTEMPTS):
        plan = _plan(sink_table.schema(), source_schema)
        summary = plan.summary()
        if not summary.changed:
            return summary
        try:
            _apply(sink_table, plan)
            return summary
        except CommitFailedException:
            if attempt == _EVOLVE_ATTEMPTS - 1:
                raise
            sink_table.refresh()
    raise AssertionError("unreachable")


def _apply(sink_table: Table, plan: _Plan) -> None:
    with sink_table.update_schema() as update:
        for path in plan.relax:
            update.make_column_optional(path)
        for path, wider in plan.widen:
            update.update_column(path, field_type=wider)
        for path, doc in plan.docs:
            update.update_column(path, doc=doc)
        for parent, source_field in plan.adds:
            path = (*parent, source_field.name)
            update.add_column(path, source_field.field_type, doc=source_field.doc, required=False)
            if not parent:
                update.move_before(path, CHANGE_TYPE)


# ----------------------------------------------------------------------------- Arrow rows


def sink_arrow_schema(sink_schema: Schema) -> pa.Schema:
    """The sink's Arrow schema, with Iceberg field ids in every field's metadata.

    Parquet written from it carries the field ids, which is what lets the files
    be committed as they are and read back by id.
    """
    return schema_to_pyarrow(sink_schema, include_field_ids=True)


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


def to_sink_arrow(changes: pa.Table, sink_schema: Schema, ordinal: int, snapshot_id: int) -> pa.Table:
    """Change rows in exactly the sink's Arrow schema, field ids included.

    ``changes`` is the merge output: source columns plus ``_change_type``. The
    result has every sink column in the sink's order: source columns cast to the
    sink's (wider) types, sink columns the source no longer has filled with null,
    and the constant ``_change_ordinal`` and ``_commit_snapshot_id`` added.
    """
    target = sink_arrow_schema(sink_schema)
    names = set(changes.column_names)
    for name in (CHANGE_ORDINAL, COMMIT_SNAPSHOT_ID):
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
    rows = changes.num_rows
    constants = {CHANGE_ORDINAL: ordinal, COMMIT_SNAPSHOT_ID: snapshot_id}
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
            raise SinkSchemaError(f"cannot write the changes to the sink: {why}; {_FIX_CONFLICT}")
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


def _check_change_types(column: pa.ChunkedArray | pa.Array) -> None:
    valid = pc.is_in(column, value_set=pa.array(CHANGE_TYPES, column.type))
    if column.null_count or not pc.all(valid, min_count=0).as_py():
        bad = pc.unique(pc.filter(column, pc.invert(pc.fill_null(valid, False)))).to_pylist()
        raise ValueError(
            f"'{CHANGE_TYPE}' must be one of {', '.join(CHANGE_TYPES)}; found {bad[:5]!r}"
            + (" and nulls" if column.null_count else "")
        )

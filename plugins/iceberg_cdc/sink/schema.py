"""The sink table's schema: derived from the source's, and kept following it.

The sink holds every source column (same names, types, nullability, nested
types and docs) followed by the change columns of :mod:`iceberg_cdc.sink.columns`
(``_change_type``, ``_change_ordinal``, ``_commit_snapshot_id``,
``_commit_timestamp``). Shaping change rows for the sink's schema is
:mod:`iceberg_cdc.sink.rows`.

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
* **Change columns added to the contract later** (``_commit_timestamp``) are
  added to an older sink, optional and last; its earlier rows hold null there.
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

from pyiceberg.exceptions import CommitFailedException
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
    StructType,
)

from iceberg_cdc.errors import SinkSchemaError
from iceberg_cdc.sink.columns import (
    ADDED_LATER,
    CHANGE_COLUMN_DOCS,
    CHANGE_COLUMN_TYPES,
    CHANGE_COLUMNS,
    CHANGE_ORDINAL,
    CHANGE_TYPE,
    CHANGE_TYPES,
    COMMIT_SNAPSHOT_ID,
    COMMIT_TIMESTAMP,
    FIX_CONFLICT,
    check_no_reserved_names,
)

# Row shaping lives in sink.rows; these names stay importable from here for existing callers.
from iceberg_cdc.sink.rows import sink_arrow_schema, to_sink_arrow

__all__ = [
    "CHANGE_COLUMNS",
    "CHANGE_ORDINAL",
    "CHANGE_TYPE",
    "CHANGE_TYPES",
    "COMMIT_SNAPSHOT_ID",
    "COMMIT_TIMESTAMP",
    "SchemaEvolution",
    "evolve_sink_schema",
    "plan_sink_evolution",
    "sink_arrow_schema",
    "sink_schema_for",
    "to_sink_arrow",
    "widens",
]

_EVOLVE_ATTEMPTS = 4

Path = tuple[str, ...]


def _dotted(path: Path) -> str:
    return ".".join(path)


def sink_schema_for(source_schema: Schema) -> Schema:
    """The sink schema for a source schema: every source column, then the change columns.

    Source field ids are kept (the catalog assigns fresh ids when the table is
    created anyway); identifier fields are dropped because a changelog holds
    many rows per key.
    """
    check_no_reserved_names(source_schema)
    next_id = source_schema.highest_field_id + 1
    change_fields = [
        NestedField(
            field_id=next_id + offset,
            name=name,
            field_type=CHANGE_COLUMN_TYPES[name],
            required=True,
            doc=CHANGE_COLUMN_DOCS[name],
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
    change_columns: list[str] = field(default_factory=list)  # change columns an older sink lacks

    def summary(self) -> SchemaEvolution:
        return SchemaEvolution(
            added=[_dotted((*parent, f.name)) for parent, f in self.adds] + list(self.change_columns),
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


def _check_change_columns(sink_schema: Schema) -> list[str]:
    """The change columns the sink lacks but may gain (:data:`ADDED_LATER`); others must be there."""
    missing = []
    for name, expected in CHANGE_COLUMN_TYPES.items():
        try:
            found = sink_schema.find_field(name)
        except ValueError:
            if name in ADDED_LATER:
                missing.append(name)
                continue
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
    return missing


def plan_sink_evolution(sink_schema: Schema, source_schema: Schema) -> SchemaEvolution:
    """What :func:`evolve_sink_schema` would change, without changing anything.

    Raises :class:`SinkSchemaError` for a reserved source column name, missing
    change columns or a type conflict.
    """
    return _plan(sink_schema, source_schema).summary()


def _plan(sink_schema: Schema, source_schema: Schema) -> _Plan:
    check_no_reserved_names(source_schema)
    missing = _check_change_columns(sink_schema)
    planner = _Planner()
    planner.struct(source_schema.as_struct(), sink_schema.as_struct(), (), top_level=True)
    plan = planner.plan
    plan.change_columns = missing
    if plan.conflicts:
        raise SinkSchemaError(
            "the sink table's schema cannot follow the source's: "
            + "; ".join(plan.conflicts)
            + f". Nothing was changed; {FIX_CONFLICT}"
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
        for name in plan.change_columns:
            # Appended, so it lands after the other change columns; optional, because the rows
            # already in the sink have no value for it.
            update.add_column(name, CHANGE_COLUMN_TYPES[name], doc=CHANGE_COLUMN_DOCS[name], required=False)

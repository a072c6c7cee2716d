"""The sink table's schema: derived from the source's, and kept following it.

The sink holds every source column (same names, types, nullability, nested
types and docs) followed by the change columns of :mod:`iceberg_cdc.sink.columns`
(``_change_type``, ``_change_ordinal``, ``_commit_snapshot_id``,
``_commit_timestamp``). Shaping change rows for the sink's schema is
:mod:`iceberg_cdc.sink.rows`.

The source schema changes over time and the sink follows it without manual
steps (:func:`evolve_sink_schema`), matching fields by the *source's field id*
through the sink's field-id mapping (:mod:`iceberg_cdc.sink.field_ids`, the
table property ``cdc.source-field-ids``, written in the same commit as the
schema change):

* **Renamed columns** (top level or nested) are renamed in the sink. An Iceberg
  rename only changes metadata, so the rows written before the rename read back
  under the new name: one sink column holds the field's whole history.
* **Added columns** (top level or nested) are added to the sink, always
  optional because the rows already in the sink do not have them; new top-level
  columns are placed before ``_change_type`` so the change columns stay last.
* **Widened types** (``int -> long``, ``float -> double``, a decimal's precision)
  are widened in the sink. A sink column that is already wider stays as it is
  and new rows are cast up when they are written.
* **Dropped columns stay in the sink**: old rows keep their values, new rows get
  null. A dropped column that was required is made optional for that reason.
* **Name collisions never merge two fields.** A column dropped and added again
  under the same name is a new field id, so a new sink column: the source's
  current fields always get their own names, and a retained history column in
  the way is renamed ``<name>__dropped_<source field id>`` in the same commit
  (``<name>__unmapped_<sink field id>`` for a legacy column no source field maps
  to). Fields that only the processed snapshot's older schema has (detect passes
  it as ``history``) are added under their old name, or
  ``<name>__dropped_<source field id>`` when that is taken; the current schema's
  names and types always win, so reprocessing an old snapshot never renames
  back or narrows.
* **Sinks made before the mapping existed** are paired by name against the
  source's current schema on their first evolution, in the same commit as any
  schema change. A column such a sink already split off for an earlier rename
  (the old name, null in rows written after the rename) stays as unmapped
  history.
* **Change columns added to the contract later** (``_commit_timestamp``) are
  added to an older sink, optional and last; its earlier rows hold null there.
* **Anything else is a conflict** -- a sink column whose type cannot hold the
  source's (``string`` vs ``long``, a struct vs a primitive, a changed map key):
  :class:`~iceberg_cdc.errors.SinkSchemaError` names each column, both types and
  the fix, before anything is changed.

Planning that evolution (pairing fields, naming collisions, conflicts) is
:mod:`iceberg_cdc.sink.schema_plan`; this module derives the sink schema and
commits a plan.
"""

from __future__ import annotations

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import IcebergType, ListType, MapType, NestedField, StructType

from iceberg_cdc.pyiceberg_internals.commit import set_properties_for_schema
from iceberg_cdc.sink import field_ids
from iceberg_cdc.sink.columns import (
    CHANGE_COLUMN_DOCS,
    CHANGE_COLUMN_TYPES,
    CHANGE_COLUMNS,
    CHANGE_ORDINAL,
    CHANGE_TYPE,
    CHANGE_TYPES,
    COMMIT_SNAPSHOT_ID,
    COMMIT_TIMESTAMP,
    check_no_reserved_names,
)
from iceberg_cdc.sink.field_ids import FieldIds

# Row shaping lives in sink.rows, planning in sink.schema_plan; these names stay importable from here.
from iceberg_cdc.sink.rows import sink_arrow_schema, to_sink_arrow
from iceberg_cdc.sink.schema_plan import (
    Path,
    Plan,
    SchemaEvolution,
    dotted,
    plan,
    plan_sink_evolution,
    widens,
)

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


def evolve_sink_schema(
    sink_table: Table, source_schema: Schema, history: Schema | None = None
) -> SchemaEvolution:
    """Make the sink's schema hold the source's current columns, matched by field id, in one commit.

    ``history`` is the schema of the snapshot being processed when it is not
    the current one: only its fields the current schema no longer has are
    used. See the module docstring for the rules. Schema changes and the
    field-id mapping (:mod:`iceberg_cdc.sink.field_ids`) are one commit. A
    concurrent change makes the commit fail its requirements; the table is then
    reloaded and the plan made again. Returns what was changed.
    """
    for attempt in range(_EVOLVE_ATTEMPTS):
        stored = sink_table.properties.get(field_ids.PROPERTY)
        mapping = field_ids.read(sink_table.properties)
        planned = plan(sink_table.schema(), source_schema, mapping, history, stored)
        summary = planned.summary()
        if not summary.changed and not summary.mapping_written:
            return summary
        try:
            _apply(sink_table, planned)
            return summary
        except CommitFailedException:
            if attempt == _EVOLVE_ATTEMPTS - 1:
                raise
            sink_table.refresh()
    raise AssertionError("unreachable")


def _apply(sink_table: Table, plan: Plan) -> None:
    """Renames, then adds (an add may take a name a rename frees), then the mapping: one commit."""
    txn = sink_table.transaction()
    if plan.renames or plan.relax or plan.widen or plan.docs:
        with txn.update_schema() as update:
            for path, name in plan.renames:
                update.rename_column(path, name)
            for path in plan.relax:
                update.make_column_optional(path)
            for path, wider in plan.widen:
                update.update_column(path, field_type=wider)
            for path, doc in plan.docs:
                update.update_column(path, doc=doc)
    if plan.adds or plan.change_columns:
        with txn.update_schema() as update:
            for add in plan.adds:
                path = (*add.parent, add.name)
                update.add_column(path, add.source.field_type, doc=add.source.doc, required=False)
                if not add.parent:
                    update.move_before(path, CHANGE_TYPE)
            for name in plan.change_columns:
                # Appended, so it lands after the other change columns; optional, because the rows
                # already in the sink have no value for it.
                update.add_column(
                    name, CHANGE_COLUMN_TYPES[name], doc=CHANGE_COLUMN_DOCS[name], required=False
                )
    mapping = dict(plan.mapping)
    if plan.adds:
        schema = txn.table_metadata.schema()
        added: FieldIds = {}
        for add in plan.adds:
            added.update(field_ids.pair_fields(_field_at(schema, (*add.parent, add.name)), add.source))
        # A source field added again (its old sink field was elsewhere) keeps only its new column.
        taken = set(added.values())
        mapping = {sink: source for sink, source in mapping.items() if source not in taken} | added
    value = field_ids.encode(mapping)
    if value != plan.stored:
        # Asserts the schema the plan was made on even when only the mapping changes.
        set_properties_for_schema(txn, {field_ids.PROPERTY: value})
    txn.commit_transaction()


def _field_at(schema: Schema, path: Path) -> NestedField:
    """The field at ``path`` (names, with ``element``/``key``/``value`` inside lists and maps)."""
    typ: IcebergType = schema.as_struct()
    found: NestedField | None = None
    for name in path:
        if isinstance(typ, ListType) and name == "element":
            found = typ.element_field
        elif isinstance(typ, MapType) and name in ("key", "value"):
            found = typ.key_field if name == "key" else typ.value_field
        elif isinstance(typ, StructType):
            found = typ.field_by_name(name, case_sensitive=True)
        else:
            found = None
        if found is None:
            raise AssertionError(f"field {dotted(path)} is not in the sink schema just evolved")
        typ = found.field_type
    assert found is not None
    return found

"""Planning the sink's schema evolution: the source's fields paired with the sink's by field id.

:func:`plan` walks the source schema (the current one, plus the fields only the
processed snapshot's older schema has) against the sink's, through the sink's
field-id mapping (:mod:`iceberg_cdc.sink.field_ids`), and returns what one
commit must do -- renames, adds, widenings, relaxed columns, docs, change
columns an older sink lacks, the new mapping -- or raises
:class:`~iceberg_cdc.errors.SinkSchemaError` naming every conflict. It changes
nothing; :func:`iceberg_cdc.sink.schema.evolve_sink_schema` commits the plan.
The rules themselves are in :mod:`iceberg_cdc.sink.schema`'s docstring.

Only Iceberg's own promotions count as widening (:func:`widens`). pyiceberg's
``promote`` also accepts ``string <-> binary`` and ``fixed[16] -> uuid`` (for
reading files) and, in 0.12, ignores a decimal's scale; none of those is a safe
schema change.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyiceberg.schema import Schema
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
from iceberg_cdc.sink import field_ids
from iceberg_cdc.sink.columns import (
    ADDED_LATER,
    CHANGE_COLUMN_TYPES,
    CHANGE_COLUMNS,
    FIX_CONFLICT,
    check_no_reserved_names,
)
from iceberg_cdc.sink.field_ids import FieldIds

Path = tuple[str, ...]


def dotted(path: Path) -> str:
    return ".".join(path)


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
    """What :func:`~iceberg_cdc.sink.schema.evolve_sink_schema` changed (or would change), as dotted column paths.

    ``renamed`` holds ``"old -> new"`` (the old path, the new name).
    ``mapping_written`` says the field-id mapping was written (or would be)
    without necessarily any schema change, e.g. a legacy sink's first pairing.
    """

    added: list[str] = field(default_factory=list)
    widened: list[str] = field(default_factory=list)
    made_optional: list[str] = field(default_factory=list)
    docs_updated: list[str] = field(default_factory=list)
    renamed: list[str] = field(default_factory=list)
    mapping_written: bool = False

    @property
    def changed(self) -> bool:
        """Whether the sink's schema changes (a mapping-only commit does not count)."""
        return bool(self.added or self.widened or self.made_optional or self.docs_updated or self.renamed)


@dataclass
class Add:
    parent: Path  # the parent's path after this commit's renames
    source: NestedField
    name: str  # the sink name: the source's, or a deterministic one when that is taken


@dataclass
class Plan:
    renames: list[tuple[Path, str]] = field(default_factory=list)  # (current sink path, new name)
    adds: list[Add] = field(default_factory=list)
    widen: list[tuple[Path, IcebergType]] = field(default_factory=list)
    relax: list[Path] = field(default_factory=list)
    docs: list[tuple[Path, str]] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    change_columns: list[str] = field(default_factory=list)  # change columns an older sink lacks
    mapping: FieldIds = field(default_factory=dict)  # sink id -> source id of the fields that exist already
    stored: str | None = None  # the mapping property as the sink has it now

    def summary(self) -> SchemaEvolution:
        return SchemaEvolution(
            added=[dotted((*a.parent, a.name)) for a in self.adds] + list(self.change_columns),
            widened=[dotted(p) for p, _ in self.widen],
            made_optional=[dotted(p) for p in self.relax],
            docs_updated=[dotted(p) for p, _ in self.docs],
            renamed=[f"{dotted(p)} -> {name}" for p, name in self.renames],
            mapping_written=bool(self.adds) or field_ids.encode(self.mapping) != self.stored,
        )


def _unique(name: str, claimed: set[str]) -> str:
    candidate, n = name, 2
    while candidate in claimed:
        candidate, n = f"{name}_{n}", n + 1
    return candidate


class _Planner:
    """Walks the source schema against the sink's, pairing fields by source field id.

    Within one struct, names are handed out in a fixed order so collisions
    resolve the same way every time: the change columns (top level), then the
    source's current fields (always their own name), then the sink's other
    columns -- history of dropped fields, unmapped legacy columns -- keeping
    their name unless a current field took it (then ``<name>__dropped_<source
    id>``, or ``<name>__unmapped_<sink id>`` for a column no source field maps
    to), then fields only the processed snapshot's older schema has (their old
    name, or ``<name>__dropped_<source id>`` when taken).
    """

    def __init__(self, mapping: FieldIds, history_ids: set[int]) -> None:
        self.plan = Plan()
        self.mapping = dict(mapping)
        self.by_source = field_ids.reverse(mapping)
        self.history_ids = history_ids

    def conflict(self, path: Path, sink_type: IcebergType, source_type: IcebergType, why: str) -> None:
        self.plan.conflicts.append(
            f"column '{dotted(path)}': the sink has {sink_type}, the source has {source_type} ({why})"
        )

    def struct(
        self, source: StructType, sink: StructType, old: Path, new: Path, top_level: bool = False
    ) -> None:
        sink_by_id = {f.field_id: f for f in sink.fields}
        claimed: set[str] = set(CHANGE_COLUMNS) if top_level else set()
        names: dict[int, str] = {}  # sink field id -> its name after this commit
        # In source order, then history: (source field, sink field or None to add, its sink name)
        steps: list[tuple[NestedField, NestedField | None, str]] = []
        current = [f for f in source.fields if f.field_id not in self.history_ids]
        history = {f.field_id: f for f in source.fields if f.field_id in self.history_ids}
        for source_field in current:
            sink_field = sink_by_id.get(self.by_source.get(source_field.field_id, -1))
            if sink_field is not None:
                names[sink_field.field_id] = source_field.name
            steps.append((source_field, sink_field, source_field.name))
            claimed.add(source_field.name)
        for sink_field in sink.fields:
            if sink_field.field_id in names or (top_level and sink_field.name in CHANGE_COLUMNS):
                continue
            source_id = self.mapping.get(sink_field.field_id)
            name = sink_field.name
            if name in claimed:
                suffix = (
                    f"__dropped_{source_id}" if source_id is not None else f"__unmapped_{sink_field.field_id}"
                )
                name = _unique(sink_field.name + suffix, claimed)
            claimed.add(name)
            names[sink_field.field_id] = name
            old_field = history.pop(source_id, None) if source_id is not None else None
            if old_field is not None:
                steps.append((old_field, sink_field, name))
            elif sink_field.required:
                # Dropped from the source: new rows will hold null, so it cannot stay required.
                self.plan.relax.append((*old, sink_field.name))
        for old_field in history.values():
            name = old_field.name
            if name in claimed:
                name = _unique(f"{name}__dropped_{old_field.field_id}", claimed)
            claimed.add(name)
            steps.append((old_field, None, name))
        for sink_field in sink.fields:
            name = names.get(sink_field.field_id, sink_field.name)
            if name != sink_field.name:
                self.plan.renames.append(((*old, sink_field.name), name))
        for source_field, matched, name in steps:
            if matched is None:
                self.plan.adds.append(Add(new, source_field, name))
            else:
                self.field(source_field, matched, (*old, matched.name), (*new, name))

    def field(
        self, source: NestedField, sink: NestedField, old: Path, new: Path, is_map_key: bool = False
    ) -> None:
        self.mapping[sink.field_id] = source.field_id
        if source.optional and sink.required and not is_map_key:
            self.plan.relax.append(old)
        if source.doc and source.doc != sink.doc and not is_map_key:
            self.plan.docs.append((old, source.doc))
        self.type(source.field_type, sink.field_type, old, new, is_map_key)

    def type(
        self, source: IcebergType, sink: IcebergType, old: Path, new: Path, is_map_key: bool = False
    ) -> None:
        if source.is_primitive and sink.is_primitive:
            if widens(source, sink):
                return  # equal, or the sink is already wider: rows are cast up on write
            if widens(sink, source) and not is_map_key:
                self.plan.widen.append((old, source))
                return
            why = (
                "Iceberg cannot change the type of a map key"
                if is_map_key and widens(sink, source)
                else "Iceberg cannot convert between these types"
            )
            self.conflict(old, sink, source, why)
        elif isinstance(source, StructType) and isinstance(sink, StructType):
            self.struct(source, sink, old, new)
        elif isinstance(source, ListType) and isinstance(sink, ListType):
            self.field(source.element_field, sink.element_field, (*old, "element"), (*new, "element"))
        elif isinstance(source, MapType) and isinstance(sink, MapType):
            self.field(source.key_field, sink.key_field, (*old, "key"), (*new, "key"), is_map_key=True)
            self.field(source.value_field, sink.value_field, (*old, "value"), (*new, "value"))
        else:
            self.conflict(old, sink, source, "a column cannot change between nested and primitive kinds")


def all_ids(typ: IcebergType) -> set[int]:
    ids: set[int] = set()
    if isinstance(typ, StructType):
        for f in typ.fields:
            ids.add(f.field_id)
            ids |= all_ids(f.field_type)
    elif isinstance(typ, ListType):
        ids.add(typ.element_id)
        ids |= all_ids(typ.element_type)
    elif isinstance(typ, MapType):
        ids |= {typ.key_id, typ.value_id} | all_ids(typ.key_type) | all_ids(typ.value_type)
    return ids


def _with_history(current: Schema, history: Schema | None) -> tuple[StructType, set[int]]:
    """The current schema plus, where they were, the fields only ``history`` has (made optional).

    Types, names and docs come from the current schema, so processing an old
    snapshot never narrows or renames back; the returned set holds the ids
    that are only in ``history``.
    """
    struct = current.as_struct()
    if history is None:
        return struct, set()
    current_ids = all_ids(struct)
    history_ids: set[int] = set()

    def merge(cur: IcebergType, old: IcebergType) -> IcebergType:
        if isinstance(cur, StructType) and isinstance(old, StructType):
            old_by_id = {f.field_id: f for f in old.fields}
            fields = [
                replace_field(f, merge(f.field_type, old_by_id[f.field_id].field_type))
                if f.field_id in old_by_id
                else f
                for f in cur.fields
            ]
            for f in old.fields:
                if f.field_id not in current_ids:
                    history_ids.add(f.field_id)
                    history_ids.update(all_ids(f.field_type))
                    fields.append(replace_field(f, f.field_type, required=False))
            return StructType(*fields)
        if isinstance(cur, ListType) and isinstance(old, ListType) and cur.element_id == old.element_id:
            return ListType(cur.element_id, merge(cur.element_type, old.element_type), cur.element_required)
        if isinstance(cur, MapType) and isinstance(old, MapType) and cur.value_id == old.value_id:
            return MapType(
                cur.key_id,
                cur.key_type,
                cur.value_id,
                merge(cur.value_type, old.value_type),
                cur.value_required,
            )
        return cur

    merged = merge(struct, history.as_struct())
    assert isinstance(merged, StructType)
    return merged, history_ids


def replace_field(f: NestedField, field_type: IcebergType, required: bool | None = None) -> NestedField:
    return NestedField(
        field_id=f.field_id,
        name=f.name,
        field_type=field_type,
        required=f.required if required is None else required,
        doc=f.doc,
    )


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


def plan_sink_evolution(
    sink_schema: Schema,
    source_schema: Schema,
    mapping: FieldIds | None = None,
    history: Schema | None = None,
) -> SchemaEvolution:
    """What :func:`~iceberg_cdc.sink.schema.evolve_sink_schema` would change, without changing anything.

    ``mapping`` is the sink's field-id mapping (None: pair by name, as for a
    sink made before it existed). Not knowing what the sink has stored, the
    result's ``mapping_written`` only says whether new fields would be mapped or
    a mapping be written at all. Raises :class:`SinkSchemaError` for a reserved
    source column name, missing change columns or a type conflict.
    """
    return plan(sink_schema, source_schema, mapping, history).summary()


def plan(
    sink_schema: Schema,
    source_schema: Schema,
    mapping: FieldIds | None,
    history: Schema | None,
    stored: str | None = None,
) -> Plan:
    check_no_reserved_names(source_schema)
    missing = _check_change_columns(sink_schema)
    sink_struct = sink_schema.as_struct()
    if mapping is None:
        mapping = field_ids.pair_by_name(sink_struct, source_schema.as_struct(), skip=CHANGE_COLUMNS)
    sink_ids = all_ids(sink_struct)
    # An entry whose sink field is gone (dropped from the sink by hand) no longer means anything.
    mapping = {sink: source for sink, source in mapping.items() if sink in sink_ids}
    source_struct, history_ids = _with_history(source_schema, history)
    planner = _Planner(mapping, history_ids)
    planner.struct(source_struct, sink_struct, (), (), top_level=True)
    planned = planner.plan
    planned.mapping = planner.mapping
    planned.change_columns = missing
    planned.stored = stored
    if planned.conflicts:
        raise SinkSchemaError(
            "the sink table's schema cannot follow the source's: "
            + "; ".join(planned.conflicts)
            + f". Nothing was changed; {FIX_CONFLICT}"
        )
    return planned

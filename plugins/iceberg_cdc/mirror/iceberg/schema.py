"""The Iceberg mirror's schema follows the changelog's by field id, in the apply's one commit.

The mirror keeps a mapping from the changelog (sink) table's field ids to its
own field ids -- top-level columns and the fields of structs, at any depth --
in the table property ``cdc.mirror.field-ids`` (JSON). Each level is compared
with :func:`iceberg_cdc.mirror.schema_changes.schema_changes`, the rule every
target shares: a renamed changelog field is renamed in the mirror (Iceberg
renames are metadata only: old data files read under the new name, by id), a
new one is added (optional), a widened one widened (Iceberg's promotions:
``int -> long``, ``float -> double``, a decimal's precision), and one the
mirror no longer gets is kept, optional.

**Nothing is committed here.** :func:`planned_schema` stages the changes in a
transaction that is never committed and returns the schema they lead to; the
apply's units write their data files with it, and the commit sets exactly that
schema, the mapping, the rows and the watermark in one metadata version
(:func:`iceberg_cdc.mirror.iceberg.commit.commit_delta`). A mirror therefore
never shows the new schema without the matching rows, or the reverse.

A mirror without the property (built before it, or just created from the
source's schema) is mapped by name on that apply. A change the mirror cannot
take (a narrowing, an unrelated type, a rename onto a column added by hand) is
a :class:`~iceberg_cdc.errors.MirrorSchemaError` naming the column and the fix;
nothing is changed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from pyiceberg.schema import Schema, index_by_id
from pyiceberg.table import Table
from pyiceberg.table.update.schema import UpdateSchema
from pyiceberg.types import (
    IcebergType,
    ListType,
    MapType,
    NestedField,
    StructType,
)

from iceberg_cdc.errors import MirrorSchemaError
from iceberg_cdc.mirror.iceberg.summary import MAPPING_PROPERTY
from iceberg_cdc.mirror.schema_changes import schema_changes
from iceberg_cdc.pyiceberg_internals.format_v3 import writing_v3_metadata
from iceberg_cdc.sink.schema_plan import widens  # one rule: Iceberg's own promotions


def read_mapping(table: Table) -> dict[int, int] | None:
    """The mirror's mapping: changelog field id -> mirror field id (None: not mapped yet)."""
    text = table.metadata.properties.get(MAPPING_PROPERTY)
    return None if text is None else {int(k): int(v) for k, v in json.loads(text).items()}


def mapping_json(mapping: dict[int, int]) -> str:
    return json.dumps({str(k): v for k, v in sorted(mapping.items())}, sort_keys=True)


@dataclass
class _Ops:
    renames: list[tuple[tuple[str, ...], str]]  # path in the mirror's schema now -> new name
    adds: list[tuple[tuple[str, ...], NestedField]]  # parent path (after renames), field
    widens: list[tuple[tuple[str, ...], IcebergType]]  # path after renames
    optional: list[tuple[str, ...]]  # path after renames


@dataclass(frozen=True)
class SchemaPlan:
    """The schema the apply commits and the mapping that goes with it."""

    schema: Schema
    mapping: dict[int, int]
    changed: bool
    figures: dict[str, list[str]]


def _same_shape(a: IcebergType, b: IcebergType) -> bool:
    """Equal types, ignoring the field ids of nested types (the mirror's ids are its own)."""
    if isinstance(a, ListType) and isinstance(b, ListType):
        return a.element_required == b.element_required and _same_shape(a.element_type, b.element_type)
    if isinstance(a, MapType) and isinstance(b, MapType):
        return (
            a.value_required == b.value_required
            and _same_shape(a.key_type, b.key_type)
            and _same_shape(a.value_type, b.value_type)
        )
    if isinstance(a, StructType) and isinstance(b, StructType):
        return len(a.fields) == len(b.fields) and all(
            x.name == y.name and x.required == y.required and _same_shape(x.field_type, y.field_type)
            for x, y in zip(a.fields, b.fields, strict=True)
        )
    return a == b


def _level(
    name: str,
    mirror_fields: Sequence[NestedField],
    sink_fields: Sequence[NestedField],
    mapping: dict[int, int] | None,
    path: tuple[str, ...],
    ops: _Ops,
    problems: list[str],
) -> None:
    by_id = {f.field_id: f for f in mirror_fields}
    by_name = {f.name: f for f in mirror_fields}
    level = None if mapping is None else {s: by_id[m].name for s, m in mapping.items() if m in by_id}
    where = f"mirror {name}" + (f", struct {'.'.join(path)}" if path else "")
    changes = schema_changes(level, by_name, sink_fields, where)
    old_name = {r.field_id: r.old for r in changes.renames if r.old in by_name}
    for rename in changes.renames:  # pyiceberg renames by field id at once: no temporary names needed
        if rename.old in by_name:
            ops.renames.append(((*path, rename.old), changes.mapping[rename.field_id]))
    for f in changes.added:
        ops.adds.append((path, f))
    for f in changes.matched:
        mine = by_name[old_name.get(f.field_id, f.name)]
        at = (*path, f.name)
        if mine.required and not f.required:
            ops.optional.append(at)
        have, want = mine.field_type, f.field_type
        if isinstance(have, StructType) and isinstance(want, StructType):
            _level(name, have.fields, want.fields, mapping, at, ops, problems)
        elif have.is_primitive and want.is_primitive:
            if widens(want, have):
                continue  # equal, or the mirror's column is already wider
            if widens(have, want):
                ops.widens.append((at, want))
            else:
                problems.append(f"column {'.'.join(at)!r} is {have} in the mirror, {want} in the changelog")
        elif not _same_shape(have, want):
            problems.append(f"column {'.'.join(at)!r} is {have} in the mirror, {want} in the changelog")
    held = {old_name.get(f.field_id, f.name) for f in changes.matched}
    for mine in mirror_fields:  # kept, or not the changelog's at all: written as null from now on
        if mine.required and mine.name not in held:
            ops.optional.append((*path, mine.name))


def _sink_ids(sink_fields: Sequence[NestedField], mirror: StructType | Schema, into: dict[int, int]) -> None:
    """Map each changelog field to the mirror's field of the same name path (names agree after the changes)."""
    by_name = {f.name: f for f in mirror.fields}
    for f in sink_fields:
        mine = by_name[f.name]
        into[f.field_id] = mine.field_id
        if isinstance(f.field_type, StructType) and isinstance(mine.field_type, StructType):
            _sink_ids(f.field_type.fields, mine.field_type, into)


def planned_schema(table: Table, sink_fields: Sequence[NestedField]) -> SchemaPlan:
    """The mirror's schema after following ``sink_fields`` by id (staged, not committed; see module doc)."""
    mapping = read_mapping(table)
    before = table.schema()
    ops = _Ops([], [], [], [])
    problems: list[str] = []
    _level(table.name()[-1] if table.name() else "?", before.fields, sink_fields, mapping, (), ops, problems)
    if problems:
        raise MirrorSchemaError(
            f"mirror {'.'.join(table.name())} cannot follow the changelog's schema: "
            + "; ".join(problems)
            + ". Iceberg widens int -> long, float -> double and decimal precision only; rename the mirror's "
            "column out of the way, or drop the mirror (the next run builds it again from the changelog)"
        )
    tx = table.transaction()  # never committed: it only computes the schema
    try:
        with writing_v3_metadata():
            if ops.renames:
                _staged(tx.update_schema(), lambda u: [u.rename_column(p, n) for p, n in ops.renames])
            if ops.adds or ops.widens or ops.optional:

                def rest(u: UpdateSchema) -> None:
                    for parent, f in ops.adds:
                        u.add_column((*parent, f.name), f.field_type, doc=f.doc, required=False)
                    for at, typ in ops.widens:
                        u.update_column(at, typ)
                    for at in ops.optional:
                        u.make_column_optional(at)

                _staged(tx.update_schema(), rest)
            after = tx.table_metadata.schema()
    except (ValueError, TypeError) as exc:
        raise MirrorSchemaError(
            f"mirror {'.'.join(table.name())}: the changelog's schema cannot be applied to the mirror's ({exc}); "
            "rename the mirror's conflicting column out of the way, or drop the mirror (the next run builds it "
            "again from the changelog)"
        ) from exc
    ids = index_by_id(after)
    new_mapping = {s: m for s, m in (mapping or {}).items() if m in ids}
    _sink_ids(sink_fields, after, new_mapping)
    figures = {
        "renamed": [f"{'.'.join(p)}->{n}" for p, n in ops.renames],
        "added": [".".join((*p, f.name)) for p, f in ops.adds],
        "widened": [".".join(p) for p, _ in ops.widens],
    }
    changed = after != before
    return SchemaPlan(after, new_mapping, changed or mapping != new_mapping, figures)


def _staged(update: UpdateSchema, change) -> None:  # type: ignore[no-untyped-def]
    change(update)
    update.commit()  # into the transaction only

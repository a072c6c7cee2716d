"""How a mirror's columns follow the changelog's: by field id, one rule for every target.

A mirror keeps a durable **mapping** from the changelog (sink) table's field
ids to the names its own columns have. The sink follows the source by field
id (a rename is a metadata-only rename there), so a sink column keeps its id
for life while its name may change. Matching by name instead would turn a
rename into a new, empty column next to the old one.

Given the mapping and the sink's current mirror fields (one struct level:
the top-level columns, or one struct's children), :func:`schema_changes`
says what the mirror must do, before it does anything:

* **rename** -- a mapped id whose sink name differs from the mirror's name.
  Renames are ordered so each target name is free when it is taken; a swap or
  a cycle goes through a temporary name.
* **add** -- an id the mapping does not know: a column the sink gained (or
  one that is no longer excluded).
* **match** -- an id the mirror already holds (after the renames): the target
  compares the types and widens or refuses (types are the target's own).
* **keep** -- a mapped id the sink's mirror fields no longer have (excluded
  now): its column stays, its rows unchanged, and the mapping keeps it.
* **conflict** -- a change onto a column the mirror does not own (a rename
  or an add whose name a column added by hand already has, or a name another
  mapped column holds): :class:`~iceberg_cdc.errors.MirrorSchemaError`
  naming the column and the fix; nothing is changed.

**Legacy mirrors** (no mapping yet: built before the mapping existed) are
mapped by name on their first apply: a sink field whose name the mirror has is
that column; the rest are added. The target stores the resulting mapping in
the same transaction or commit as the apply.

A mapped column the target lost (dropped by hand while the sink still has it)
is added again, as before the mapping existed.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from pyiceberg.types import NestedField

from iceberg_cdc.errors import MirrorSchemaError

TEMPORARY_PREFIX = "_cdc_renaming_"


@dataclass(frozen=True)
class Rename:
    """Rename the mirror's column ``old`` to ``new`` (``field_id``: the sink field it holds)."""

    old: str
    new: str
    field_id: int


@dataclass(frozen=True)
class SchemaChanges:
    """What one struct level of a mirror must do to follow the sink (see the module doc)."""

    renames: tuple[Rename, ...] = ()
    added: tuple[NestedField, ...] = ()
    matched: tuple[NestedField, ...] = ()  # held already (under the sink's name once renamed)
    kept: tuple[str, ...] = ()  # mapped columns the sink's mirror fields no longer have
    mapping: dict[int, str] = field(default_factory=dict)  # the mapping after the changes
    initialised: bool = False  # the mapping was built by name (a legacy mirror)

    @property
    def changed(self) -> bool:
        return bool(self.renames or self.added)


def _ordered(renames: list[Rename]) -> list[Rename]:
    """Renames in an order that never takes a name still in use; cycles go through a temporary name."""
    pending = list(renames)
    done: list[Rename] = []
    while pending:
        sources = {r.old for r in pending}
        free = next((r for r in pending if r.new not in sources), None)
        if free is not None:
            pending.remove(free)
            done.append(free)
            continue
        first = pending.pop(0)  # every target is some pending source: a cycle
        temporary = f"{TEMPORARY_PREFIX}{first.field_id}"
        done.append(Rename(first.old, temporary, first.field_id))
        pending.append(Rename(temporary, first.new, first.field_id))
    return done


def schema_changes(
    mapping: Mapping[int, str] | None,
    present: Collection[str],
    fields: Sequence[NestedField],
    where: str,
) -> SchemaChanges:
    """The changes that make a mirror's level ``present`` follow the sink's ``fields`` (see the module doc).

    ``mapping``: sink field id -> the mirror's column name (None: a legacy
    mirror, mapped by name now). ``where`` names the mirror (and struct) in
    errors.
    """
    present = set(present)
    if mapping is None:
        initial = {f.field_id: f.name for f in fields if f.name in present}
        return _changes(initial, present, fields, where, initialised=True)
    return _changes(dict(mapping), present, fields, where, initialised=False)


def _changes(
    mapping: dict[int, str],
    present: set[str],
    fields: Sequence[NestedField],
    where: str,
    *,
    initialised: bool,
) -> SchemaChanges:
    wanted = {f.field_id for f in fields}
    owner = {name: fid for fid, name in mapping.items() if name in present}
    renames: list[Rename] = []
    added: list[NestedField] = []
    matched: list[NestedField] = []
    problems: list[str] = []
    vacated = {mapping[f.field_id] for f in fields if mapping.get(f.field_id, f.name) != f.name}
    vacated &= present
    for f in fields:
        old = mapping.get(f.field_id)
        if old is not None and old not in present:
            old = None  # the column was dropped by hand: it comes back, as an added column
        taken = f.name in present and f.name not in vacated and owner.get(f.name) != f.field_id
        if old is None:
            if taken:
                holder = owner.get(f.name)
                problems.append(
                    f"the changelog's new column {f.name!r} (field id {f.field_id}) has the name of "
                    + (
                        f"the mirror's column for field id {holder}"
                        if holder is not None
                        else "a column the mirror does not own (added by hand)"
                    )
                    + f": rename or drop the mirror's column {f.name!r}, then run the mirror again"
                )
                continue
            added.append(f)
        elif old != f.name:
            if taken:
                problems.append(
                    f"column {old!r} was renamed to {f.name!r} in the changelog (field id {f.field_id}), but the "
                    f"mirror already has a column {f.name!r} it does not own (added by hand): rename or drop "
                    f"that column, then run the mirror again"
                )
                continue
            renames.append(Rename(old, f.name, f.field_id))
            matched.append(f)
        else:
            matched.append(f)
    if problems:
        raise MirrorSchemaError(f"{where} cannot follow the changelog's schema: " + "; ".join(problems))
    kept = tuple(name for fid, name in mapping.items() if fid not in wanted and name in present)
    after = {fid: name for fid, name in mapping.items() if fid not in wanted}
    after.update({f.field_id: f.name for f in fields})
    return SchemaChanges(
        renames=tuple(_ordered(renames)),
        added=tuple(added),
        matched=tuple(matched),
        kept=kept,
        mapping=after,
        initialised=initialised,
    )


def mapping_to_json(mapping: Mapping[int, str]) -> dict[str, str]:
    """The mapping as JSON keys (strings), for a state table or a table property."""
    return {str(fid): name for fid, name in sorted(mapping.items())}


def mapping_from_json(data: Mapping[str, str] | None) -> dict[int, str] | None:
    return None if data is None else {int(fid): str(name) for fid, name in data.items()}

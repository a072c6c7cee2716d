"""The mirror table and its state table in PostgreSQL: created when missing, evolved with the changelog.

Runs inside the apply's transaction, after its advisory lock, so two runs
never race on DDL and a failed apply leaves no half-made schema change
(PostgreSQL's DDL is transactional).

* **Created** with every mirror column (:mod:`.types` maps the types), the
  key columns ``NOT NULL`` and the primary key; other columns nullable.
* **Columns follow the changelog by field id** (:mod:`iceberg_cdc.mirror.schema_changes`,
  the rule every target shares): a renamed changelog column is renamed here
  (``ALTER TABLE ... RENAME COLUMN``, its rows untouched), so a source rename
  never becomes an empty new column. The mapping (changelog field id -> column
  name) is kept in the state table's ``field_ids`` and written in the same
  transaction as the DDL and the watermark; a mirror from before the mapping
  is mapped by name on its first apply. Structs are ``jsonb``, so top-level
  columns are all there is to map.
* **Added columns** (the source gained a column) are added, nullable.
* **Widened types** (``integer -> bigint``, ``real -> double precision``,
  ``numeric(p,s) -> numeric(p2,s)``) are widened in place; a column that is
  already wider stays (values are cast up on insert).
* **Dropped columns stay**: the changelog keeps a dropped source column, so
  the mirror does too; rows written after the drop hold null there. Drop it
  by hand (``ALTER TABLE ... DROP COLUMN``) when it is no longer wanted: the
  mirror then leaves it out.
* Columns the mirror does not know (added by hand) are left alone, as long as
  an insert can leave them empty (nullable or with a default).
* Anything else -- a type that cannot hold the changelog's, no unique index on
  exactly the key columns, a rename or an add onto a column added by hand --
  is a :class:`~iceberg_cdc.errors.MirrorSchemaError`
  naming the column and the fix, raised before anything is changed.

The state table ``<schema>._cdc_mirror_state`` holds one row per mirror table:
its :class:`~iceberg_cdc.mirror.net_changes.ChangelogMark`, the lease epoch
and run of the last apply, that apply's time, row counts and seconds, and the
column mapping. A state table from before the mapping or the seconds gains
its ``field_ids`` / ``apply_seconds`` column on the next apply (``ADD COLUMN
IF NOT EXISTS``, under the state table's lock).
"""

from __future__ import annotations

from typing import Any

from pyiceberg.types import NestedField

from iceberg_cdc.errors import MirrorSchemaError
from iceberg_cdc.mirror.postgres.types import pg_type, qualified, quote, widens
from iceberg_cdc.mirror.schema_changes import TEMPORARY_PREFIX, SchemaChanges, schema_changes

STATE_TABLE = "_cdc_mirror_state"
_STATE_COLUMNS = """
    mirror_table text PRIMARY KEY,
    changelog_table text NOT NULL,
    source_table text NOT NULL,
    changelog_snapshot_id bigint,
    source_snapshot_id bigint,
    change_ordinal bigint,
    epoch bigint NOT NULL DEFAULT 0,
    run_id text,
    applied_at timestamptz,
    upserted bigint,
    deleted bigint,
    field_ids jsonb,
    apply_seconds double precision
"""
MAPPING_COLUMN = "field_ids"  # changelog field id -> mirror column name; null: not mapped yet
SECONDS_COLUMN = "apply_seconds"  # the last apply's transaction, start to mark (the CDC view shows it)


def state_table(mirror_table: str) -> str:
    """The quoted state table beside a mirror table: ``"schema"."_cdc_mirror_state"``."""
    return f"{quote(mirror_table.split('.', 1)[0])}.{quote(STATE_TABLE)}"


def lock(cursor: Any, mirror_table: str) -> None:
    """Serialize everything that writes this mirror table until the transaction ends."""
    cursor.execute("SELECT pg_advisory_xact_lock(hashtext($1))", (f"cdc-mirror:{mirror_table}",))
    cursor.fetchall()


def _exists(cursor: Any, relation: str) -> bool:
    cursor.execute("SELECT to_regclass($1) IS NOT NULL", (relation,))
    return bool(cursor.fetchone()[0])


def ensure_state_table(cursor: Any, mirror_table: str) -> None:
    """Create the schema and the state table when missing, or add the mapping column to an older one.

    Both under a lock shared by every mirror; the check comes first so a
    current state table is never locked exclusively by an ``ALTER``.
    """
    relation = state_table(mirror_table)
    if _exists(cursor, relation) and {MAPPING_COLUMN, SECONDS_COLUMN} <= set(_columns(cursor, relation)):
        return
    cursor.execute("SELECT pg_advisory_xact_lock(hashtext('cdc-mirror-state'))")
    cursor.fetchall()
    cursor.execute(f"CREATE SCHEMA IF NOT EXISTS {quote(mirror_table.split('.', 1)[0])}")
    cursor.execute(f"CREATE TABLE IF NOT EXISTS {relation} ({_STATE_COLUMNS})")
    cursor.execute(f"ALTER TABLE {relation} ADD COLUMN IF NOT EXISTS {quote(MAPPING_COLUMN)} jsonb")
    cursor.execute(
        f"ALTER TABLE {relation} ADD COLUMN IF NOT EXISTS {quote(SECONDS_COLUMN)} double precision"
    )


def _columns(cursor: Any, relation: str) -> dict[str, tuple[str, bool, bool]]:
    cursor.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, a.atthasdef "
        "FROM pg_attribute a WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped "
        "ORDER BY a.attnum",
        (relation,),
    )
    return {name: (typ, not_null, has_default) for name, typ, not_null, has_default in cursor.fetchall()}


def _unique_keys(cursor: Any, relation: str) -> list[set[str]]:
    cursor.execute(
        "SELECT array_agg(a.attname::text) FROM pg_index i "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
        "WHERE i.indrelid = $1::regclass AND i.indisunique AND i.indpred IS NULL AND i.indexprs IS NULL "
        "GROUP BY i.indexrelid",
        (relation,),
    )
    return [set(row[0]) for row in cursor.fetchall()]


def ensure_mirror_table(
    cursor: Any,
    mirror_table: str,
    fields: list[NestedField],
    key: tuple[str, ...],
    mapping: dict[int, str] | None,
) -> tuple[dict[str, list[str]], dict[int, str]]:
    """Create or evolve the mirror table by field id (see the module doc).

    ``mapping``: the state row's (None: a mirror from before it, or none
    yet). Returns what changed (``created``/``renamed``/``added``/``widened``)
    and the mapping to store with this apply.
    """
    relation = qualified(mirror_table)
    wanted = {f.name: pg_type(f.name, f.field_type) for f in fields}
    if not _exists(cursor, relation):
        columns = [
            f"{quote(name)} {typ}" + (" NOT NULL" if name in key else "") for name, typ in wanted.items()
        ]
        columns.append(f"PRIMARY KEY ({', '.join(quote(k) for k in key)})")
        cursor.execute(f"CREATE TABLE {relation} ({', '.join(columns)})")
        return {"created": list(wanted)}, {f.field_id: f.name for f in fields}
    present = _columns(cursor, relation)
    changes = schema_changes(mapping, present, fields, f"mirror table {mirror_table}")
    # What the table will be after the renames: the types each column has, under its new name.
    after = dict(present)
    for rename in changes.renames:
        after[rename.new] = after.pop(rename.old)
    problems: list[str] = []
    widened: list[tuple[str, str]] = []
    for f in changes.matched:
        name, typ = f.name, wanted[f.name]
        have = after[name][0]
        if widens(typ, have):
            continue  # equal, or the mirror's column is already wider
        if widens(have, typ):
            widened.append((name, typ))
        else:
            problems.append(
                f"column {name!r} is {have}, the changelog's is {typ} (which {have} cannot hold); rename the "
                f"column out of the way (ALTER TABLE {relation} RENAME COLUMN {quote(name)} TO "
                f"{quote(name + '_old')}) or rebuild the mirror into a new table"
            )
    for f in changes.added:
        if f.name in key:
            problems.append(f"key column {f.name!r} is missing: add it, or recreate the table")
    for name, (typ, not_null, has_default) in after.items():
        if name not in wanted and not_null and not has_default:
            problems.append(
                f"column {name!r} ({typ}) is NOT NULL without a default but the mirror does not write it: "
                f"ALTER TABLE {relation} ALTER COLUMN {quote(name)} DROP NOT NULL"
            )
    keys_after = [{_renamed(changes, c) for c in found} for found in _unique_keys(cursor, relation)]
    if not any(found == set(key) for found in keys_after):
        problems.append(
            f"no primary key or unique index on exactly the key column(s) {list(key)}: "
            f"ALTER TABLE {relation} ADD PRIMARY KEY ({', '.join(quote(k) for k in key)})"
        )
    if problems:
        raise MirrorSchemaError(
            f"mirror table {mirror_table} cannot follow the changelog: " + "; ".join(problems)
        )
    _apply(cursor, relation, changes, wanted, widened)
    done = {
        "renamed": [f"{r.old}->{r.new}" for r in changes.renames if not r.new.startswith(TEMPORARY_PREFIX)],
        "added": [f.name for f in changes.added],
        "widened": [name for name, _ in widened],
    }
    return done, changes.mapping


def _renamed(changes: SchemaChanges, column: str) -> str:
    for rename in changes.renames:
        if rename.old == column:
            column = rename.new
    return column


def _apply(
    cursor: Any,
    relation: str,
    changes: SchemaChanges,
    wanted: dict[str, str],
    widened: list[tuple[str, str]],
) -> None:
    """The DDL, in the apply's transaction: renames first (they free names adds may take)."""
    for rename in changes.renames:
        cursor.execute(f"ALTER TABLE {relation} RENAME COLUMN {quote(rename.old)} TO {quote(rename.new)}")
    for f in changes.added:
        cursor.execute(f"ALTER TABLE {relation} ADD COLUMN {quote(f.name)} {wanted[f.name]}")
    for name, typ in widened:
        cursor.execute(f"ALTER TABLE {relation} ALTER COLUMN {quote(name)} TYPE {typ}")

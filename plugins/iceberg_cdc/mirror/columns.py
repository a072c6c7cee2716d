"""Which columns a mirror holds, and by which key: from the changelog table's schema.

A mirror holds the changelog's data columns -- the source's columns as the
changelog (sink) keeps them -- without the change columns and without the
``exclude_columns`` of its config. Following the changelog rather than the
source's current schema gives the mirror the changelog's own evolution rules
(:mod:`iceberg_cdc.sink.schema`): added columns appear, widened types widen,
a column dropped from the source **stays** (rows written after the drop
hold null in it, as in the changelog), and a renamed one is renamed -- the
targets match their columns to these by field id
(:mod:`iceberg_cdc.mirror.schema_changes`).

The key is the table's identifier columns. A table without any (whole-row
mode) cannot be mirrored: its rows have no identity to upsert or delete by,
and equal rows may repeat. That is refused with the fix, as is a key nested in
a struct (a target's primary key needs top-level columns).
"""

from __future__ import annotations

from pyiceberg.schema import Schema
from pyiceberg.types import NestedField

from iceberg_cdc.config import MirrorConfig, TableConfig
from iceberg_cdc.errors import MirrorConfigError
from iceberg_cdc.sink.schema import CHANGE_COLUMNS
from iceberg_cdc.source.tables import resolve_identifier_columns


def mirror_key(table: TableConfig, mirror: MirrorConfig, source_schema: Schema) -> tuple[str, ...]:
    """The mirror's key columns, or MirrorConfigError for whole-row tables and nested keys."""
    keys = resolve_identifier_columns(table, source_schema)
    if not keys:
        raise MirrorConfigError(
            f"table {table.source} has no identifier columns (whole-row mode), so {mirror.describe()} cannot be "
            "kept: a mirror holds one row per key and upserts and deletes by it. Set "
            "tables[].identifier_columns to columns that identify a row (or set the source table's identifier "
            "fields), or remove the mirror from tables[].mirrors."
        )
    top_level = {f.name for f in source_schema.fields}
    nested = [k for k in keys if k not in top_level]
    if nested:
        raise MirrorConfigError(
            f"table {table.source}: key column(s) {nested} of {mirror.describe()} are nested in a struct; a "
            "mirror's key must be top-level columns. Set tables[].identifier_columns to top-level columns."
        )
    return tuple(keys)


def mirror_fields(changelog_schema: Schema, mirror: MirrorConfig, key: tuple[str, ...]) -> list[NestedField]:
    """The mirror's columns, in the changelog's order: data columns minus ``exclude_columns``."""
    data = [f for f in changelog_schema.fields if f.name not in CHANGE_COLUMNS]
    names = {f.name for f in data}
    unknown = sorted(set(mirror.exclude_columns) - names)
    if unknown:
        raise MirrorConfigError(
            f"{mirror.describe()}: exclude_columns names {unknown}, which the changelog does not have "
            f"(columns: {sorted(names)}); fix tables[].mirrors[].exclude_columns"
        )
    missing = [k for k in key if k not in names]
    if missing:
        raise MirrorConfigError(
            f"{mirror.describe()}: key column(s) {missing} are not columns of the changelog table; check "
            "tables[].identifier_columns"
        )
    return [f for f in data if f.name not in set(mirror.exclude_columns)]

"""The mirror table: created from the source's schema when missing, evolved with it, and its watermark.

**Creation.** The mirror gets the source's schema (as of the snapshot the
apply reaches), partition spec and format version (at least 2: deletes need
it; a v3 source gives a v3 mirror, whose deletes are deletion vectors), and
the key columns as identifier fields when they are required columns.

**Evolution.** A mirror run follows the changelog's schema by field id, in
the apply's one commit (:mod:`.schema`). :func:`evolve` is the older rule,
by name against the source's schema (pyiceberg's ``union_by_name``: added
columns added, widened types widened, dropped ones kept and optional, a
rename looking like a new column), used only for staged net changes that do
not carry the changelog's schema. A change Iceberg cannot make is a
:class:`~iceberg_cdc.errors.MirrorStateError` naming the column and both types.

**Watermark.** The last changelog snapshot applied is kept twice, both in the
apply's one commit: in the table's properties (``cdc.mirror.watermark.*``,
what the next run reads) and in the new snapshot's summary (``cdc.mirror.*``,
the marker an apply whose answer was lost is recognised by); every key is
spelled in :mod:`iceberg_cdc.mirror.iceberg.summary`.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from iceberg_cdc.errors import MirrorStateError
from iceberg_cdc.mirror.iceberg.inputs import Through
from iceberg_cdc.mirror.iceberg.summary import (
    MARKER_PREFIX,
    WATERMARK_PREFIX,
    parse_apply,
    parse_last_apply,
    parse_mark,
)
from iceberg_cdc.pyiceberg_internals.format_v3 import writing_v3_metadata


def read_mirror_watermark(table: Table) -> Through | None:
    """The mirror's watermark (None for a mirror nothing was applied to yet)."""
    return parse_mark(table.metadata.properties, WATERMARK_PREFIX)


def snapshot_marker(snapshot: Snapshot) -> Through | None:
    summary = snapshot.summary
    return parse_mark(summary.additional_properties, MARKER_PREFIX) if summary is not None else None


def find_apply(table: Table, through: Through) -> Snapshot | None:
    """The snapshot of ``main``'s history whose marker is ``through``, searching back from the head.

    The search stops at the first marker below ``through``'s ordinal: applies
    are committed in order, so an older one cannot follow it.
    """
    snapshot = table.current_snapshot()
    while snapshot is not None:
        marker = snapshot_marker(snapshot)
        if marker is not None:
            if marker == through:
                return snapshot
            if marker.ordinal < through.ordinal:
                return None
        parent = snapshot.parent_snapshot_id
        snapshot = table.metadata.snapshot_by_id(parent) if parent is not None else None
    return None


LAST_APPLY_SEARCH = 100  # snapshots searched back from the head (maintenance commits may follow an apply)


def last_apply(table: Table) -> dict | None:
    """The latest apply (a verification's repair is none), one that changed no row too: time, rows, seconds.

    What the PostgreSQL target's state row says of its mirror. Read from the
    mirror's own metadata, so it is as durable as the mirror (it outlives
    Airflow's database): the ``cdc.mirror.last-apply`` property every apply's
    commit sets, else -- a mirror whose applies predate it -- the newest
    apply snapshot's summary within :data:`LAST_APPLY_SEARCH` snapshots of
    the head. None: neither.
    """
    recorded = parse_last_apply(table.metadata.properties)
    mark = read_mirror_watermark(table)
    if recorded is not None and mark is not None and recorded["ordinal"] >= mark.ordinal:
        return _without_ordinal(recorded)  # the apply that set the watermark: none can be newer
    newest = _newest_apply_snapshot(table)
    if recorded is not None and (newest is None or recorded["ordinal"] >= newest["ordinal"]):
        return _without_ordinal(recorded)
    return _without_ordinal(newest) if newest is not None else None


def _without_ordinal(found: dict) -> dict:
    return {k: v for k, v in found.items() if k != "ordinal"}


def _newest_apply_snapshot(table: Table) -> dict | None:
    snapshot = table.current_snapshot()
    for _ in range(LAST_APPLY_SEARCH):
        if snapshot is None:
            return None
        summary = snapshot.summary
        found = parse_apply(summary.additional_properties) if summary is not None else None
        if found is not None:
            marker = snapshot_marker(snapshot)
            return {"at_ms": snapshot.timestamp_ms, "ordinal": marker.ordinal if marker else -1, **found}
        parent = snapshot.parent_snapshot_id
        snapshot = table.metadata.snapshot_by_id(parent) if parent is not None else None
    return None


def source_schema_at(source: Table, snapshot_id: int | None) -> Schema:
    """The source's schema as of ``snapshot_id`` (its current schema when that snapshot is gone)."""
    snapshot = source.snapshot_by_id(snapshot_id) if snapshot_id is not None else None
    if snapshot is not None and snapshot.schema_id is not None:
        schemas = source.schemas()
        if snapshot.schema_id in schemas:
            return schemas[snapshot.schema_id]
    return source.schema()


def _identifier_fields(schema: Schema, key_columns: tuple[str, ...]) -> list[int]:
    fields = [schema.find_field(name) for name in key_columns]
    return [f.field_id for f in fields] if all(f.required for f in fields) else []


def create_or_load(
    catalog: Catalog,
    identifier: str,
    *,
    source_schema: Schema,
    source_spec: PartitionSpec,
    key_columns: tuple[str, ...],
    format_version: int,
    properties: Mapping[str, str] | None = None,
) -> tuple[Table, bool]:
    """The mirror table, created when missing; returns ``(table, created)``."""
    try:
        return catalog.load_table(identifier), False
    except NoSuchTableError:
        pass
    names = {f.name for f in source_schema.fields}
    missing = [name for name in key_columns if name not in names]
    if missing:
        raise MirrorStateError(f"mirror {identifier}: key columns {missing} are not in the source's schema")
    schema = Schema(
        *source_schema.fields,
        schema_id=source_schema.schema_id,
        identifier_field_ids=_identifier_fields(source_schema, key_columns),
    )
    namespace = identifier.rsplit(".", 1)[0]
    catalog.create_namespace_if_not_exists(namespace)
    version = max(2, int(format_version))
    table_properties = {"format-version": str(version), **(properties or {})}
    try:
        with writing_v3_metadata():
            table = catalog.create_table(
                identifier, schema=schema, partition_spec=source_spec, properties=table_properties
            )
    except TableAlreadyExistsError:  # another run created it meanwhile
        return catalog.load_table(identifier), False
    return table, True


def evolve(table: Table, source_schema: Schema) -> bool:
    """Take the source's added columns and widened types; keep dropped ones (optional). True if it changed."""
    before = table.schema()
    # A column the source no longer has is written as null from now on.
    names = {f.name for f in source_schema.fields}
    required_kept = [f.name for f in before.fields if f.required and f.name not in names]
    try:
        with writing_v3_metadata(), table.update_schema() as update:
            update.union_by_name(source_schema)
            for name in required_kept:
                update.make_column_optional(name)
    except (ValueError, TypeError) as exc:
        raise MirrorStateError(
            f"mirror {table.name()}: the source's schema cannot be applied to the mirror's ({exc}). "
            "Iceberg widens int -> long, float -> double and decimal precision only; to take another change "
            "drop the mirror: the next run creates it again from the changelog"
        ) from exc
    table.refresh()
    return table.schema() != before

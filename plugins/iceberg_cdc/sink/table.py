"""The sink table itself: creating it, its watermarks, and its commit markers.

**Layout.** The sink is unpartitioned. Every commit adds files holding the
changes of exactly one source snapshot, so each file's column bounds on
``_commit_snapshot_id`` and ``_change_ordinal`` are a single value and a scan
for one snapshot (or "after ordinal N") prunes files by those statistics alone.
Partitioning by ``identity(_commit_snapshot_id)`` would buy little more and
would keep one partition -- and at least one small file -- per source snapshot
forever, because compaction never merges across partitions; unpartitioned,
compaction can merge the many small per-snapshot files. A sink whose owner adds
an identity partition on a change column still works (the partition value is
derived from each file's bounds).

**Watermark.** Per source table, three sink table properties::

    cdc.watermark.<source identifier>.source-uuid
    cdc.watermark.<source identifier>.snapshot-id
    cdc.watermark.<source identifier>.ordinal

They live in the sink's metadata, never only in Airflow's database, and are
written in the same commit as the data they cover (:mod:`.commit`).

**Commit marker.** Each commit's snapshot summary carries ``cdc.source-table``,
``cdc.source-snapshot-id``, ``cdc.source-uuid`` and ``cdc.change-ordinal``
(:mod:`.summary` owns every ``cdc.*`` summary key); a commit whose marker is
already in the sink's history is not made again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError, TableAlreadyExistsError
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot, ancestors_of

from iceberg_cdc.errors import CdcError, SinkSchemaError
from iceberg_cdc.sink import field_ids
from iceberg_cdc.sink.columns import CHANGE_COLUMNS
from iceberg_cdc.sink.schema import evolve_sink_schema, sink_schema_for
from iceberg_cdc.sink.summary import (
    CHANGE_ORDINAL_KEY,
    INITIAL_LOAD_KEY,
    REPLACE_KEY,
    SOURCE_SNAPSHOT_ID_KEY,
    SOURCE_TABLE_KEY,
    SOURCE_UUID_KEY,
)
from iceberg_cdc.watermark import Watermark

T = TypeVar("T")

WATERMARK_PREFIX = "cdc.watermark."
_UUID_SUFFIX = ".source-uuid"
_SNAPSHOT_SUFFIX = ".snapshot-id"
_ORDINAL_SUFFIX = ".ordinal"


def watermark_property_names(source_identifier: str) -> tuple[str, str, str]:
    """The sink table properties of one source table's watermark: (uuid, snapshot id, ordinal)."""
    base = f"{WATERMARK_PREFIX}{source_identifier}"
    return base + _UUID_SUFFIX, base + _SNAPSHOT_SUFFIX, base + _ORDINAL_SUFFIX


def watermark_properties(source_identifier: str, watermark: Watermark) -> dict[str, str]:
    """The property values that record ``watermark`` for ``source_identifier``."""
    uuid_key, snapshot_key, ordinal_key = watermark_property_names(source_identifier)
    return {
        uuid_key: watermark.source_uuid,
        snapshot_key: str(watermark.snapshot_id),
        ordinal_key: str(watermark.ordinal),
    }


def watermark_from_properties(properties: Mapping[str, str], source_identifier: str) -> Watermark | None:
    """Parse a watermark from table properties; None when the source has none yet.

    A watermark with only some of its properties, or with values that are not
    numbers, was edited by hand: that is an error, not "start from scratch".
    """
    keys = watermark_property_names(source_identifier)
    values = [properties.get(key) for key in keys]
    if all(v is None for v in values):
        return None
    if any(v is None for v in values):
        present = [k for k, v in zip(keys, values, strict=True) if v is not None]
        raise CdcError(
            f"the sink's watermark for {source_identifier} is incomplete (only {', '.join(present)} "
            f"set); set all of {', '.join(keys)} or remove them all to start over"
        )
    uuid_value, snapshot_value, ordinal_value = values
    assert uuid_value is not None and snapshot_value is not None and ordinal_value is not None
    try:
        return Watermark(uuid_value, int(snapshot_value), int(ordinal_value))
    except ValueError:
        raise CdcError(
            f"the sink's watermark for {source_identifier} is not numeric "
            f"({keys[1]}={snapshot_value!r}, {keys[2]}={ordinal_value!r}); fix or remove those properties"
        ) from None


def read_watermark(sink_table: Table, source_identifier: str) -> Watermark | None:
    """The sink's watermark for one source table, from the table object's current metadata.

    Call ``sink_table.refresh()`` first when another process may have committed.
    """
    return watermark_from_properties(sink_table.properties, source_identifier)


def ensure_sink_table(
    catalog: Catalog,
    sink_identifier: str,
    source_schema: Schema,
    properties: Mapping[str, str] | None = None,
) -> Table:
    """Load the sink table, or create it (and its namespace) from the source schema.

    An existing sink is evolved to hold the source's current columns
    (:func:`~iceberg_cdc.sink.schema.evolve_sink_schema`). ``properties`` are
    only used when the table is created. A new sink gets its field-id mapping
    (:mod:`~iceberg_cdc.sink.field_ids`) in the commit that creates it. Two
    processes creating the same sink at once both end up with the one table.
    """
    try:
        table = catalog.load_table(sink_identifier)
    except NoSuchTableError:
        namespace = Catalog.namespace_from(sink_identifier)
        if namespace:
            catalog.create_namespace_if_not_exists(namespace)
        try:
            return _create(catalog, sink_identifier, source_schema, properties)
        except (TableAlreadyExistsError, CommitFailedException):
            table = catalog.load_table(sink_identifier)
    _named(sink_identifier, evolve_sink_schema, table, source_schema)
    return table


def _create(
    catalog: Catalog, sink_identifier: str, source_schema: Schema, properties: Mapping[str, str] | None
) -> Table:
    """Create the sink with its mapping in one commit: the ids are the ones the creation assigns."""
    txn = catalog.create_table_transaction(
        sink_identifier,
        schema=_named(sink_identifier, sink_schema_for, source_schema),
        properties=dict(properties or {}),
    )
    created = txn.table_metadata.schema().as_struct()
    mapping = field_ids.pair_by_name(created, source_schema.as_struct(), skip=CHANGE_COLUMNS)
    txn.set_properties({field_ids.PROPERTY: field_ids.encode(mapping)})
    txn.commit_transaction()
    return catalog.load_table(sink_identifier)  # the transaction's table is a staged one, not for use


def _named(sink_identifier: str, function: Callable[..., T], *args: object) -> T:
    """``function(*args)``, with a SinkSchemaError's message saying which sink table it is about."""
    try:
        return function(*args)
    except SinkSchemaError as exc:
        raise SinkSchemaError(f"sink table {sink_identifier}: {exc}") from None


def summary_properties(snapshot: Snapshot) -> Mapping[str, str]:
    """A snapshot's summary as a plain mapping.

    pyiceberg's ``Summary.get(key, default)`` returns None, not ``default``, for
    a missing key (its ``__getitem__`` never raises), so read the dict instead.
    """
    return snapshot.summary.additional_properties if snapshot.summary is not None else {}


def marker_matches(
    snapshot: Snapshot, source_identifier: str, snapshot_id: int, source_uuid: str | None = None
) -> bool:
    """True if ``snapshot`` is the sink commit of that source table's snapshot."""
    summary = summary_properties(snapshot)
    if summary.get(SOURCE_TABLE_KEY) != source_identifier:
        return False
    if summary.get(SOURCE_SNAPSHOT_ID_KEY) != str(snapshot_id):
        return False
    return source_uuid is None or summary.get(SOURCE_UUID_KEY) == source_uuid


def find_commit(
    sink_table: Table,
    source_identifier: str,
    snapshot_id: int,
    *,
    ordinal: int | None = None,
    source_uuid: str | None = None,
) -> Snapshot | None:
    """The sink snapshot that committed ``snapshot_id`` of ``source_identifier``, or None.

    Searches the current sink snapshot's ancestry, newest first: a commit that
    was rolled back out of the sink's history no longer counts. With
    ``ordinal`` given the search stops at the first ordinary commit of the same
    source with a lower ordinal -- commits of one source are made in ordinal
    order (the watermark refuses anything else), so the marker cannot be older.
    Reprocess commits (``cdc.replace``) never stop the search. With
    ``source_uuid`` given, only that incarnation of the source table matches.
    """
    metadata = sink_table.metadata
    for snapshot in ancestors_of(sink_table.current_snapshot(), metadata):
        if marker_matches(snapshot, source_identifier, snapshot_id, source_uuid):
            return snapshot
        if ordinal is not None and _ends_search(snapshot, source_identifier, ordinal, source_uuid):
            return None
    return None


def loaded_in_full(sink_table: Table, source_identifier: str, snapshot_id: int, *, start: str) -> bool:
    """Whether the sink holds source snapshot ``snapshot_id`` as an initial load (its whole state).

    Commits since this marker existed carry :data:`INITIAL_LOAD_KEY`. An older
    sink's initial load is recognised as the oldest commit of the source in the
    sink when the table starts at ``latest``.
    """
    found = find_commit(sink_table, source_identifier, snapshot_id)
    if found is None:
        return False
    summary = summary_properties(found)
    if INITIAL_LOAD_KEY in summary:
        return summary[INITIAL_LOAD_KEY] == "true"
    if start != "latest":
        return False
    metadata = sink_table.metadata
    ours = [
        s
        for s in ancestors_of(sink_table.current_snapshot(), metadata)
        if summary_properties(s).get(SOURCE_TABLE_KEY) == source_identifier
    ]
    return bool(ours) and ours[-1].snapshot_id == found.snapshot_id


def _ends_search(snapshot: Snapshot, source_identifier: str, ordinal: int, source_uuid: str | None) -> bool:
    summary = summary_properties(snapshot)
    if summary.get(SOURCE_TABLE_KEY) != source_identifier:
        return False
    if summary.get(REPLACE_KEY) == "true":
        return False
    if source_uuid is not None and summary.get(SOURCE_UUID_KEY) != source_uuid:
        return False
    try:
        return int(summary.get(CHANGE_ORDINAL_KEY, "")) < ordinal
    except ValueError:
        return False

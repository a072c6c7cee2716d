"""What one source snapshot changed, at the level of files.

pyiceberg 0.12 has no changelog scan, so the changes of snapshot S are read
from S's own manifests: the manifests whose ``added_snapshot_id`` is S hold
every entry S wrote, with status ADDED (files S added) or DELETED (files S
removed). EXISTING entries are files carried over unchanged — manifest merging
and manifest rewrites produce them — and are ignored.

Entries are attributed by their *manifest*, never by the entry's own
``snapshot_id``: tables written by pyiceberg <= 0.11 carry a wrong snapshot id
on DELETED entries. Conversely pyiceberg 0.12 carries the parent's
DELETED-only manifests into the next snapshot's manifest list (measured: the
second snapshot of ``overwrite()`` lists the first one's delete manifest), so
keying on the manifest is also what keeps a removal from being counted twice.

**Merge-on-read.** When delete files are live in the snapshot or its parent,
a file's rows are its *live* rows (:mod:`iceberg_cdc.source.deletes`): the
snapshot removes the live rows (in the parent) of the data files it removes,
adds the live rows (in the snapshot) of the data files it adds, and for a data
file kept in both, removes the rows its new delete files delete (and adds back
rows whose delete file it dropped without rewriting the data, which a valid
history only does for rows already gone). Each input file carries the delete
files to apply (``deletes``) and, for a kept file, the ones a row must match
to count (``require``); executors do the matching. Delete files that cannot be
read yet (deletion vectors, ORC/Avro deletes) make the snapshot unsupported,
with the way out in the message (:func:`require_supported`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pyiceberg.manifest import ManifestContent, ManifestEntry, ManifestEntryStatus, ManifestFile
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.types import NestedField

from iceberg_cdc.errors import SourceHistoryError, UnsupportedSnapshotError
from iceberg_cdc.pyiceberg_internals.manifest_reader import manifest_first_row_ids
from iceberg_cdc.source.change_files import DataFileRef, SnapshotChanges, identity_partition_values
from iceberg_cdc.source.delete_scope import manifest_filter
from iceberg_cdc.source.deletes import DeleteFileRef, DeleteIndex, partition_key
from iceberg_cdc.source.key_ranges import key_range
from iceberg_cdc.source.lineage import assign_first_row_ids
from iceberg_cdc.source.manifests import manifest_entries


def table_name(table: Table) -> str:
    """The table's identifier as ``namespace.table``, for error messages."""
    return ".".join(table.name())


class _Lineage:
    """First row ids of the data files read so far, on a format-v3 table (else it knows none)."""

    def __init__(self, table: Table, snapshot: Snapshot | None) -> None:
        self.enabled = table.metadata.format_version >= 3 and snapshot is not None
        self._manifests = manifest_first_row_ids(table.io, snapshot) if self.enabled else {}
        self.first_row_ids: dict[str, int] = {}

    def read(self, manifest: ManifestFile, entries: list[ManifestEntry]) -> list[ManifestEntry]:
        if self.enabled and manifest.content == ManifestContent.DATA:
            first = self._manifests.get(manifest.manifest_path)
            self.first_row_ids.update(assign_first_row_ids(entries, first))
        return entries


def _key_field(table: Table, field_id: int | None) -> NestedField | None:
    """The identifier field whose manifest bounds may split large partitions (None: do not split)."""
    if field_id is None:
        return None
    try:
        return table.schema().find_field(field_id)
    except ValueError:
        return None


def _ref(
    entry: ManifestEntry,
    specs: Mapping[int, PartitionSpec],
    deletes: Iterable[str] = (),
    require: Iterable[str] = (),
    lineage: _Lineage | None = None,
    key_field: NestedField | None = None,
) -> DataFileRef:
    data_file = entry.data_file
    spec = specs.get(int(data_file.spec_id))
    v3 = lineage is not None and lineage.enabled
    return DataFileRef(
        path=data_file.file_path,
        size=int(data_file.file_size_in_bytes),
        record_count=int(data_file.record_count),
        spec_id=int(data_file.spec_id),
        partition_values=None if spec is None else identity_partition_values(spec, data_file),
        deletes=tuple(sorted(deletes)),
        require=tuple(sorted(require)),
        partition=partition_key(data_file),
        first_row_id=lineage.first_row_ids.get(data_file.file_path) if v3 else None,
        sequence_number=int(entry.sequence_number) if v3 and entry.sequence_number is not None else None,
        key_range=key_range(data_file, key_field),
    )


def _by_path(refs: Iterable[DataFileRef]) -> tuple[DataFileRef, ...]:
    """Files in path order, so equal snapshots give equal values whatever the manifest order."""
    return tuple(sorted(refs, key=lambda ref: ref.path))


def _snapshot(table: Table, snapshot_id: int) -> Snapshot:
    snapshot = table.metadata.snapshot_by_id(snapshot_id)
    if snapshot is None:
        raise SourceHistoryError(
            f"Snapshot {snapshot_id} of table {table_name(table)} does not exist (expired, or never "
            "part of this table), so its changes cannot be read. Reset the sink's watermark to a "
            "snapshot that still exists, or start a new sink."
        )
    return snapshot


def _header(table: Table, snapshot: Snapshot) -> dict[str, Any]:
    operation = snapshot.summary.operation.value if snapshot.summary is not None else "unknown"
    schema_id = snapshot.schema_id if snapshot.schema_id is not None else table.metadata.current_schema_id
    return {
        "snapshot_id": snapshot.snapshot_id,
        "parent_id": snapshot.parent_snapshot_id,
        "operation": operation,
        "sequence_number": int(snapshot.sequence_number or 0),
        "timestamp_ms": int(snapshot.timestamp_ms),
        "schema_id": int(schema_id),
    }


def _live_entries(
    table: Table,
    snapshot: Snapshot | None,
    content: ManifestContent,
    may_hold: Callable[[ManifestFile], bool] | None = None,
    lineage: _Lineage | None = None,
) -> list[ManifestEntry]:
    """Every live entry (ADDED or EXISTING) of the snapshot's manifests of one content type.

    ``may_hold``: read only the manifests it accepts. ``lineage``: notes the
    data files' first row ids (the snapshot's own manifests only).
    """
    if snapshot is None:
        return []
    entries: list[ManifestEntry] = []
    for manifest in snapshot.manifests(table.io):
        if manifest.content == content and (may_hold is None or may_hold(manifest)):
            found = manifest_entries(table.io, manifest, table.metadata.format_version)
            entries.extend(lineage.read(manifest, found) if lineage is not None else found)
    return entries


def _delete_index(table: Table, snapshot: Snapshot | None, schema_id: int) -> DeleteIndex:
    schemas = table.schemas()
    schema = schemas.get(schema_id, table.schema())
    return DeleteIndex(_live_entries(table, snapshot, ManifestContent.DELETES), table.specs(), schema)


def _used_refs(refs: Iterable[DataFileRef], *indexes: DeleteIndex) -> dict[str, DeleteFileRef]:
    used: dict[str, DeleteFileRef] = {}
    for ref in refs:
        for path in (*ref.deletes, *ref.require):
            for index in indexes:
                if path in index.refs:
                    used[path] = index.refs[path]
                    break
    return used


def _kept_file(
    old: ManifestEntry,
    new: ManifestEntry,
    before: DeleteIndex,
    after: DeleteIndex,
    lineages: tuple[_Lineage, _Lineage],
    specs: Mapping[int, PartitionSpec],
    key_field: NestedField | None,
    deleted: list[DataFileRef],
    added: list[DataFileRef],
) -> None:
    """A data file live in both states whose delete files differ: the rows the new deletes delete are
    removed (read with the old deletes, ``require`` the new), the rows the old deletes deleted and the
    new do not are added back."""
    deletes_before, deletes_after = before.for_data_file(old), after.for_data_file(new)
    if deletes_after - deletes_before:
        deleted.append(
            _ref(old, specs, deletes_before, deletes_after - deletes_before, lineages[0], key_field)
        )
    if deletes_before - deletes_after:
        added.append(_ref(new, specs, deletes_after, deletes_before - deletes_after, lineages[1], key_field))


def snapshot_changes(table: Table, snapshot_id: int, key_field_id: int | None = None) -> SnapshotChanges:
    """The live rows ``snapshot_id`` removed and added, as files (and delete files) to read.

    Raises :class:`SourceHistoryError` when the snapshot is not in the table's
    metadata (expired).
    """
    snapshot = _snapshot(table, snapshot_id)
    specs = table.specs()
    lineage = _Lineage(table, snapshot)
    key_field = _key_field(table, key_field_id)
    added_entries: list[ManifestEntry] = []
    deleted_entries: list[ManifestEntry] = []
    delete_files: list[str] = []
    for manifest in snapshot.manifests(table.io):
        if manifest.added_snapshot_id != snapshot_id:
            continue  # written by an earlier snapshot (and carried over): not this snapshot's changes
        entries = manifest_entries(table.io, manifest, table.metadata.format_version, discard_deleted=False)
        for entry in lineage.read(manifest, entries):
            if manifest.content == ManifestContent.DELETES:
                if entry.status == ManifestEntryStatus.ADDED:
                    delete_files.append(entry.data_file.file_path)
            elif entry.status == ManifestEntryStatus.ADDED:
                added_entries.append(entry)
            elif entry.status == ManifestEntryStatus.DELETED:
                deleted_entries.append(entry)
    header = _header(table, snapshot)
    if header["operation"] == "replace":  # same rows in new files: nothing of it is read
        return SnapshotChanges(
            **header,
            added=_by_path(_ref(e, specs) for e in added_entries),
            deleted=_by_path(_ref(e, specs) for e in deleted_entries),
            delete_files=tuple(sorted(set(delete_files))),
        )
    parent = (
        table.metadata.snapshot_by_id(snapshot.parent_snapshot_id)
        if snapshot.parent_snapshot_id is not None
        else None
    )
    before = _delete_index(table, parent, header["schema_id"])
    after = _delete_index(table, snapshot, header["schema_id"])
    deleted = [
        _ref(e, specs, before.for_data_file(e), lineage=lineage, key_field=key_field) for e in deleted_entries
    ]
    added = [
        _ref(e, specs, after.for_data_file(e), lineage=lineage, key_field=key_field) for e in added_entries
    ]
    new_deletes, dropped_deletes = set(after.refs) - set(before.refs), set(before.refs) - set(after.refs)
    if new_deletes or dropped_deletes:
        # Data files kept by the snapshot whose live rows its delete files changed, in the
        # manifests that can hold one.
        added_paths = {e.data_file.file_path for e in added_entries}
        changed = [after.files[k] for k in new_deletes] + [before.files[k] for k in dropped_deletes]
        schema = table.schemas().get(header["schema_id"], table.schema())
        may_hold = manifest_filter(changed, specs, schema)
        for entry in _live_entries(table, snapshot, ManifestContent.DATA, may_hold, lineage):
            if entry.data_file.file_path in added_paths:
                continue
            _kept_file(entry, entry, before, after, (lineage, lineage), specs, key_field, deleted, added)
    return SnapshotChanges(
        **header,
        added=_by_path(added),
        deleted=_by_path(deleted),
        delete_files=tuple(sorted(set(delete_files))),
        delete_refs=_used_refs([*deleted, *added], after, before),
        unsupported=tuple(dict.fromkeys([*after.unsupported, *before.unsupported])),
    )


BRIDGE_OPERATION = "bridge"  # the operation a bridge's changes carry (the sink summary, the story)


def bridge_changes(
    table: Table, base_id: int, target_id: int, key_field_id: int | None = None
) -> SnapshotChanges:
    """The live rows of ``base_id``'s state that ``target_id``'s lacks, and those it has in their place.

    A bridge over a gap in the history (:class:`~iceberg_cdc.source.history.HistoryGap`):
    the same kind of changes a snapshot has, between two whole states. Data
    files live in both with the same delete files cancel out unread (their
    rows are in both states); a file only in the base is removed (its live
    rows there), one only in the target added (its live rows there), and a
    file in both whose delete files differ removes the rows the target's new
    deletes delete and adds back those the base deleted and the target does
    not (a rollback undoes deletes). The rest of the pipeline -- carryover,
    update pairing, conservation -- treats it as one snapshot's changes, so
    ``state(base) - removed + added == state(target)``.
    """
    base, target = _snapshot(table, base_id), _snapshot(table, target_id)
    specs = table.specs()
    key_field = _key_field(table, key_field_id)
    header = _header(table, target)
    header.update(parent_id=base_id, operation=BRIDGE_OPERATION)
    before = _delete_index(table, base, header["schema_id"])
    after = _delete_index(table, target, header["schema_id"])
    base_lineage, target_lineage = _Lineage(table, base), _Lineage(table, target)
    in_base = {
        e.data_file.file_path: e for e in _live_entries(table, base, ManifestContent.DATA, None, base_lineage)
    }
    in_target = {
        e.data_file.file_path: e
        for e in _live_entries(table, target, ManifestContent.DATA, None, target_lineage)
    }
    deleted = [
        _ref(e, specs, before.for_data_file(e), lineage=base_lineage, key_field=key_field)
        for path, e in in_base.items()
        if path not in in_target
    ]
    added = [
        _ref(e, specs, after.for_data_file(e), lineage=target_lineage, key_field=key_field)
        for path, e in in_target.items()
        if path not in in_base
    ]
    for path in in_base.keys() & in_target.keys():
        lineages = (base_lineage, target_lineage)
        _kept_file(in_base[path], in_target[path], before, after, lineages, specs, key_field, deleted, added)
    return SnapshotChanges(
        **header,
        added=_by_path(added),
        deleted=_by_path(deleted),
        delete_refs=_used_refs([*deleted, *added], after, before),
        unsupported=tuple(dict.fromkeys([*after.unsupported, *before.unsupported])),
    )


def initial_load_changes(table: Table, snapshot_id: int) -> SnapshotChanges:
    """The whole state of ``snapshot_id`` as added files: the start of a sink that begins at ``latest``.

    Every live data file (ADDED or EXISTING in any of the snapshot's data
    manifests) is listed as added, with the live delete files that apply to
    it, so the kind is ``insert_only`` and only live rows are loaded.
    """
    snapshot = _snapshot(table, snapshot_id)
    specs = table.specs()
    header = _header(table, snapshot)
    header["operation"] = "append"  # the load inserts the current rows, whatever made the snapshot
    index = _delete_index(table, snapshot, header["schema_id"])
    added = [
        _ref(e, specs, index.for_data_file(e)) for e in _live_entries(table, snapshot, ManifestContent.DATA)
    ]
    return SnapshotChanges(
        **header,
        added=_by_path(added),
        deleted=(),
        delete_refs=_used_refs(added, index),
        unsupported=tuple(index.unsupported),
    )


_RESTART_FROM_COMPACTED = (
    "compact the table so no delete file is live (Spark: rewrite_data_files with "
    "delete-file-threshold=1, or rewrite_position_delete_files), then restart the sink from the "
    "compacted state: drop the sink table (the next run creates it again) and set `start: latest` "
    "for this table, so the next run loads the current rows as INSERTs"
)


def _rollback_hint(changes: SnapshotChanges) -> str:
    parent = changes.parent_id if changes.parent_id is not None else "<its parent>"
    return (
        f"roll the table back to snapshot {parent}, the one before it (Spark: CALL "
        f"system.rollback_to_snapshot('<table>', {parent}); pyiceberg: "
        f"table.manage_snapshots().rollback_to_snapshot({parent}).commit(); this also drops any "
        "snapshot after it) and make the change again with Parquet position/equality deletes or "
        "copy-on-write"
    )


def require_supported(changes: SnapshotChanges) -> None:
    """Fail a snapshot whose live rows depend on delete files this release cannot read.

    ``replace`` snapshots pass: they are skipped and nothing of them is read.
    Position and equality delete files in Parquet and deletion vectors are
    applied; ORC/Avro delete files are not, nor a data file with two live
    deletion vectors (the spec allows one). The message says
    which file and both ways out. Nothing has been committed by then, so the
    watermark stays before the snapshot.
    """
    if changes.kind == "replace" or not changes.unsupported:
        return
    unsupported = (
        "Nothing was committed; the sink's watermark stays before this snapshot, and every run fails "
        "here until the table's history changes."
    )
    ways_out = (
        f"either {_rollback_hint(changes)}, or {_RESTART_FROM_COMPACTED}"
        if changes.deleted or changes.delete_files
        else _RESTART_FROM_COMPACTED
    )
    raise UnsupportedSnapshotError(
        f"Snapshot {changes.snapshot_id} has {len(changes.unsupported)} live delete file(s) the pipeline "
        f"cannot apply: {changes.unsupported[0]}. {unsupported} To go on, {ways_out}."
    )

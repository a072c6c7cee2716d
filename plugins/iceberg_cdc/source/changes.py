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

Merge-on-read delete files (position / equality deletes, deletion vectors) are
recorded but not handled: :func:`require_supported` rejects any snapshot that
needs them, with the fix in the message.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pyiceberg.manifest import DataFile, DataFileContent, ManifestContent, ManifestEntry, ManifestEntryStatus
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.transforms import IdentityTransform

from iceberg_cdc.errors import SourceHistoryError, UnsupportedSnapshotError
from iceberg_cdc.source.reading import partition_value_to_json

PartitionValues = Mapping[int, Any]
"""Identity-partition values of one data file: source field id -> value in JSON form."""

ChangeKind = Literal["replace", "insert_only", "with_deletes", "empty"]


def table_name(table: Table) -> str:
    """The table's identifier as ``namespace.table``, for error messages."""
    return ".".join(table.name())


def partition_values_to_dict(values: PartitionValues | None) -> dict[str, Any] | None:
    """JSON object form: field ids as string keys (JSON has no integer keys)."""
    return None if values is None else {str(field_id): value for field_id, value in sorted(values.items())}


def partition_values_from_dict(data: Mapping[str, Any] | None) -> dict[int, Any] | None:
    return None if data is None else {int(field_id): value for field_id, value in data.items()}


def identity_partition_values(spec: PartitionSpec, data_file: DataFile) -> dict[int, Any] | None:
    """The file's identity-partition values, by source field id, in JSON form; ``None`` when it has none.

    Only identity transforms give a column's value (a bucket or a day does not);
    null values are left out, since a column the file lacks comes out null anyway.
    Executors need these to fill partition columns missing from files
    written without them (Hive layout; see :mod:`iceberg_cdc.source.reading`).
    """
    partition = data_file.partition
    values = {}
    for position, partition_field in enumerate(spec.fields):
        if not isinstance(partition_field.transform, IdentityTransform) or position >= len(partition):
            continue
        value = partition[position]
        if value is not None:
            values[partition_field.source_id] = partition_value_to_json(value)
    return values or None


@dataclass(frozen=True)
class DataFileRef:
    """One data file a snapshot added or removed: what a write task needs to read it.

    ``partition_values``: identity-partition values (:func:`identity_partition_values`).
    """

    path: str
    size: int
    record_count: int
    spec_id: int
    partition_values: PartitionValues | None = field(default=None, hash=False)

    def to_dict(self) -> dict[str, Any]:
        data = {
            "path": self.path,
            "size": self.size,
            "record_count": self.record_count,
            "spec_id": self.spec_id,
        }
        if self.partition_values is not None:  # absent when none: older readers and plans stay valid
            data["partition_values"] = partition_values_to_dict(self.partition_values)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DataFileRef:
        return cls(
            path=str(data["path"]),
            size=int(data["size"]),
            record_count=int(data["record_count"]),
            spec_id=int(data["spec_id"]),
            partition_values=partition_values_from_dict(data.get("partition_values")),
        )


@dataclass(frozen=True)
class SnapshotChanges:
    """The files one snapshot added and removed, and how the pipeline must treat it.

    ``delete_files`` are merge-on-read delete files the snapshot added.
    ``inherited_delete_files`` are live delete files from earlier snapshots that
    may apply to rows this change reads (the removed data files, or for an
    initial load the live ones): reading those data files raw would report rows
    that were already deleted. Both make the snapshot unsupported for now.
    """

    snapshot_id: int
    parent_id: int | None
    operation: str
    sequence_number: int
    timestamp_ms: int
    schema_id: int
    added: tuple[DataFileRef, ...]
    deleted: tuple[DataFileRef, ...]
    delete_files: tuple[str, ...] = ()
    inherited_delete_files: tuple[str, ...] = ()

    @property
    def kind(self) -> ChangeKind:
        """How the pipeline handles the snapshot.

        ``replace`` (compaction: same rows in new files) is skipped whatever it
        touched. A snapshot that added delete files counts as ``with_deletes``
        even without removed data files, so it can never pass as ``empty`` —
        callers still run :func:`require_supported` first, which rejects it.
        """
        if self.operation == "replace":
            return "replace"
        if self.deleted or self.delete_files:
            return "with_deletes"
        if self.added:
            return "insert_only"
        return "empty"

    def to_dict(self) -> dict[str, Any]:
        return {
            "snapshot_id": self.snapshot_id,
            "parent_id": self.parent_id,
            "operation": self.operation,
            "sequence_number": self.sequence_number,
            "timestamp_ms": self.timestamp_ms,
            "schema_id": self.schema_id,
            "added": [f.to_dict() for f in self.added],
            "deleted": [f.to_dict() for f in self.deleted],
            "delete_files": list(self.delete_files),
            "inherited_delete_files": list(self.inherited_delete_files),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SnapshotChanges:
        parent = data.get("parent_id")
        return cls(
            snapshot_id=int(data["snapshot_id"]),
            parent_id=None if parent is None else int(parent),
            operation=str(data["operation"]),
            sequence_number=int(data["sequence_number"]),
            timestamp_ms=int(data["timestamp_ms"]),
            schema_id=int(data["schema_id"]),
            added=tuple(DataFileRef.from_dict(f) for f in data["added"]),
            deleted=tuple(DataFileRef.from_dict(f) for f in data["deleted"]),
            delete_files=tuple(str(p) for p in data.get("delete_files", ())),
            inherited_delete_files=tuple(str(p) for p in data.get("inherited_delete_files", ())),
        )


def _ref(entry: ManifestEntry, specs: Mapping[int, PartitionSpec]) -> DataFileRef:
    data_file = entry.data_file
    spec = specs.get(int(data_file.spec_id))
    return DataFileRef(
        path=data_file.file_path,
        size=int(data_file.file_size_in_bytes),
        record_count=int(data_file.record_count),
        spec_id=int(data_file.spec_id),
        partition_values=None if spec is None else identity_partition_values(spec, data_file),
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


def _delete_files_applying_to(
    table: Table, snapshot: Snapshot | None, data_entries: list[ManifestEntry]
) -> tuple[str, ...]:
    """Live delete files of ``snapshot`` that may apply to any of ``data_entries``.

    Conservative and cheap: a position delete (or deletion vector) can apply
    to a data file only when its data sequence number is >= the data file's,
    an equality delete only when it is >; a delete naming its one referenced
    data file applies to that file only. Partitions are not compared, so a
    dangling delete of another partition can still make a snapshot fail, with
    the same fix (compaction, which removes or outdates the delete files).
    """
    if snapshot is None or not data_entries:
        return ()
    manifests = [m for m in snapshot.manifests(table.io) if m.content == ManifestContent.DELETES]
    if not manifests:
        return ()
    min_seq = min(int(e.sequence_number or 0) for e in data_entries)
    paths = {e.data_file.file_path for e in data_entries}
    found: set[str] = set()
    for manifest in manifests:
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            delete_file = entry.data_file
            seq = int(entry.sequence_number or 0)
            if delete_file.content == DataFileContent.EQUALITY_DELETES:
                applies = seq > min_seq
            else:
                referenced = getattr(delete_file, "referenced_data_file", None)
                applies = seq >= min_seq and (referenced is None or referenced in paths)
            if applies:
                found.add(delete_file.file_path)
    return tuple(sorted(found))


def snapshot_changes(table: Table, snapshot_id: int) -> SnapshotChanges:
    """The files ``snapshot_id`` added and removed, read from the manifests it wrote.

    Raises :class:`SourceHistoryError` when the snapshot is not in the table's
    metadata (expired).
    """
    snapshot = _snapshot(table, snapshot_id)
    specs = table.specs()
    added: list[DataFileRef] = []
    deleted_entries: list[ManifestEntry] = []
    delete_files: list[str] = []
    for manifest in snapshot.manifests(table.io):
        if manifest.added_snapshot_id != snapshot_id:
            continue  # written by an earlier snapshot (and carried over): not this snapshot's changes
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
            if manifest.content == ManifestContent.DELETES:
                if entry.status == ManifestEntryStatus.ADDED:
                    delete_files.append(entry.data_file.file_path)
            elif entry.status == ManifestEntryStatus.ADDED:
                added.append(_ref(entry, specs))
            elif entry.status == ManifestEntryStatus.DELETED:
                deleted_entries.append(entry)
    header = _header(table, snapshot)
    inherited: tuple[str, ...] = ()
    if deleted_entries and header["operation"] != "replace" and snapshot.parent_snapshot_id is not None:
        parent = table.metadata.snapshot_by_id(snapshot.parent_snapshot_id)
        inherited = _delete_files_applying_to(table, parent, deleted_entries)
    return SnapshotChanges(
        **header,
        added=_by_path(added),
        deleted=_by_path(_ref(e, specs) for e in deleted_entries),
        delete_files=tuple(sorted(delete_files)),
        inherited_delete_files=inherited,
    )


def initial_load_changes(table: Table, snapshot_id: int) -> SnapshotChanges:
    """The whole state of ``snapshot_id`` as added files: the start of a sink that begins at ``latest``.

    Every live data file (ADDED or EXISTING in any of the snapshot's data
    manifests) is listed as added, so the kind is ``insert_only``; live delete
    files that may apply to them are recorded as inherited, and make the load
    unsupported.
    """
    snapshot = _snapshot(table, snapshot_id)
    specs = table.specs()
    live: list[ManifestEntry] = []
    for manifest in snapshot.manifests(table.io):
        if manifest.content == ManifestContent.DATA:
            live.extend(manifest.fetch_manifest_entry(table.io, discard_deleted=True))
    header = _header(table, snapshot)
    header["operation"] = "append"  # the load inserts the current rows, whatever made the snapshot
    return SnapshotChanges(
        **header,
        added=_by_path(_ref(e, specs) for e in live),
        deleted=(),
        inherited_delete_files=_delete_files_applying_to(table, snapshot, live),
    )


_RESTART_FROM_COMPACTED = (
    "compact the table so no delete file is live (Spark: rewrite_data_files with "
    "delete-file-threshold=1, or rewrite_position_delete_files), then restart the sink from the "
    "compacted state: drop the sink table (the next run creates it again) and set `start: latest` "
    "for this table, so the next run loads the current rows as INSERTs"
)
_COPY_ON_WRITE = (
    "To keep it from happening again, set the table's write.delete.mode, write.update.mode and "
    "write.merge.mode to copy-on-write."
)


def _rollback_hint(changes: SnapshotChanges) -> str:
    parent = changes.parent_id if changes.parent_id is not None else "<its parent>"
    return (
        f"roll the table back to snapshot {parent}, the one before it (Spark: CALL "
        f"system.rollback_to_snapshot('<table>', {parent}); pyiceberg: "
        f"table.manage_snapshots().rollback_to_snapshot({parent}).commit(); this also drops any "
        "snapshot after it) and make the change again with copy-on-write"
    )


def require_supported(changes: SnapshotChanges) -> None:
    """Fail a snapshot whose rows cannot be read without applying merge-on-read delete files.

    ``replace`` snapshots pass: they are skipped and nothing of them is read.
    The message says why (the pipeline reads data files only) and both ways
    out: redo the change copy-on-write after a rollback, or compact and restart
    the sink from the compacted state. Nothing has been committed by then, so
    the watermark stays before the snapshot.
    """
    if changes.kind == "replace":
        return
    unsupported = (
        "Merge-on-read deletes are not supported yet: the pipeline reads data files only. Nothing "
        "was committed; the sink's watermark stays before this snapshot, and every run fails here "
        "until the table's history changes."
    )
    if changes.delete_files:
        raise UnsupportedSnapshotError(
            f"Snapshot {changes.snapshot_id} added {len(changes.delete_files)} delete file(s) "
            f"(position/equality deletes or deletion vectors), e.g. {changes.delete_files[0]}. "
            f"{unsupported} To go on, either {_rollback_hint(changes)}, or {_RESTART_FROM_COMPACTED}. "
            f"{_COPY_ON_WRITE}"
        )
    if changes.inherited_delete_files:
        ways_out = (
            f"either {_rollback_hint(changes)}, or {_RESTART_FROM_COMPACTED}"
            if changes.deleted
            else _RESTART_FROM_COMPACTED
        )
        raise UnsupportedSnapshotError(
            f"Snapshot {changes.snapshot_id} reads data files that {len(changes.inherited_delete_files)} "
            f"earlier delete file(s) may apply to, e.g. {changes.inherited_delete_files[0]}; reading "
            f"them without applying those deletes would report rows that were already deleted. "
            f"{unsupported} To go on, {ways_out}. {_COPY_ON_WRITE}"
        )

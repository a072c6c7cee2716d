"""One snapshot that adds and removes data and delete files: a row delta, as Iceberg's ``RowDelta``.

pyiceberg 0.12's snapshot producers append data files or rewrite them; none
adds delete files, and none writes v3 manifests. :class:`RowDelta` is an
``UpdateTableMetadata`` of its own (pyiceberg's base class for one table
update inside a transaction) that builds the whole snapshot:

* the parent's manifests are kept as they are, except the ones named as
  holding a file to remove: those are rewritten with that entry ``DELETED``
  (status 2, this snapshot's id) and every other entry ``EXISTING`` with its
  sequence numbers, in a manifest of the same content and spec;
* the added files go into new manifests, one per (content, spec), entries
  ``ADDED`` with sequence numbers inherited from the manifest list;
* manifests and the list are written by :mod:`.manifests` (spec schemas, v2
  or v3), the summary by pyiceberg's collector (totals carried from the
  parent), and on v3 the snapshot's ``first-row-id`` / ``added-rows``;
* the commit asserts that ``main`` is still at the parent the delta was
  built on: the delete positions were found in that snapshot's files, so a
  concurrent change must fail the commit, never be merged over.

A removed file is named by its key: its path, plus the blob offset for a
deletion vector (one Puffin file holds many DVs).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from pyiceberg.manifest import DataFile, DataFileContent, ManifestContent, ManifestEntry, ManifestEntryStatus
from pyiceberg.table import TableProperties, Transaction
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.snapshots import (
    Operation,
    Snapshot,
    SnapshotSummaryCollector,
    Summary,
    update_snapshot_summaries,
)
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertRefSnapshotId,
    SetPropertiesUpdate,
    SetSnapshotRefUpdate,
    UpdatesAndRequirements,
    UpdateTableMetadata,
)

from iceberg_cdc.errors import StaleDeltaError
from iceberg_cdc.pyiceberg_internals.format_v3 import next_row_id
from iceberg_cdc.pyiceberg_internals.manifest_reader import manifest_entries, v3_field
from iceberg_cdc.pyiceberg_internals.manifests import (
    SpecManifestListWriter,
    SpecManifestWriter,
    as_record,
    read_manifest_list,
)

FileKey = tuple[str, int | None]


def file_key(data_file: DataFile) -> FileKey:
    """How a delta names a live file: its path, and a deletion vector's blob offset."""
    return data_file.file_path, v3_field(data_file, "content_offset")


class RowDelta(UpdateTableMetadata["RowDelta"]):
    """Add ``add`` and remove the files ``remove`` names, in one snapshot on ``main`` (see module doc).

    ``remove``: manifest path -> keys of the files to remove from it (the
    manifests of ``base_snapshot_id``, the snapshot the delta was planned on).
    After ``commit()``, :attr:`snapshot_id` is the new snapshot's id.
    """

    def __init__(
        self,
        transaction: Transaction,
        *,
        base_snapshot_id: int | None,
        add: Sequence[DataFile],
        remove: Mapping[str, Sequence[FileKey]],
        operation: Operation,
        properties: Mapping[str, str],
    ) -> None:
        super().__init__(transaction)
        metadata = transaction.table_metadata
        self._io = transaction._table.io
        self._base = base_snapshot_id
        self._add = [as_record(f) for f in add]
        self._remove = {path: set(keys) for path, keys in remove.items() if keys}
        self._operation = operation
        self._properties = dict(properties)
        self._version = int(metadata.format_version)
        self.snapshot_id = metadata.new_snapshot_id()
        self._commit_uuid = uuid.uuid4()
        self._counter = 0
        self._compression = metadata.properties.get(
            TableProperties.WRITE_AVRO_COMPRESSION, TableProperties.WRITE_AVRO_COMPRESSION_DEFAULT
        )
        self.removed: list[DataFile] = []
        self.written_files: list[str] = []  # manifests and the list: what a failed commit leaves

    def _metadata_path(self, name: str) -> str:
        return self._transaction._table.location_provider().new_metadata_location(name)

    def _writer(self, content: ManifestContent, spec_id: int) -> SpecManifestWriter:
        metadata = self._transaction.table_metadata
        path = self._metadata_path(f"{self._commit_uuid}-m{self._counter}.avro")
        self._counter += 1
        self.written_files.append(path)
        return SpecManifestWriter(
            metadata.specs()[spec_id],
            metadata.schema(),
            self._io.new_output(path),
            self.snapshot_id,
            self._compression,
            format_version=self._version,
            content=content,
        )

    def _rewrite(self, manifest: Any, keys: set[FileKey]) -> Any:
        entries = manifest_entries(self._io, manifest, self._version)
        with self._writer(manifest.content, manifest.partition_spec_id) as writer:
            for entry in entries:
                gone = file_key(entry.data_file) in keys
                writer.add_entry(
                    ManifestEntry.from_args(
                        status=ManifestEntryStatus.DELETED if gone else ManifestEntryStatus.EXISTING,
                        snapshot_id=self.snapshot_id if gone else entry.snapshot_id,
                        sequence_number=entry.sequence_number,
                        file_sequence_number=entry.file_sequence_number,
                        data_file=as_record(entry.data_file),
                    )
                )
                if gone:
                    keys.discard(file_key(entry.data_file))
                    self.removed.append(entry.data_file)
        if keys:
            raise StaleDeltaError(
                f"files {sorted(keys)[:3]} are not live in manifest {manifest.manifest_path} any more"
            )
        return writer.to_manifest_file()

    def _manifests(self) -> list[Any]:
        metadata = self._transaction.table_metadata
        parent = metadata.snapshot_by_id(self._base) if self._base is not None else None
        kept = read_manifest_list(self._io, parent.manifest_list, self._version) if parent else []
        remove = {path: set(keys) for path, keys in self._remove.items()}
        manifests = []
        for manifest in kept:
            keys = remove.pop(manifest.manifest_path, None)
            manifests.append(self._rewrite(manifest, keys) if keys else manifest)
        if remove:
            raise StaleDeltaError(f"manifests {sorted(remove)[:3]} are not in snapshot {self._base}")
        groups: dict[tuple[int, int], list[DataFile]] = {}
        for data_file in self._add:
            content = (
                ManifestContent.DATA if data_file.content == DataFileContent.DATA else ManifestContent.DELETES
            )
            groups.setdefault((int(content), int(data_file.spec_id)), []).append(data_file)
        added = []
        for (content, spec_id), files in sorted(groups.items()):
            with self._writer(ManifestContent(content), spec_id) as writer:
                for data_file in files:
                    writer.add(
                        ManifestEntry.from_args(
                            status=ManifestEntryStatus.ADDED,
                            snapshot_id=self.snapshot_id,
                            sequence_number=None,
                            file_sequence_number=None,
                            data_file=data_file,
                        )
                    )
            added.append(writer.to_manifest_file())
        return added + manifests  # new manifests first, as Java's producers order them

    def _summary(self) -> Summary:
        metadata = self._transaction.table_metadata
        schema, specs = metadata.schema(), metadata.specs()
        collector = SnapshotSummaryCollector(
            partition_summary_limit=int(
                metadata.properties.get(
                    TableProperties.WRITE_PARTITION_SUMMARY_LIMIT,
                    TableProperties.WRITE_PARTITION_SUMMARY_LIMIT_DEFAULT,
                )
            )
        )
        for data_file in self._add:
            collector.add_file(data_file, schema=schema, partition_spec=specs[data_file.spec_id])
        for data_file in self.removed:
            collector.remove_file(data_file, schema=schema, partition_spec=specs[data_file.spec_id])
        parent = metadata.snapshot_by_id(self._base) if self._base is not None else None
        return update_snapshot_summaries(
            Summary(operation=self._operation, **collector.build(), **self._properties),
            previous_summary=parent.summary if parent is not None else None,
        )

    def _commit(self) -> UpdatesAndRequirements:
        metadata = self._transaction.table_metadata
        head = metadata.refs.get(MAIN_BRANCH)
        if (head.snapshot_id if head else None) != self._base:
            raise StaleDeltaError(
                f"main is at snapshot {head.snapshot_id if head else None}, the delta was planned on {self._base}"
            )
        manifests = self._manifests()
        sequence_number = metadata.next_sequence_number()
        # v3: the snapshot's rows start at the table's next row id (derived when pyiceberg left it unset).
        first_row_id = next_row_id(metadata) if self._version >= 3 else None
        list_path = self._metadata_path(f"snap-{self.snapshot_id}-0-{self._commit_uuid}.avro")
        self.written_files.append(list_path)
        with SpecManifestListWriter(
            self._io.new_output(list_path),
            self.snapshot_id,
            self._base,
            sequence_number,
            self._compression,
            format_version=self._version,
            first_row_id=first_row_id,
        ) as writer:
            writer.add_manifests(manifests)
        snapshot = Snapshot(
            snapshot_id=self.snapshot_id,
            parent_snapshot_id=self._base,
            manifest_list=list_path,
            sequence_number=sequence_number,
            summary=self._summary(),
            schema_id=metadata.current_schema_id,
            first_row_id=first_row_id,
            added_rows=writer.assigned_rows if self._version >= 3 else None,
        )
        return (
            (
                AddSnapshotUpdate(snapshot=snapshot),
                SetSnapshotRefUpdate(
                    snapshot_id=self.snapshot_id,
                    parent_snapshot_id=self._base,
                    ref_name=MAIN_BRANCH,
                    type=SnapshotRefType.BRANCH,
                ),
            ),
            (AssertRefSnapshotId(snapshot_id=self._base, ref=MAIN_BRANCH),),
        )


class AssertedProperties(UpdateTableMetadata["AssertedProperties"]):
    """Set table properties, asserting ``main`` is at ``head``.

    ``Transaction.set_properties`` carries no requirement, so a catalog would
    apply it over whatever is current; with the assertion a concurrent commit
    fails this one instead. Commit it before a :class:`RowDelta` in the same
    transaction: requirements are checked against the transaction's state.
    """

    def __init__(self, transaction: Transaction, properties: Mapping[str, str], head: int | None) -> None:
        super().__init__(transaction)
        self._properties = dict(properties)
        self._head = head

    def _commit(self) -> UpdatesAndRequirements:
        return (
            (SetPropertiesUpdate(updates=self._properties),),
            (AssertRefSnapshotId(snapshot_id=self._head, ref=MAIN_BRANCH),),
        )

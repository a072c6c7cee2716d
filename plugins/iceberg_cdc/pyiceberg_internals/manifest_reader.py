"""A manifest's entries, read with the schema of the table's format version.

pyiceberg 0.12's ``ManifestFile.fetch_manifest_entry`` reads every manifest
with the format-v2 schema, which drops the fields format v3 added to
``data_file``: ``referenced_data_file``, ``content_offset`` and
``content_size_in_bytes`` are where a deletion vector's blob lives, and
without them a v3 table's deletes cannot be found. This reader asks for the
v3 schema on v3 tables (a v2 manifest read this way just has the new fields
empty) and applies the spec's inheritance rules itself.
"""

from __future__ import annotations

from typing import Any

from pyiceberg.avro.file import AvroFile
from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DATA_FILE_TYPE,
    MANIFEST_ENTRY_SCHEMAS,
    MANIFEST_LIST_FILE_SCHEMAS,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    PartitionFieldSummary,
)
from pyiceberg.table.snapshots import Snapshot

# pyiceberg's DataFile has properties for the v2 fields only; a record read (or built) with the v3
# struct holds the v3 fields at their positions in it.
_V3_POSITIONS = {field.name: i for i, field in enumerate(DATA_FILE_TYPE[3].fields)}


def v3_field(data_file: DataFile, name: str) -> Any:
    """A format-v3 ``data_file`` field (``referenced_data_file``, ``content_offset``, ...), or None.

    None when the record was read with the v2 schema, as every file of a v2 table is.
    """
    position = _V3_POSITIONS[name]
    return data_file[position] if len(data_file) > position else None


def _inherit(entry: ManifestEntry, manifest: ManifestFile) -> ManifestEntry:
    """Fill what an entry inherits from its manifest (spec: "Sequence Number Inheritance").

    A null snapshot id is the manifest's; null sequence numbers of ADDED
    entries are the manifest's (and every entry's in a v1 manifest, whose
    sequence number is 0); the partition spec is always the manifest's.
    """
    if entry.snapshot_id is None:
        entry.snapshot_id = manifest.added_snapshot_id
    inherits = manifest.sequence_number == 0 or entry.status == ManifestEntryStatus.ADDED
    if entry.sequence_number is None and inherits:
        entry.sequence_number = manifest.sequence_number
    if entry.file_sequence_number is None and inherits:
        entry.file_sequence_number = manifest.sequence_number
    entry.data_file.spec_id = manifest.partition_spec_id
    return entry


def manifest_entries(
    io: FileIO, manifest: ManifestFile, format_version: int, *, discard_deleted: bool = True
) -> list[ManifestEntry]:
    """The manifest's entries (without DELETED ones when ``discard_deleted``), v3 fields included on v3."""
    read_version = 3 if format_version >= 3 else 2
    with AvroFile[ManifestEntry](
        io.new_input(manifest.manifest_path),
        MANIFEST_ENTRY_SCHEMAS[read_version],
        read_types={-1: ManifestEntry, 2: DataFile},
        read_enums={0: ManifestEntryStatus, 101: FileFormat, 134: DataFileContent},
    ) as reader:
        return [
            _inherit(entry, manifest)
            for entry in reader
            if not discard_deleted or entry.status != ManifestEntryStatus.DELETED
        ]


# Where field 520 (first_row_id) sits in a manifest_file record read with the v3 schema.
_FIRST_ROW_ID_POSITION = [f.field_id for f in MANIFEST_LIST_FILE_SCHEMAS[3].fields].index(520)


def manifest_first_row_ids(io: FileIO, snapshot: Snapshot) -> dict[str, int | None]:
    """Manifest path -> its ``first_row_id`` (None when unassigned), from the v3 manifest list."""
    with AvroFile[ManifestFile](
        io.new_input(snapshot.manifest_list),
        MANIFEST_LIST_FILE_SCHEMAS[3],
        read_types={-1: ManifestFile, 508: PartitionFieldSummary},
        read_enums={517: ManifestContent},
    ) as reader:
        out: dict[str, int | None] = {}
        for manifest in reader:
            value = manifest[_FIRST_ROW_ID_POSITION] if len(manifest) > _FIRST_ROW_ID_POSITION else None
            out[manifest.manifest_path] = None if value is None else int(value)
        return out

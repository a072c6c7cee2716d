"""Read a manifest's entries with the format-v3 schema, and the v3 ``data_file`` fields.

pyiceberg 0.12's ``ManifestFile.fetch_manifest_entry`` reads every manifest
with the format-v2 entry schema (``DEFAULT_READ_VERSION``), which drops the
fields format v3 added to ``data_file``: ``first_row_id``,
``referenced_data_file``, ``content_offset`` and ``content_size_in_bytes`` --
where a deletion vector's blob lives. :func:`read_manifest_entries` is
``fetch_manifest_entry`` with the schema of the table's format version, and
without the inheritance step (the caller applies the spec's rules,
:func:`iceberg_cdc.source.manifests.manifest_entries`). Assumptions (pinned by tests):

* ``MANIFEST_ENTRY_SCHEMAS[3]`` is the v3 entry schema; ``AvroFile`` reads it
  with ``read_types`` {-1: ``ManifestEntry``, 2: ``DataFile``} and
  ``read_enums`` keyed by field id (0 ``status``, 101 ``file_format``,
  134 ``content``), as pyiceberg's own reader does;
* a ``DataFile`` read with the v3 struct holds the v2 fields at the positions
  pyiceberg's attribute properties read (v3 only appends fields), and the v3
  fields at their positions in ``DATA_FILE_TYPE[3]`` -- pyiceberg's
  ``DataFile`` has no attributes for them, so :func:`v3_field` reads them by
  position.
"""

from __future__ import annotations

from typing import Any

from pyiceberg.avro.file import AvroFile
from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DATA_FILE_TYPE,
    MANIFEST_ENTRY_SCHEMAS,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestEntry,
    ManifestEntryStatus,
)

V3_FIELDS = ("first_row_id", "referenced_data_file", "content_offset", "content_size_in_bytes")
_V3_POSITIONS = {field.name: i for i, field in enumerate(DATA_FILE_TYPE[3].fields)}


def v3_field(data_file: DataFile, name: str) -> Any:
    """A format-v3 ``data_file`` field (``referenced_data_file``, ``content_offset``, ...), or None.

    None when the record was read with the v2 schema, as every file of a v2 table is.
    """
    position = _V3_POSITIONS[name]
    return data_file[position] if len(data_file) > position else None


def read_manifest_entries(io: FileIO, manifest_path: str, format_version: int) -> list[ManifestEntry]:
    """Every entry of the manifest at ``manifest_path``, as stored (nothing inherited yet), v3 fields on v3."""
    read_version = 3 if format_version >= 3 else 2
    with AvroFile[ManifestEntry](
        io.new_input(manifest_path),
        MANIFEST_ENTRY_SCHEMAS[read_version],
        read_types={-1: ManifestEntry, 2: DataFile},
        read_enums={0: ManifestEntryStatus, 101: FileFormat, 134: DataFileContent},
    ) as reader:
        return list(reader)

"""Manifests read apart from the pipeline: fastavro, the spec's inheritance rules, plain records.

The merge-on-read reference reader (:mod:`cdc_devtools.mor_state`) and
the writers of test histories (:mod:`cdc_devtools.mor`,
``tests/support/mor_history.py``) must not read a table with the pipeline's
own manifest code (``iceberg_cdc.source.manifests``, a fork of pyiceberg's
reader): a bug there would then be in the oracle too, and every replay check
would agree with it. So this module decodes the manifest list and the
manifests with another Avro library (fastavro, logical types left raw) and
states the rules it applies plainly (Iceberg spec, "Manifests" and
"Sequence Number Inheritance"):

* an entry's null ``snapshot_id`` is the manifest's ``added_snapshot_id``;
* an ADDED entry's null ``sequence_number`` / ``file_sequence_number`` are
  the manifest's sequence number; in a manifest written before format v2
  (sequence number 0, no such fields) every entry's are 0; any other null is
  invalid metadata and fails here;
* the partition spec is the manifest's; a v1 ``data_file`` has no ``content``
  (it is data) and no ``equality_ids``.

Each entry also carries its file as pyiceberg's ``DataFile`` (built from the
decoded record, every field kept) for the writers that commit it again.
Small tables only: every manifest is read whole, row by row.
"""

from __future__ import annotations

import io as _io
import json
from dataclasses import dataclass
from typing import Any

import fastavro
from pyiceberg.io import FileIO
from pyiceberg.manifest import DATA_FILE_TYPE, DataFile, DataFileContent, FileFormat, ManifestFile
from pyiceberg.table import Table
from pyiceberg.typedef import Record

EXISTING, ADDED, DELETED = 0, 1, 2
DATA, POSITION_DELETES, EQUALITY_DELETES = 0, 1, 2
_MAPS = (
    "column_sizes",
    "value_counts",
    "null_value_counts",
    "nan_value_counts",
    "lower_bounds",
    "upper_bounds",
)


@dataclass(frozen=True)
class ManifestRef:
    """What the manifest list says about one manifest."""

    path: str
    spec_id: int
    content: int  # 0 data, 1 deletes
    sequence_number: int
    added_snapshot_id: int


@dataclass(frozen=True)
class RefEntry:
    """One manifest entry, inheritance applied, with its file's fields as plain values."""

    status: int
    snapshot_id: int
    sequence_number: int
    file_sequence_number: int
    content: int
    file_path: str
    file_format: str  # "PARQUET", "AVRO", "ORC", "PUFFIN"
    spec_id: int
    partition: tuple  # the raw Avro values, in the spec's field order
    record_count: int
    equality_ids: tuple[int, ...]
    referenced_data_file: str | None
    content_offset: int | None
    content_size_in_bytes: int | None
    data_file: DataFile  # the same file as pyiceberg's record, for writers that commit it again

    @property
    def is_deletion_vector(self) -> bool:
        return self.file_format == "PUFFIN"


def _strip_logical_types(schema: Any) -> Any:
    """The Avro schema without ``logicalType``: dates, decimals, maps-as-arrays come back raw."""
    if isinstance(schema, dict):
        return {k: _strip_logical_types(v) for k, v in schema.items() if k != "logicalType"}
    if isinstance(schema, list):
        return [_strip_logical_types(s) for s in schema]
    return schema


def read_avro(io: FileIO, path: str) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """(file metadata, records) of one Avro file, decoded by fastavro without logical types."""
    with io.new_input(path).open() as stream:
        raw = stream.read()
    header = fastavro.reader(_io.BytesIO(raw))
    metadata = {k: v.decode() if isinstance(v, bytes) else v for k, v in header.metadata.items()}
    schema = _strip_logical_types(json.loads(metadata["avro.schema"]))
    return metadata, list(fastavro.reader(_io.BytesIO(raw), reader_schema=schema))


def manifest_list(io: FileIO, manifest_list_path: str) -> list[ManifestRef]:
    """The manifests a snapshot's manifest list names (v1 lists: data manifests, sequence number 0)."""
    _, records = read_avro(io, manifest_list_path)
    return [
        ManifestRef(
            path=r["manifest_path"],
            spec_id=int(r["partition_spec_id"]),
            content=int(r.get("content") or 0),
            sequence_number=int(r.get("sequence_number") or 0),
            added_snapshot_id=int(r["added_snapshot_id"]),
        )
        for r in records
    ]


def _inherited(value: int | None, status: int, manifest: ManifestRef, what: str, path: str) -> int:
    if value is not None:
        return int(value)
    if status == ADDED or manifest.sequence_number == 0:
        return manifest.sequence_number
    raise ValueError(
        f"{what} of {path} is null in {manifest.path} but the entry is not ADDED: invalid manifest"
    )


def _data_file(record: dict[str, Any], spec_id: int, format_version: int) -> DataFile:
    version = 3 if format_version >= 3 else 2
    names = {f.name for f in DATA_FILE_TYPE[version].fields}
    args: dict[str, Any] = {k: v for k, v in record.items() if k in names}
    for name in _MAPS:
        if args.get(name) is not None:
            args[name] = {kv["key"]: kv["value"] for kv in args[name]}
    args["content"] = DataFileContent(int(record.get("content") or 0))
    args["file_format"] = FileFormat(record["file_format"].upper())
    args["partition"] = Record(*record["partition"].values())
    data_file = DataFile.from_args(_table_format_version=version, **args)
    data_file.spec_id = spec_id
    return data_file


def manifest_entries(
    io: FileIO, manifest: ManifestRef, format_version: int, *, discard_deleted: bool = True
) -> list[RefEntry]:
    """The manifest's entries, inheritance applied (DELETED ones left out when ``discard_deleted``)."""
    _, records = read_avro(io, manifest.path)
    entries = []
    for r in records:
        status = int(r["status"])
        if discard_deleted and status == DELETED:
            continue
        f = r["data_file"]
        path = f["file_path"]
        sequence = _inherited(r.get("sequence_number"), status, manifest, "sequence_number", path)
        entries.append(
            RefEntry(
                status=status,
                snapshot_id=int(
                    r["snapshot_id"] if r.get("snapshot_id") is not None else manifest.added_snapshot_id
                ),
                sequence_number=sequence,
                file_sequence_number=_inherited(
                    r.get("file_sequence_number", sequence), status, manifest, "file_sequence_number", path
                ),
                content=int(f.get("content") or 0),
                file_path=path,
                file_format=f["file_format"].upper(),
                spec_id=manifest.spec_id,
                partition=tuple(f["partition"].values()),
                record_count=int(f["record_count"]),
                equality_ids=tuple(f.get("equality_ids") or ()),
                referenced_data_file=f.get("referenced_data_file"),
                content_offset=f.get("content_offset"),
                content_size_in_bytes=f.get("content_size_in_bytes"),
                data_file=_data_file(f, manifest.spec_id, format_version),
            )
        )
    return entries


def manifest_file_entries(io: FileIO, manifest: ManifestFile, format_version: int) -> list[RefEntry]:
    """:func:`manifest_entries` of a manifest pyiceberg listed (its manifest-list fields taken as they are)."""
    ref = ManifestRef(
        path=manifest.manifest_path,
        spec_id=manifest.partition_spec_id,
        content=int(manifest.content),
        sequence_number=int(manifest.sequence_number or 0),
        added_snapshot_id=int(manifest.added_snapshot_id),
    )
    return manifest_entries(io, ref, format_version)


def snapshot_entries(table: Table, snapshot_id: int) -> list[RefEntry]:
    """Every live entry (ADDED or EXISTING) of the snapshot's manifests, data and delete files alike."""
    snapshot = table.snapshot_by_id(snapshot_id)
    assert snapshot is not None, f"snapshot {snapshot_id} not in {table.name()}"
    version = table.metadata.format_version
    return [
        entry
        for manifest in manifest_list(table.io, snapshot.manifest_list)
        for entry in manifest_entries(table.io, manifest, version)
    ]

"""The files of one snapshot's change, as plans carry them to the write tasks.

:class:`SnapshotChanges` lists the data files whose live rows a snapshot
removed and added (:mod:`iceberg_cdc.source.changes` reads them from the
manifests); each :class:`DataFileRef` says what a write task needs to read one
file: its size and row count, its identity-partition values, and the delete
files to apply. Both have a JSON form for the snapshot plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pyiceberg.manifest import DataFile
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.transforms import IdentityTransform

from iceberg_cdc.source.deletes import DeleteFileRef
from iceberg_cdc.source.reading import partition_value_to_json

PartitionValues = Mapping[int, Any]
"""Identity-partition values of one data file: source field id -> value in JSON form."""

ChangeKind = Literal["replace", "insert_only", "with_deletes", "empty"]


def partition_values_to_dict(values: PartitionValues | None) -> dict[str, Any] | None:
    """JSON object form: field ids as string keys (JSON has no integer keys)."""
    return None if values is None else {str(field_id): value for field_id, value in sorted(values.items())}


def partition_values_from_dict(data: Mapping[str, Any] | None) -> dict[int, Any] | None:
    return None if data is None else {int(field_id): value for field_id, value in data.items()}


def read_fields_to_dict(
    partition_values: PartitionValues | None,
    deletes: tuple[str, ...],
    require: tuple[str, ...],
    first_row_id: int | None = None,
    sequence_number: int | None = None,
) -> dict[str, Any]:
    """The JSON form of how to read a planned file (partition values, delete files, row lineage
    inheritance), each only when set.

    Absent when unset, so plans without them -- older ones among them -- keep their form.
    """
    data: dict[str, Any] = {}
    if partition_values is not None:
        data["partition_values"] = partition_values_to_dict(partition_values)
    if deletes:
        data["deletes"] = list(deletes)
    if require:
        data["require"] = list(require)
    if first_row_id is not None:
        data["first_row_id"] = first_row_id
    if sequence_number is not None:
        data["sequence_number"] = sequence_number
    return data


def read_fields_from_dict(data: Mapping[str, Any]) -> dict[str, Any]:
    """The fields :func:`read_fields_to_dict` wrote, as keyword arguments."""
    return {
        "partition_values": partition_values_from_dict(data.get("partition_values")),
        "deletes": tuple(str(p) for p in data.get("deletes", ())),
        "require": tuple(str(p) for p in data.get("require", ())),
        "first_row_id": _optional_int(data.get("first_row_id")),
        "sequence_number": _optional_int(data.get("sequence_number")),
    }


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
    ``deletes``: paths of the delete files whose rows are not live (merge-on-read).
    ``require``: for a data file the snapshot kept, the delete files a row must
    match to be part of the change (empty: every live row is).
    ``partition``: the file's whole partition tuple (every transform, JSON
    form): with ``spec_id`` it says which removed and added files can share
    carryover (:mod:`iceberg_cdc.source.planning`).
    ``first_row_id`` / ``sequence_number`` (format v3): what the file's rows
    inherit as ``_row_id`` base and ``_last_updated_sequence_number``
    (:mod:`iceberg_cdc.source.lineage`); None when unknown or not v3.
    ``key_range``: lower and upper bound of the first identifier column, when
    the manifest's statistics can be trusted (:mod:`iceberg_cdc.source.key_ranges`).
    """

    path: str
    size: int
    record_count: int
    spec_id: int
    partition_values: PartitionValues | None = field(default=None, hash=False)
    deletes: tuple[str, ...] = ()
    require: tuple[str, ...] = ()
    partition: tuple[Any, ...] | None = field(default=None, hash=False, compare=False)
    first_row_id: int | None = field(default=None, compare=False)
    sequence_number: int | None = field(default=None, compare=False)
    key_range: tuple[Any, Any] | None = field(default=None, hash=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "size": self.size,
            "record_count": self.record_count,
            "spec_id": self.spec_id,
            **read_fields_to_dict(
                self.partition_values, self.deletes, self.require, self.first_row_id, self.sequence_number
            ),
            **({} if self.partition is None else {"partition": list(self.partition)}),
            **({} if self.key_range is None else {"key_range": list(self.key_range)}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DataFileRef:
        partition = data.get("partition")
        return cls(
            path=str(data["path"]),
            size=int(data["size"]),
            record_count=int(data["record_count"]),
            spec_id=int(data["spec_id"]),
            **read_fields_from_dict(data),
            partition=None if partition is None else tuple(partition),
            key_range=None if data.get("key_range") is None else tuple(data["key_range"]),
        )


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True)
class SnapshotChanges:
    """The files one snapshot added and removed, and how the pipeline must treat it.

    ``deleted`` and ``added`` list the data files whose live rows the snapshot
    removed and added; a data file it kept appears there too when delete files
    changed its live rows (with ``require``). ``delete_files`` are the delete
    files the snapshot added; ``delete_refs`` every delete file some input
    applies, by key (its path; ``path#offset`` for a deletion vector). ``unsupported`` says why a live delete file cannot be
    applied (:func:`require_supported` turns it into an error).
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
    delete_refs: Mapping[str, DeleteFileRef] = field(default_factory=dict)
    unsupported: tuple[str, ...] = ()

    @property
    def kind(self) -> ChangeKind:
        """How the pipeline handles the snapshot.

        ``replace`` (compaction: same rows in new files) is skipped whatever it
        touched. Delete files that apply to no data file change no row: such a
        snapshot is ``empty``.
        """
        if self.operation == "replace":
            return "replace"
        if self.deleted:
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
            "delete_refs": {path: ref.to_dict() for path, ref in sorted(self.delete_refs.items())},
            "unsupported": list(self.unsupported),
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
            delete_refs={
                str(path): DeleteFileRef.from_dict(ref) for path, ref in data.get("delete_refs", {}).items()
            },
            unsupported=tuple(str(r) for r in data.get("unsupported", ())),
        )

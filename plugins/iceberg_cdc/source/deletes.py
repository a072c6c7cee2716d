"""Merge-on-read delete files: which ones apply to which data file, as the Iceberg spec says.

A row of data file F is live in snapshot X unless a delete file live in X
applies to F and names the row:

* a **position delete** file applies when its data sequence number is >= F's
  and names F's path; its rows ``(file_path, pos)`` delete F's row ``pos``;
* a **deletion vector** (format v3: a Puffin blob naming one data file)
  applies to its ``referenced_data_file`` when its data sequence number is
  >= F's; it deletes the positions it holds. A DV holds every deleted
  position of its file (a writer merges older position deletes into it), so
  when one applies, position delete files are not applied to F at all
  (Iceberg's ``DeleteFileIndex`` does the same); at most one DV per data file
  may be live;
* an **equality delete** file applies when its data sequence number is
  strictly > F's (so a Flink upsert's delete never hits the row it inserts in
  the same commit), and it is either in an unpartitioned spec (global) or in
  F's own spec and partition; its rows delete every row of F whose values in
  the delete's ``equality_ids`` columns equal one of them (null equals null).

The changes of snapshot S (parent P) then follow from comparing each data
file's live rows in P and in S (:mod:`iceberg_cdc.source.changes`). This
module only decides *applicability* from manifest metadata; the rows are
matched on executors (:mod:`iceberg_cdc.source.delete_filter`).

Applicability is exact in the spec's terms (sequence numbers, spec and
partition); column bounds are used only to skip a pair that cannot match
(every delete key outside the data file's value range, and nulls impossible
on one side). Such pruning never changes the result, it only saves reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pyiceberg.conversions import from_bytes
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat, ManifestEntry
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.types import PrimitiveType

from iceberg_cdc.source.manifests import v3_field
from iceberg_cdc.source.reading import partition_value_to_json

DeleteKind = Literal["position", "equality", "dv"]

# The reserved field id of a position delete file's ``file_path`` column (spec: "Position Delete Files").
POSITION_PATH_FIELD_ID = 2147483546


@dataclass(frozen=True)
class DeleteFileRef:
    """One delete file as executors need it: where it is and how to match its rows."""

    path: str
    kind: DeleteKind
    size: int
    record_count: int
    sequence_number: int
    equality_ids: tuple[int, ...] = ()
    # A deletion vector: the data file it names and where its blob is in the Puffin file.
    referenced_data_file: str | None = None
    content_offset: int | None = None
    content_size: int | None = None

    @property
    def key(self) -> str:
        """What names this delete in a plan: its path, plus the blob's offset for a DV.

        One Puffin file holds the DVs of many data files, so a path alone does
        not name a DV.
        """
        return f"{self.path}#{self.content_offset}" if self.kind == "dv" else self.path

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "path": self.path,
            "kind": self.kind,
            "size": self.size,
            "record_count": self.record_count,
            "sequence_number": self.sequence_number,
        }
        if self.equality_ids:
            data["equality_ids"] = list(self.equality_ids)
        if self.kind == "dv":
            data["referenced_data_file"] = self.referenced_data_file
            data["content_offset"] = self.content_offset
            data["content_size"] = self.content_size
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DeleteFileRef:
        return cls(
            path=str(data["path"]),
            kind=data["kind"],
            size=int(data["size"]),
            record_count=int(data["record_count"]),
            sequence_number=int(data["sequence_number"]),
            equality_ids=tuple(int(i) for i in data.get("equality_ids", ())),
            referenced_data_file=data.get("referenced_data_file"),
            content_offset=None if data.get("content_offset") is None else int(data["content_offset"]),
            content_size=None if data.get("content_size") is None else int(data["content_size"]),
        )


@dataclass(frozen=True)
class _LiveDelete:
    ref: DeleteFileRef
    spec_id: int
    partition: tuple[Any, ...]
    global_scope: bool  # an equality delete of an unpartitioned spec applies in every partition
    data_file: DataFile


def partition_key(data_file: DataFile) -> tuple[Any, ...]:
    """The file's partition tuple in a hashable, comparable form."""
    partition = data_file.partition
    return tuple(partition_value_to_json(partition[i]) for i in range(len(partition)))


def unsupported_reason(delete_file: DataFile) -> str | None:
    """Why a delete file cannot be applied here, or ``None`` when it can."""
    file_format = delete_file.file_format
    if file_format == FileFormat.PUFFIN:
        if delete_file.content != DataFileContent.POSITION_DELETES:
            return f"{delete_file.file_path} is a Puffin delete file of content {delete_file.content}"
        missing = [
            name
            for name in ("referenced_data_file", "content_offset", "content_size_in_bytes")
            if v3_field(delete_file, name) is None
        ]
        if missing:
            return (
                f"{delete_file.file_path} is a deletion vector whose manifest entry has no "
                f"{', '.join(missing)} (a deletion vector needs them to be found; is the table's "
                "metadata format v3?)"
            )
        return None
    if file_format != FileFormat.PARQUET:
        return (
            f"{delete_file.file_path} is a {getattr(file_format, 'value', file_format)} "
            "delete file; only Parquet delete files are read (set write.delete.format.default=parquet)"
        )
    if delete_file.content == DataFileContent.EQUALITY_DELETES and not delete_file.equality_ids:
        return f"{delete_file.file_path} is an equality delete file without equality field ids"
    return None


def delete_ref(entry: ManifestEntry) -> DeleteFileRef:
    delete_file = entry.data_file
    is_equality = delete_file.content == DataFileContent.EQUALITY_DELETES
    if delete_file.file_format == FileFormat.PUFFIN:
        return DeleteFileRef(
            path=delete_file.file_path,
            kind="dv",
            size=int(delete_file.file_size_in_bytes),
            record_count=int(delete_file.record_count),
            sequence_number=int(entry.sequence_number or 0),
            referenced_data_file=v3_field(delete_file, "referenced_data_file"),
            content_offset=int(v3_field(delete_file, "content_offset")),
            content_size=int(v3_field(delete_file, "content_size_in_bytes")),
        )
    return DeleteFileRef(
        path=delete_file.file_path,
        kind="equality" if is_equality else "position",
        size=int(delete_file.file_size_in_bytes),
        record_count=int(delete_file.record_count),
        sequence_number=int(entry.sequence_number or 0),
        equality_ids=tuple(int(i) for i in delete_file.equality_ids or ()) if is_equality else (),
    )


def _decode(schema: Schema, field_id: int, raw: bytes | None) -> Any:
    if raw is None:
        return None
    try:
        field_type = schema.find_field(field_id).field_type
    except ValueError:
        return None
    if not isinstance(field_type, PrimitiveType):
        return None
    try:
        return from_bytes(field_type, raw)
    except Exception:  # a bound written under an older type (int before long): no pruning on it
        return None


def _cannot_overlap(schema: Schema, delete_file: DataFile, data_file: DataFile, field_id: int) -> bool:
    """True when no delete row can match a data row on ``field_id`` (from bounds and null counts)."""
    delete_nulls = (delete_file.null_value_counts or {}).get(field_id)
    data_nulls = (data_file.null_value_counts or {}).get(field_id)
    if not (delete_nulls == 0 or data_nulls == 0):
        return False  # a null key could meet a null value, which bounds do not describe
    d_lower = _decode(schema, field_id, (delete_file.lower_bounds or {}).get(field_id))
    d_upper = _decode(schema, field_id, (delete_file.upper_bounds or {}).get(field_id))
    f_lower = _decode(schema, field_id, (data_file.lower_bounds or {}).get(field_id))
    f_upper = _decode(schema, field_id, (data_file.upper_bounds or {}).get(field_id))
    try:
        if d_upper is not None and f_lower is not None and d_upper < f_lower:
            return True
        if d_lower is not None and f_upper is not None and d_lower > f_upper:
            return True
    except TypeError:
        return False
    return False


def _path_in_bounds(delete_file: DataFile, path: str) -> bool:
    lower = (delete_file.lower_bounds or {}).get(POSITION_PATH_FIELD_ID)
    upper = (delete_file.upper_bounds or {}).get(POSITION_PATH_FIELD_ID)
    encoded = path.encode()
    if lower is not None and encoded < bytes(lower):
        return False
    # An upper bound may be truncated and then incremented: still >= every path it covers.
    return not (upper is not None and encoded > bytes(upper))


class DeleteIndex:
    """The delete files live in one snapshot, indexed for "which apply to this data file?"."""

    def __init__(self, entries: Iterable[ManifestEntry], specs: Mapping[int, PartitionSpec], schema: Schema):
        self._schema = schema
        self._position: dict[tuple[int, tuple[Any, ...]], list[_LiveDelete]] = {}
        self._equality: dict[tuple[int, tuple[Any, ...]], list[_LiveDelete]] = {}
        self._global_equality: list[_LiveDelete] = []
        self._dv: dict[str, DeleteFileRef] = {}  # referenced data file -> its deletion vector
        self.refs: dict[str, DeleteFileRef] = {}
        self.files: dict[str, DataFile] = {}  # by ref key: the manifest's description of each
        self.unsupported: list[str] = []
        for entry in entries:
            delete_file = entry.data_file
            reason = unsupported_reason(delete_file)
            if reason is not None:
                self.unsupported.append(reason)
                continue
            ref = delete_ref(entry)
            self.files[ref.key] = delete_file
            if ref.kind == "dv":
                self._add_dv(ref)
                continue
            spec = specs.get(int(delete_file.spec_id))
            unpartitioned = spec is None or not spec.fields
            live = _LiveDelete(
                ref, int(delete_file.spec_id), partition_key(delete_file), unpartitioned, delete_file
            )
            self.refs[ref.key] = ref
            key = (live.spec_id, live.partition)
            if ref.kind == "position":
                self._position.setdefault(key, []).append(live)
            elif unpartitioned:
                self._global_equality.append(live)
            else:
                self._equality.setdefault(key, []).append(live)

    def _add_dv(self, ref: DeleteFileRef) -> None:
        assert ref.referenced_data_file is not None
        other = self._dv.get(ref.referenced_data_file)
        if other is not None:
            self.unsupported.append(
                f"data file {ref.referenced_data_file} has two live deletion vectors ({other.key} and "
                f"{ref.key}); the spec allows one per data file, so the table's state is ambiguous"
            )
            return
        self._dv[ref.referenced_data_file] = ref
        self.refs[ref.key] = ref

    def __len__(self) -> int:
        return len(self.refs)

    def for_data_file(self, entry: ManifestEntry) -> frozenset[str]:
        """Paths of the delete files that apply to the data file of ``entry``."""
        if not self.refs:
            return frozenset()
        data_file = entry.data_file
        seq = int(entry.sequence_number or 0)
        key = (int(data_file.spec_id), partition_key(data_file))
        found: set[str] = set()
        dv = self._dv.get(data_file.file_path)
        if dv is not None and dv.sequence_number >= seq:
            found.add(dv.key)  # it holds every deleted position: position delete files do not apply
        else:
            for live in self._position.get(key, ()):
                if live.ref.sequence_number >= seq and _path_in_bounds(live.data_file, data_file.file_path):
                    found.add(live.ref.key)
        for live in (*self._equality.get(key, ()), *self._global_equality):
            if live.ref.sequence_number > seq and not any(
                _cannot_overlap(self._schema, live.data_file, data_file, field_id)
                for field_id in live.ref.equality_ids
            ):
                found.add(live.ref.key)
        return frozenset(found)

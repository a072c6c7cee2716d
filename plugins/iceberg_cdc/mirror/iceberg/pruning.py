"""Which of the mirror's data files can hold a changed key: pruned by partition and by column bounds.

An apply must delete every live mirror row whose key changed, and only the
files that may hold one need reading. Two kinds of metadata rule files out
without opening them:

* **partitions** -- for each partition field whose source column is a key
  column (``bucket(16, id)``, ``identity(region)`` with ``region`` in the
  key ...), the changed keys' transformed values: a manifest whose partition
  summary (lower/upper bound, contains-null) holds none of them is not read
  at all, and a data file whose partition value is not among them is skipped;
* **column bounds** -- a data file is kept only if, for every key column,
  some changed key lies within the file's lower/upper bounds (a truncated
  string bound still brackets the file's values) or is null where the file
  may hold nulls.

Pruning is conservative: whatever cannot be decided from the metadata (no
bounds, a type without an order here, a transform this module does not
evaluate) keeps the file. The delete files that apply to each candidate are
found with the source side's index (:class:`~iceberg_cdc.source.deletes.DeleteIndex`:
sequence numbers, partitions, DV references), so a join unit knows which rows
are already deleted.
"""

from __future__ import annotations

import bisect
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.conversions import from_bytes
from pyiceberg.manifest import DataFileContent, ManifestContent, ManifestEntry, ManifestFile
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import PrimitiveType

from iceberg_cdc.errors import MirrorStateError
from iceberg_cdc.mirror.iceberg.plan import CandidateFile
from iceberg_cdc.pyiceberg_internals.manifests import read_manifest_list
from iceberg_cdc.source.deletes import POSITION_PATH_FIELD_ID, DeleteIndex, delete_ref, unsupported_reason
from iceberg_cdc.source.manifests import manifest_entries
from iceberg_cdc.source.reading import partition_value_to_json

_MANIFEST_READERS = 8


@dataclass
class Pruned:
    candidates: list[CandidateFile] = field(default_factory=list)
    delete_files: dict[str, dict[str, Any]] = field(default_factory=dict)
    figures: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class _Values:
    """A key column's changed values in the order of its Iceberg bounds, sorted, and whether one is null."""

    sorted_values: list[Any] | None  # None: no order known here, so bounds cannot prune
    has_null: bool

    def any_within(self, lower: Any, upper: Any) -> bool:
        values = self.sorted_values
        if values is None or lower is None or upper is None:
            return True
        try:
            at = bisect.bisect_left(values, lower)
            return at < len(values) and values[at] <= upper
        except TypeError:
            return True


def _as_bound_values(column: pa.ChunkedArray | pa.Array) -> list[Any] | None:
    """Non-null values in the form ``from_bytes`` gives bounds (ints for temporal types), or None."""
    typ = column.type
    present = pc.drop_null(column)
    if pa.types.is_date32(typ):
        present = present.cast(pa.int32())
    elif pa.types.is_timestamp(typ) or pa.types.is_time64(typ):
        present = present.cast(pa.int64())
    elif not (
        pa.types.is_integer(typ)
        or pa.types.is_string(typ)
        or pa.types.is_large_string(typ)
        or pa.types.is_binary(typ)
        or pa.types.is_large_binary(typ)
        or pa.types.is_fixed_size_binary(typ)
        or pa.types.is_decimal(typ)
    ):
        return None
    values = present.to_pylist()
    if pa.types.is_fixed_size_binary(typ) and typ.byte_width == 16:
        values = [uuid.UUID(bytes=v) for v in values]  # a uuid's bound decodes to a UUID
    try:
        return sorted(set(values))
    except TypeError:
        return None


def _decode(field_type: Any, raw: bytes | None) -> Any:
    if raw is None or not isinstance(field_type, PrimitiveType):
        return None
    try:
        value = from_bytes(field_type, raw)
    except Exception:  # a bound written under an older type: no pruning on it
        return None
    return value if isinstance(value, int | str | bytes | Decimal | uuid.UUID) else None


def _key_partition_values(
    spec: PartitionSpec, schema: Schema, keys: pa.Table, key_ids: dict[int, str]
) -> dict[int, set]:
    """Position in the spec -> JSON forms of the changed keys' transformed values, for key-derived fields."""
    out: dict[int, set] = {}
    for position, partition_field in enumerate(spec.fields):
        name = key_ids.get(partition_field.source_id)
        if name is None:
            continue
        try:
            source_type = schema.find_field(partition_field.source_id).field_type
            transformed = partition_field.transform.pyarrow_transform(source_type)(keys.column(name))
            if pa.types.is_timestamp(transformed.type) or pa.types.is_time64(transformed.type):
                transformed = transformed.cast(pa.int64())
            out[position] = {partition_value_to_json(v) for v in transformed.to_pylist()}
        except Exception:  # a transform or type not evaluated here: keep every file of the field
            continue
    return out


def _manifest_may_match(
    manifest: ManifestFile, spec: PartitionSpec, schema: Schema, wanted: dict[int, set]
) -> bool:
    if not wanted or not manifest.partitions:
        return True
    partition_type = spec.partition_type(schema)
    for position, values in wanted.items():
        summary = manifest.partitions[position]
        field_type = partition_type.fields[position].field_type
        if None in values and summary.contains_null:
            continue
        lower = _decode(field_type, summary.lower_bound)
        upper = _decode(field_type, summary.upper_bound)
        if lower is None or upper is None:
            continue
        lower, upper = partition_value_to_json(lower), partition_value_to_json(upper)
        try:
            if not any(v is not None and lower <= v <= upper for v in values):
                return False
        except TypeError:
            continue
    return True


def _file_may_match(
    entry: ManifestEntry, schema: Schema, wanted: dict[int, set], values: dict[int, _Values]
) -> bool:
    data_file = entry.data_file
    partition = data_file.partition
    for position, allowed in wanted.items():
        if position < len(partition) and partition_value_to_json(partition[position]) not in allowed:
            return False
    lowers, uppers = data_file.lower_bounds or {}, data_file.upper_bounds or {}
    nulls = data_file.null_value_counts or {}
    for field_id, changed in values.items():
        field_type = schema.find_field(field_id).field_type
        null_match = changed.has_null and nulls.get(field_id, 1) > 0
        if null_match:
            continue
        if changed.sorted_values is not None and not changed.sorted_values:
            return False  # only null keys changed in this column, and the file holds no null
        if not changed.any_within(
            _decode(field_type, lowers.get(field_id)), _decode(field_type, uppers.get(field_id))
        ):
            return False
    return True


def _file_scoped(ref_kind: str, delete_file: Any, data_path: str) -> bool:
    """Whether a delete file names only ``data_path`` (so the apply may replace it with a merged one)."""
    if ref_kind == "dv":
        return True
    if ref_kind != "position":
        return False
    lower = (delete_file.lower_bounds or {}).get(POSITION_PATH_FIELD_ID)
    upper = (delete_file.upper_bounds or {}).get(POSITION_PATH_FIELD_ID)
    encoded = data_path.encode()
    return lower is not None and bytes(lower) == encoded and upper is not None and bytes(upper) == encoded


def prune(table: Table, snapshot_id: int | None, keys: pa.Table, key_columns: Sequence[str]) -> Pruned:
    """The candidate data files of ``table`` at ``snapshot_id`` for the changed ``keys`` (see module doc)."""
    pruned = Pruned()
    snapshot = table.snapshot_by_id(snapshot_id) if snapshot_id is not None else None
    if snapshot is None:
        pruned.figures = {"manifests": 0, "manifests_read": 0, "data_files": 0, "candidate_files": 0}
        return pruned
    schema, specs, version = table.schema(), table.specs(), table.metadata.format_version
    key_ids = {schema.find_field(name).field_id: name for name in key_columns}
    values = {
        field_id: _Values(_as_bound_values(keys.column(name)), keys.column(name).null_count > 0)
        for field_id, name in key_ids.items()
    }
    wanted = {spec_id: _key_partition_values(spec, schema, keys, key_ids) for spec_id, spec in specs.items()}
    manifests = read_manifest_list(table.io, snapshot.manifest_list, version)
    data = [m for m in manifests if m.content == ManifestContent.DATA]
    deletes = [m for m in manifests if m.content == ManifestContent.DELETES]
    to_read = [
        m
        for m in data
        if _manifest_may_match(m, specs[m.partition_spec_id], schema, wanted[m.partition_spec_id])
    ]
    with ThreadPoolExecutor(max_workers=_MANIFEST_READERS) as pool:
        data_entries = list(pool.map(lambda m: (m, manifest_entries(table.io, m, version)), to_read))
        delete_entries = list(pool.map(lambda m: (m, manifest_entries(table.io, m, version)), deletes))
    index = DeleteIndex([e for _, entries in delete_entries for e in entries], specs, schema)
    if index.unsupported:
        raise MirrorStateError(
            f"mirror {table.name()}: {index.unsupported[0]}. The mirror is written only by its applies; "
            "compact it (rewrite_data_files, rewrite_position_delete_files) or drop it to rebuild"
        )
    delete_manifest = {
        delete_ref(entry).key: manifest.manifest_path
        for manifest, entries in delete_entries
        for entry in entries
        if unsupported_reason(entry.data_file) is None
    }
    total_files = 0
    for manifest, entries in data_entries:
        for entry in entries:
            if entry.data_file.content != DataFileContent.DATA:
                continue
            total_files += 1
            if not _file_may_match(entry, schema, wanted[manifest.partition_spec_id], values):
                continue
            data_file = entry.data_file
            applied = sorted(index.for_data_file(entry))
            for key in applied:
                if key not in pruned.delete_files:
                    ref = index.refs[key]
                    pruned.delete_files[key] = {
                        **ref.to_dict(),
                        "manifest": delete_manifest[key],
                        "file_scoped": _file_scoped(ref.kind, index.files[key], data_file.file_path),
                    }
            partition = data_file.partition
            pruned.candidates.append(
                CandidateFile(
                    path=data_file.file_path,
                    record_count=int(data_file.record_count),
                    size=int(data_file.file_size_in_bytes),
                    spec_id=int(data_file.spec_id),
                    partition=[partition_value_to_json(partition[i]) for i in range(len(partition))],
                    manifest=manifest.manifest_path,
                    deletes=applied,
                )
            )
    pruned.figures = {
        "manifests": len(data),
        "manifests_read": len(to_read),
        "data_files": total_files,
        "candidate_files": len(pruned.candidates),
        "candidate_bytes": sum(c.size for c in pruned.candidates),
        "delete_manifests": len(deletes),
    }
    return pruned

"""Manifest descriptions of files written by Spark tasks, carried to the commit as JSON.

A join or write unit runs on an executor and writes data files, position
delete files or deletion vectors; the commit, in another process, needs each
file's full manifest description (counts, bounds, partition, a DV's blob
location). The unit records it as JSON beside its staged-result record, so
the commit never re-reads a footer: it only checks that each file still
exists with the size recorded (conservation).
"""

from __future__ import annotations

from typing import Any

from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.typedef import Record
from pyiceberg.types import StructType

from iceberg_cdc.pyiceberg_internals.datafiles import v3_data_file
from iceberg_cdc.source.manifests import v3_field
from iceberg_cdc.source.reading import partition_value_from_json, partition_value_to_json

_COUNT_MAPS = ("column_sizes", "value_counts", "null_value_counts", "nan_value_counts")
_BOUND_MAPS = ("lower_bounds", "upper_bounds")
_V3_SCALARS = ("referenced_data_file", "content_offset", "content_size_in_bytes")


def data_file_to_json(data_file: DataFile) -> dict[str, Any]:
    """Everything a manifest entry holds about ``data_file``, as JSON values."""
    partition = data_file.partition
    out: dict[str, Any] = {
        "content": int(data_file.content),
        "file_path": data_file.file_path,
        "file_format": str(data_file.file_format.value),
        "partition": [partition_value_to_json(partition[i]) for i in range(len(partition))],
        "record_count": int(data_file.record_count),
        "file_size_in_bytes": int(data_file.file_size_in_bytes),
        "spec_id": int(data_file.spec_id or 0),
        "sort_order_id": data_file.sort_order_id,
        "split_offsets": list(data_file.split_offsets) if data_file.split_offsets else None,
        "equality_ids": list(data_file.equality_ids) if data_file.equality_ids else None,
    }
    for name in _COUNT_MAPS:
        values = getattr(data_file, name)
        out[name] = {str(k): int(v) for k, v in values.items()} if values else None
    for name in _BOUND_MAPS:
        values = getattr(data_file, name)
        out[name] = {str(k): bytes(v).hex() for k, v in values.items()} if values else None
    for name in _V3_SCALARS:
        out[name] = v3_field(data_file, name)
    return out


def data_file_from_json(data: dict[str, Any], partition_type: StructType) -> DataFile:
    """The ``DataFile`` :func:`data_file_to_json` described, in the v3 record layout."""
    fields = partition_type.fields
    values = data["partition"]
    if len(values) != len(fields):
        raise ValueError(
            f"{data['file_path']}: {len(values)} partition values recorded, the spec has {len(fields)} fields"
        )
    partition = Record(
        *[partition_value_from_json(f.field_type, v) for f, v in zip(fields, values, strict=True)]
    )
    kwargs: dict[str, Any] = {
        "content": DataFileContent(int(data["content"])),
        "file_path": data["file_path"],
        "file_format": FileFormat(data["file_format"]),
        "partition": partition,
        "record_count": int(data["record_count"]),
        "file_size_in_bytes": int(data["file_size_in_bytes"]),
        "sort_order_id": data.get("sort_order_id"),
        "split_offsets": data.get("split_offsets"),
        "equality_ids": data.get("equality_ids"),
        "key_metadata": None,
    }
    for name in _COUNT_MAPS:
        raw = data.get(name)
        kwargs[name] = {int(k): int(v) for k, v in raw.items()} if raw else None
    for name in _BOUND_MAPS:
        raw = data.get(name)
        kwargs[name] = {int(k): bytes.fromhex(v) for k, v in raw.items()} if raw else None
    for name in _V3_SCALARS:
        kwargs[name] = data.get(name)
    data_file = v3_data_file(**kwargs)
    data_file.spec_id = int(data.get("spec_id", 0))
    return data_file

"""Pins what :mod:`iceberg_cdc.pyiceberg_internals.manifests` assumes of pyiceberg 0.12.

Each test names the assumption; if an upgrade breaks one, it fails here
instead of in a mirror's commit.
"""

from __future__ import annotations

import json

import pytest
from pyiceberg.avro.file import AvroFile
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import (
    DATA_FILE_TYPE,
    MANIFEST_LIST_FILE_SCHEMAS,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
)
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import IntegerType, LongType, NestedField, StringType

from iceberg_cdc.pyiceberg_internals.manifests import (
    SpecManifestListWriter,
    SpecManifestWriter,
    as_record,
    data_file_struct,
    manifest_first_row_id,
    read_manifest_list,
)
from iceberg_cdc.source.manifests import manifest_entries, v3_field

SCHEMA = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "region", StringType()))
SPEC = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "region"), spec_id=0)


def _dv(path: str) -> DataFile:
    data_file = DataFile.from_args(
        _table_format_version=3,
        content=DataFileContent.POSITION_DELETES,
        file_path="s3://b/t/data/dv.puffin",
        file_format=FileFormat.PUFFIN,
        partition=Record("us"),
        record_count=3,
        file_size_in_bytes=120,
        referenced_data_file=path,
        content_offset=4,
        content_size_in_bytes=40,
    )
    data_file.spec_id = 0
    return data_file


def test_data_file_v3_struct_layout_is_what_records_are_built_in():
    """DataFile.from_args(_table_format_version=3) binds by DATA_FILE_TYPE[3] positions, v3 fields last."""
    ids = [f.field_id for f in DATA_FILE_TYPE[3].fields]
    assert ids[-4:] == [142, 143, 144, 145]
    assert 135 in ids and DATA_FILE_TYPE[3].field(135).field_type.element_id == 136
    assert v3_field(_dv("s3://b/t/data/a.parquet"), "content_offset") == 4


def test_pyicebergs_equality_ids_are_long_and_ours_int():
    """The reason for the door: pyiceberg types equality_ids' elements long; the spec says int."""
    assert isinstance(DATA_FILE_TYPE[2].field(135).field_type.element_type, LongType)
    partition_type = SPEC.partition_type(SCHEMA)
    for version in (2, 3):
        assert isinstance(
            data_file_struct(version, partition_type).field(135).field_type.element_type, IntegerType
        )
    v2_ids = {f.field_id for f in data_file_struct(2, partition_type).fields}
    assert 143 in v2_ids and not v2_ids & {142, 144, 145}


@pytest.mark.parametrize("version", [2, 3])
def test_spec_manifest_round_trips_and_is_typed_as_the_spec(tmp_path, version):
    """ManifestWriterV2 subclassed with our schemas: counting, seq numbers and summaries still work."""
    io = PyArrowFileIO()
    path = f"file://{tmp_path}/m.avro"
    dv = _dv("s3://b/t/data/a.parquet")
    with SpecManifestWriter(
        SPEC, SCHEMA, io.new_output(path), 99, "null", format_version=version, content=ManifestContent.DELETES
    ) as writer:
        writer.add(
            ManifestEntry.from_args(
                status=ManifestEntryStatus.ADDED,
                snapshot_id=99,
                sequence_number=None,
                file_sequence_number=None,
                data_file=as_record(dv),
            )
        )
    manifest = writer.to_manifest_file()
    assert manifest.content == ManifestContent.DELETES and manifest.added_files_count == 1
    assert manifest.partitions[0].lower_bound is not None
    with AvroFile(io.new_input(path), None) as reader:  # the file's own header
        header = reader.header
    metadata = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in header.meta.items()}
    assert metadata["content"] == "deletes" and metadata["format-version"] == str(version)
    assert metadata["partition-spec-id"] == "0" and metadata["schema-id"] == "0"
    avro = json.loads(metadata["avro.schema"])
    data_file = next(f for f in avro["fields"] if f["name"] == "data_file")["type"]
    equality = next(f for f in data_file["fields"] if f["name"] == "equality_ids")
    assert equality["type"][1]["items"] == "int" and equality["type"][1]["element-id"] == 136
    names = {f["name"] for f in data_file["fields"]}
    assert ("content_offset" in names) == (version == 3)
    manifest_file = ManifestFile.from_args(
        manifest_path=path,
        manifest_length=manifest.manifest_length,
        partition_spec_id=0,
        content=ManifestContent.DELETES,
        sequence_number=5,
        min_sequence_number=5,
        added_snapshot_id=99,
    )
    entries = manifest_entries(io, manifest_file, 3)
    assert [e.data_file.file_path for e in entries] == [dv.file_path]
    if version == 3:
        assert v3_field(entries[0].data_file, "referenced_data_file") == "s3://b/t/data/a.parquet"
    assert v3_field(entries[0].data_file, "referenced_data_file") is not None  # optional in v2 too


def test_v3_manifest_list_assigns_first_row_ids_to_data_manifests_only(tmp_path):
    """Java's rule: a data manifest without first_row_id gets the next row id; deletes get none."""
    assert MANIFEST_LIST_FILE_SCHEMAS[3].fields[-1].field_id == 520
    io = PyArrowFileIO()
    path = f"file://{tmp_path}/snap.avro"

    def manifest(name: str, content: ManifestContent, added: int, existing: int) -> ManifestFile:
        return ManifestFile.from_args(
            manifest_path=f"file://{tmp_path}/{name}",
            manifest_length=10,
            partition_spec_id=0,
            content=content,
            sequence_number=-1,
            min_sequence_number=-1,
            added_snapshot_id=7,
            added_files_count=1,
            existing_files_count=0,
            deleted_files_count=0,
            added_rows_count=added,
            existing_rows_count=existing,
            deleted_rows_count=0,
        )

    with SpecManifestListWriter(
        io.new_output(path), 7, None, 3, "null", format_version=3, first_row_id=100
    ) as writer:
        writer.add_manifests(
            [manifest("a", ManifestContent.DATA, 5, 2), manifest("d", ManifestContent.DELETES, 3, 0)]
        )
    assert writer.assigned_rows == 7
    read = read_manifest_list(io, path, 3)
    assert [manifest_first_row_id(m) for m in read] == [100, None]
    assert [m.sequence_number for m in read] == [3, 3]

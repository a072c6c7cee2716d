"""The pipeline's manifest reader (``source/manifests.py``): v3 fields and the spec's inheritance rules.

Two kinds of checks. Hand-written manifests pin each inheritance rule the
reader applies (spec, "Sequence Number Inheritance"). Manifests of real
tables -- v2 appends and merge-on-read deletes, a v3 table with deletion
vectors -- are read both by the pipeline and by the tests' own reader
(:mod:`cdc_devtools.reference_manifests`: fastavro, no shared code),
and every field the pipeline uses must agree.
"""

from __future__ import annotations

import fastavro
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriterV2,
)
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, NestedField, StringType

from cdc_devtools import reference_manifests as reference
from cdc_devtools.format_v3 import upgrade_to_v3
from cdc_devtools.mor import mor_merge
from cdc_devtools.orders import BY_REGION, SCHEMA, rows
from iceberg_cdc.source.manifests import manifest_entries, v3_field

KEY_SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False), NestedField(2, "region", StringType(), required=False)
)
REGION_SPEC = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "region"), spec_id=0)


def _data_file(path: str, region: str = "eu", spec_id: int = 9) -> DataFile:
    data_file = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=Record(region),
        record_count=5,
        file_size_in_bytes=100,
    )
    data_file.spec_id = spec_id  # the reader must take the manifest's spec, not this
    return data_file


def _entry(status, path, snapshot_id=None, seq=None, file_seq=None) -> ManifestEntry:
    return ManifestEntry.from_args(
        status=status,
        snapshot_id=snapshot_id,
        sequence_number=seq,
        file_sequence_number=file_seq,
        data_file=_data_file(path),
    )


def _manifest(tmp_path, entries, *, sequence_number: int, added_snapshot_id: int = 42) -> ManifestFile:
    """The entries written as they are (nulls kept), and a manifest-list record naming them."""
    io = PyArrowFileIO()
    path = f"file://{tmp_path}/m-{sequence_number}.avro"
    with ManifestWriterV2(REGION_SPEC, KEY_SCHEMA, io.new_output(path), added_snapshot_id, "deflate") as w:
        for entry in entries:
            w.add_entry(entry)
    return ManifestFile.from_args(
        manifest_path=path,
        manifest_length=len(io.new_input(path)),
        partition_spec_id=3,
        content=ManifestContent.DATA,
        sequence_number=sequence_number,
        min_sequence_number=0,
        added_snapshot_id=added_snapshot_id,
    )


def _by_path(entries):
    return {e.data_file.file_path: e for e in entries}


def test_added_entries_inherit_the_manifests_snapshot_and_sequence_numbers(tmp_path):
    manifest = _manifest(
        tmp_path,
        [
            _entry(ManifestEntryStatus.ADDED, "added"),
            _entry(ManifestEntryStatus.EXISTING, "existing", snapshot_id=5, seq=3, file_seq=2),
            _entry(ManifestEntryStatus.DELETED, "deleted", snapshot_id=6, seq=4, file_seq=4),
        ],
        sequence_number=7,
    )
    entries = _by_path(manifest_entries(PyArrowFileIO(), manifest, 2))
    assert set(entries) == {"added", "existing"}, "DELETED entries are left out by default"
    added, existing = entries["added"], entries["existing"]
    assert (added.snapshot_id, added.sequence_number, added.file_sequence_number) == (42, 7, 7)
    assert added.status == ManifestEntryStatus.ADDED
    # an existing entry keeps its own numbers: it was added earlier, with an older sequence number
    assert (existing.snapshot_id, existing.sequence_number, existing.file_sequence_number) == (5, 3, 2)
    # the partition spec is always the manifest's
    assert {e.data_file.spec_id for e in entries.values()} == {3}
    assert added.data_file.partition == Record("eu") and added.data_file.record_count == 5

    every = _by_path(manifest_entries(PyArrowFileIO(), manifest, 2, discard_deleted=False))
    deleted = every["deleted"]
    assert deleted.status == ManifestEntryStatus.DELETED
    assert (deleted.snapshot_id, deleted.sequence_number) == (6, 4)


def _v1_manifest(tmp_path, sequence_number: int) -> ManifestFile:
    """A manifest as format v1 writes it (no sequence numbers, no content), written with fastavro."""
    optional = ["null", "string"]
    schema = {
        "type": "record",
        "name": "manifest_entry",
        "fields": [
            {"name": "status", "type": "int", "field-id": 0},
            {"name": "snapshot_id", "type": "long", "field-id": 1},
            {
                "name": "data_file",
                "field-id": 2,
                "type": {
                    "type": "record",
                    "name": "r2",
                    "fields": [
                        {"name": "file_path", "type": "string", "field-id": 100},
                        {"name": "file_format", "type": "string", "field-id": 101},
                        {
                            "name": "partition",
                            "field-id": 102,
                            "type": {
                                "type": "record",
                                "name": "r102",
                                "fields": [{"name": "region", "type": optional, "field-id": 1000}],
                            },
                        },
                        {"name": "record_count", "type": "long", "field-id": 103},
                        {"name": "file_size_in_bytes", "type": "long", "field-id": 104},
                        {"name": "block_size_in_bytes", "type": "long", "field-id": 105},
                    ],
                },
            },
        ],
    }
    records = [
        {
            "status": status,
            "snapshot_id": snapshot_id,
            "data_file": {
                "file_path": path,
                "file_format": "PARQUET",
                "partition": {"region": "eu"},
                "record_count": 5,
                "file_size_in_bytes": 100,
                "block_size_in_bytes": 64 << 20,
            },
        }
        for status, snapshot_id, path in [(0, 5, "existing"), (1, 42, "added")]
    ]
    path = tmp_path / f"v1-{sequence_number}.avro"
    with open(path, "wb") as out:
        fastavro.writer(out, schema, records, metadata={"format-version": "1", "partition-spec-id": "0"})
    return ManifestFile.from_args(
        manifest_path=f"file://{path}",
        manifest_length=path.stat().st_size,
        partition_spec_id=3,
        content=ManifestContent.DATA,
        sequence_number=sequence_number,
        min_sequence_number=0,
        added_snapshot_id=42,
    )


def test_entries_of_a_v1_manifest_have_sequence_number_zero(tmp_path):
    """A manifest written before format v2 has no sequence numbers: its entries' are 0 (its own is 0)."""
    read = _by_path(manifest_entries(PyArrowFileIO(), _v1_manifest(tmp_path, 0), 2))
    assert {p: (e.sequence_number, e.file_sequence_number) for p, e in read.items()} == {
        "existing": (0, 0),
        "added": (0, 0),
    }
    assert read["existing"].snapshot_id == 5, "an entry's own snapshot id is never replaced"
    assert read["existing"].data_file.content == DataFileContent.DATA, "a v1 file is data"
    assert read["existing"].data_file.partition == Record("eu")
    # The rule keys on the manifest's number: a nonzero one is inherited by ADDED entries only.
    read = _by_path(manifest_entries(PyArrowFileIO(), _v1_manifest(tmp_path, 7), 2))
    assert (read["added"].sequence_number, read["existing"].sequence_number) == (7, None)


def test_v3_field_reads_a_v3_record_and_is_none_on_a_v2_one():
    v3 = DataFile.from_args(
        _table_format_version=3,
        content=DataFileContent.POSITION_DELETES,
        file_path="dv.puffin",
        file_format=FileFormat.PUFFIN,
        partition=Record(),
        record_count=3,
        file_size_in_bytes=99,
        referenced_data_file="data.parquet",
        content_offset=4,
        content_size_in_bytes=40,
    )
    assert v3_field(v3, "referenced_data_file") == "data.parquet"
    assert (v3_field(v3, "content_offset"), v3_field(v3, "content_size_in_bytes")) == (4, 40)
    assert v3_field(v3, "first_row_id") is None
    v2 = _data_file("data.parquet")
    assert v3_field(v2, "referenced_data_file") is None and v3_field(v2, "content_offset") is None
    assert v3_field(v2, "record_count") == 5
    with pytest.raises(KeyError):
        v3_field(v3, "no_such_field")


# --------------------------------------------------------------------------- against the reference reader


@pytest.fixture
def catalog(tmp_path) -> SqlCatalog:
    catalog = SqlCatalog("m", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("shop")
    return catalog


def _assert_same_as_reference(table) -> int:
    """Every live entry of every snapshot's manifests, read by both readers, agrees; returns how many."""
    version = table.metadata.format_version
    compared = 0
    for snapshot in table.snapshots():
        for manifest in snapshot.manifests(table.io):
            ours = manifest_entries(table.io, manifest, version)
            theirs = reference.manifest_file_entries(table.io, manifest, version)
            assert len(ours) == len(theirs), manifest.manifest_path
            for a, b in zip(ours, theirs, strict=True):
                f = a.data_file
                assert (int(a.status), a.snapshot_id, a.sequence_number, a.file_sequence_number) == (
                    b.status,
                    b.snapshot_id,
                    b.sequence_number,
                    b.file_sequence_number,
                )
                assert (int(f.content), f.file_path, f.file_format.value, f.spec_id) == (
                    b.content,
                    b.file_path,
                    b.file_format,
                    b.spec_id,
                )
                assert tuple(f.partition[i] for i in range(len(f.partition))) == b.partition
                assert f.record_count == b.record_count
                assert tuple(f.equality_ids or ()) == b.equality_ids
                assert v3_field(f, "referenced_data_file") == b.referenced_data_file
                assert v3_field(f, "content_offset") == b.content_offset
                assert v3_field(f, "content_size_in_bytes") == b.content_size_in_bytes
                compared += 1
    return compared


def test_v2_appends_and_merge_on_read_deletes_read_as_the_reference_reads_them(catalog):
    table = catalog.create_table("shop.orders", SCHEMA, partition_spec=BY_REGION)
    table.append(rows(range(10), "us"))
    table.append(rows(range(10, 20), "eu"))
    mor_merge(table, upserts=rows([1, 12], ["eu", "us"], status="moved"), delete_keys=[3], deletes="position")
    mor_merge(table, upserts=rows([4], "us", status="upserted"), delete_keys=[15], deletes="equality")
    contents = {
        e.data_file.content
        for m in table.current_snapshot().manifests(table.io)
        for e in manifest_entries(table.io, m, 2)
    }
    assert contents == {
        DataFileContent.DATA,
        DataFileContent.POSITION_DELETES,
        DataFileContent.EQUALITY_DELETES,
    }
    assert _assert_same_as_reference(table) >= 8


def test_deletion_vectors_of_a_v3_table_carry_their_blobs_location(catalog):
    table = catalog.create_table("shop.orders", SCHEMA, partition_spec=BY_REGION)
    table.append(rows(range(10), "us"))
    table = upgrade_to_v3(table)
    mor_merge(table, upserts=rows([1], "eu", status="moved"), delete_keys=[2, 3], deletes="position")
    mor_merge(table, delete_keys=[4], deletes="position")  # replaces the file's DV with a merged one
    dvs = [
        e
        for m in table.current_snapshot().manifests(table.io)
        for e in manifest_entries(table.io, m, 3)
        if e.data_file.file_format == FileFormat.PUFFIN
    ]
    assert len(dvs) == 1, "one live DV per data file"
    dv = dvs[0].data_file
    assert v3_field(dv, "referenced_data_file").endswith(".parquet")
    assert v3_field(dv, "content_offset") >= 4 and v3_field(dv, "content_size_in_bytes") > 0
    assert dv.record_count == 4  # the old row of id 1 (moved), ids 2, 3 and 4
    assert _assert_same_as_reference(table) >= 4
    # read with the v2 schema (as pyiceberg's own reader does), the DV's location is lost
    v2_read = [
        e
        for m in table.current_snapshot().manifests(table.io)
        for e in manifest_entries(table.io, m, 2)
        if e.data_file.file_format == FileFormat.PUFFIN
    ]
    assert v3_field(v2_read[0].data_file, "referenced_data_file") is None

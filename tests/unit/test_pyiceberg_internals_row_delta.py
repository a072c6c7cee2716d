"""Pins what :mod:`~iceberg_cdc.pyiceberg_internals.row_delta`, ``format_v3`` and ``data_writer`` assume.

A real SQLite catalog and local files; each test names the pyiceberg 0.12
behaviour it relies on.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.manifest import DataFileContent
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import TableProperties
from pyiceberg.table.metadata import TableMetadataV3
from pyiceberg.table.snapshots import Operation
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType

from iceberg_cdc.errors import StaleDeltaError
from iceberg_cdc.mirror.iceberg.delete_files import FileDeletes, position_delete_file
from iceberg_cdc.pyiceberg_internals.data_writer import metadata_for_units, parse_metadata, write_data_files
from iceberg_cdc.pyiceberg_internals.format_v3 import writing_v3_metadata
from iceberg_cdc.pyiceberg_internals.row_delta import AssertedProperties, RowDelta, file_key

SCHEMA = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "region", StringType()))
SPEC = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "region"))
ROWS = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "region": ["us", "us", "eu"]}).cast(SCHEMA.as_arrow())


@pytest.fixture
def catalog(tmp_path) -> SqlCatalog:
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("ns")
    return catalog


def _create(catalog: SqlCatalog, version: int):
    with writing_v3_metadata():
        return catalog.create_table(
            "ns.t", schema=SCHEMA, partition_spec=SPEC, properties={"format-version": str(version)}
        )


def test_pyiceberg_refuses_v3_metadata_and_the_guard_lifts_only_inside(catalog):
    """TableMetadataV3.model_dump_json raises (iceberg-python#1551); inside the guard a v3 table is created."""
    with pytest.raises(NotImplementedError):
        catalog.create_table("ns.refused", schema=SCHEMA, properties={"format-version": "3"})
    table = _create(catalog, 3)
    assert catalog.load_table("ns.t").metadata.format_version == 3
    with pytest.raises(NotImplementedError):
        table.metadata.model_dump_json()
    assert isinstance(table.metadata, TableMetadataV3)


@pytest.mark.parametrize("version", [2, 3])
def test_data_writer_splits_by_partition_under_the_given_path(catalog, tmp_path, version):
    """_dataframe_to_data_files(metadata, df, io, write_uuid=...) honours write.data.path with object storage off."""
    table = _create(catalog, version)
    metadata = parse_metadata(metadata_for_units(table.metadata))
    assert metadata.format_version == version and not metadata.snapshots
    assert TableProperties.WRITE_DATA_PATH == "write.data.path"
    files = write_data_files(table.io, metadata, ROWS, f"file://{tmp_path}/staged")
    assert sorted(f.partition[0] for f in files) == ["eu", "us"]
    assert all(f.file_path.startswith(f"file://{tmp_path}/staged/") for f in files)
    assert sum(f.record_count for f in files) == 3 and all(f.lower_bounds for f in files)


@pytest.mark.parametrize("version", [2, 3])
def test_row_delta_commits_data_and_deletes_in_one_snapshot(catalog, tmp_path, version):
    """An UpdateTableMetadata's (updates, requirements) are staged by .commit() and sent by commit_transaction."""
    table = _create(catalog, version)
    files = write_data_files(table.io, table.metadata, ROWS, f"file://{tmp_path}/d")
    with writing_v3_metadata():
        tx = table.transaction()
        AssertedProperties(tx, {"k": "1"}, None).commit()
        delta = RowDelta(
            tx, base_snapshot_id=None, add=files, remove={}, operation=Operation.APPEND, properties={}
        )
        delta.commit()
        tx.commit_transaction()
    table = catalog.load_table("ns.t")
    assert table.current_snapshot().snapshot_id == delta.snapshot_id and table.properties["k"] == "1"
    summary = table.current_snapshot().summary
    assert summary["total-records"] == "3"
    us = next(f for f in files if f.partition[0] == "us")
    deletes = position_delete_file(
        table.io,
        f"file://{tmp_path}/d/del.parquet",
        FileDeletes(us.file_path, pa.array([0]).to_numpy(), 0, us.partition),
    )
    manifest = table.current_snapshot().manifests(table.io)[0].manifest_path
    with writing_v3_metadata():
        tx = table.transaction()
        RowDelta(
            tx,
            base_snapshot_id=delta.snapshot_id,
            add=[deletes],
            remove={manifest: [file_key(next(f for f in files if f.partition[0] == "eu"))]},
            operation=Operation.OVERWRITE,
            properties={"marker": "x"},
        ).commit()
        tx.commit_transaction()
    table = catalog.load_table("ns.t")
    summary = table.current_snapshot().summary
    assert summary["total-position-deletes"] == "1" and summary["total-records"] == "2"
    assert summary["marker"] == "x"
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == [2]
    if version == 3:
        assert table.current_snapshot().first_row_id is not None


def test_requirements_are_checked_against_the_transactions_state(catalog, tmp_path):
    """Why AssertedProperties goes first: after a RowDelta in the same transaction main has moved."""
    table = _create(catalog, 2)
    files = write_data_files(table.io, table.metadata, ROWS, f"file://{tmp_path}/d")
    tx = table.transaction()
    RowDelta(
        tx, base_snapshot_id=None, add=files, remove={}, operation=Operation.APPEND, properties={}
    ).commit()
    with pytest.raises(CommitFailedException):
        AssertedProperties(tx, {"k": "1"}, None).commit()


def test_a_moved_head_fails_the_commit_without_an_internal_retry(catalog, tmp_path):
    """No snapshot producer is registered, so Transaction.commit_transaction does not retry on its own."""
    table = _create(catalog, 2)
    files = write_data_files(table.io, table.metadata, ROWS, f"file://{tmp_path}/d")
    stale = catalog.load_table("ns.t")
    table.append(ROWS)  # someone else commits first
    tx = stale.transaction()
    RowDelta(
        tx, base_snapshot_id=None, add=files, remove={}, operation=Operation.APPEND, properties={}
    ).commit()
    with pytest.raises(CommitFailedException):
        tx.commit_transaction()
    assert len(catalog.load_table("ns.t").snapshots()) == 1


def test_removing_a_file_that_is_not_there_is_stale(catalog, tmp_path):
    table = _create(catalog, 2)
    table.append(ROWS)
    manifest = table.current_snapshot().manifests(table.io)[0].manifest_path
    tx = table.transaction()
    with pytest.raises(StaleDeltaError):
        RowDelta(
            tx,
            base_snapshot_id=table.current_snapshot().snapshot_id,
            add=[],
            remove={manifest: [("file:///nowhere.parquet", None)]},
            operation=Operation.DELETE,
            properties={},
        ).commit()
    assert DataFileContent.DATA == 0

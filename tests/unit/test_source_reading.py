"""Reading data files by field id under a later schema, in bounded batches, as an executor would."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import DoubleType, LongType, StringType

from iceberg_cdc.errors import ConfigError
from iceberg_cdc.source import reading
from iceberg_cdc.source.changes import initial_load_changes, snapshot_changes
from iceberg_cdc.source.reading import (
    batch_rows,
    file_io,
    output_schema,
    read_data_file,
    schema_from_json,
    schema_to_json,
)
from tests.support.iceberg_tables import cow_rewrite, create_table, live_files, sql_catalog

V1 = pa.schema(
    [
        pa.field("id", pa.int32()),
        pa.field("name", pa.string()),
        pa.field("score", pa.float32()),
        pa.field("legacy", pa.string()),
    ]
)


@pytest.fixture
def catalog(tmp_path):
    return sql_catalog(tmp_path)


def read_all(io, path, schema, batch_size=65536, name_mapping=None) -> pa.Table:
    batches = list(read_data_file(io, path, schema, batch_size, name_mapping=name_mapping))
    return pa.Table.from_batches(batches, schema=output_schema(schema))


@pytest.fixture
def evolved(catalog):
    """A table with one file written before and one after: add, rename, widen int/float, drop."""
    table = create_table(catalog, "t", schema=V1)
    table.append(
        pa.table(
            {
                "id": pa.array([1, 2], pa.int32()),
                "name": ["ann", "bob"],
                "score": pa.array([1.5, 2.5], pa.float32()),
                "legacy": ["x", "y"],
            },
            schema=V1,
        )
    )
    (old_file,) = live_files(table)
    with table.update_schema() as update:
        update.add_column("region", StringType())
        update.rename_column("name", "full_name")
        update.update_column("id", LongType())
        update.update_column("score", DoubleType())
        update.delete_column("legacy")
    new_schema = table.schema()
    table.append(
        pa.table(
            {
                "id": pa.array([2**40], pa.int64()),
                "full_name": ["cyd"],
                "score": pa.array([3.25], pa.float64()),
                "region": ["EU"],
            }
        )
    )
    new_file = next(f for f in live_files(table) if f.file_path != old_file.file_path)
    return table, old_file.file_path, new_file.file_path, new_schema


def test_old_file_reads_in_the_new_schema(evolved):
    table, old_path, new_path, schema = evolved
    old = read_all(table.io, old_path, schema)
    assert old.column_names == ["id", "full_name", "score", "region"]
    assert old.to_pylist() == [
        {"id": 1, "full_name": "ann", "score": 1.5, "region": None},
        {"id": 2, "full_name": "bob", "score": 2.5, "region": None},
    ]
    new = read_all(table.io, new_path, schema)
    assert new.to_pylist() == [{"id": 2**40, "full_name": "cyd", "score": 3.25, "region": "EU"}]


def test_every_file_of_a_snapshot_has_the_same_arrow_schema(evolved):
    table, old_path, new_path, schema = evolved
    expected = output_schema(schema)
    assert expected.field("id").type == pa.int64() and expected.field("score").type == pa.float64()
    assert expected.field("full_name").type == pa.large_string()
    for path in (old_path, new_path):
        for batch in read_data_file(table.io, path, schema):
            assert batch.schema.equals(expected, check_metadata=True)
            assert all(not f.metadata for f in batch.schema)  # no field-id metadata


def test_snapshot_schema_reads_like_pyiceberg_scan(evolved):
    table, _, _, _ = evolved
    snapshot = table.current_snapshot()
    schema = table.schemas()[snapshot.schema_id]
    changes = initial_load_changes(table, snapshot.snapshot_id)
    ours = pa.concat_tables(read_all(table.io, ref.path, schema) for ref in changes.added)
    theirs = table.scan(snapshot_id=snapshot.snapshot_id).to_arrow().cast(output_schema(schema))
    assert ours.sort_by("id").equals(theirs.sort_by("id"))


def test_executor_reads_with_only_path_schema_json_and_io_properties(evolved):
    table, old_path, _, schema = evolved
    shipped = schema_from_json(schema_to_json(schema))
    assert shipped == schema
    executor_io = file_io({})  # local files: no properties needed; s3.* would go here
    assert read_all(executor_io, old_path, shipped).equals(read_all(table.io, old_path, schema))


def test_deleted_file_of_an_old_schema_is_read_in_the_snapshot_schema(evolved):
    table, old_path, _, _ = evolved
    old_file = next(f for f in live_files(table) if f.file_path == old_path)
    snapshot_id = cow_rewrite(table, [old_file], pa.table({"id": pa.array([1], pa.int64())}))
    changes = snapshot_changes(table, snapshot_id)
    schema = table.schemas()[changes.schema_id]
    (deleted,) = changes.deleted
    (added,) = changes.added
    removed_rows = read_all(table.io, deleted.path, schema)
    added_rows = read_all(table.io, added.path, schema)
    assert removed_rows.schema == added_rows.schema
    assert removed_rows.column("full_name").to_pylist() == ["ann", "bob"]
    assert added_rows.to_pylist() == [{"id": 1, "full_name": None, "score": None, "region": None}]


def test_reads_stream_in_bounded_batches(catalog):
    rows = 200_000
    table = create_table(
        catalog,
        "big",
        schema=pa.schema(
            [pa.field("id", pa.int64()), pa.field("a", pa.int64()), pa.field("b", pa.float64())]
        ),
        properties={"write.parquet.row-group-limit": "10000"},
    )
    ids = pa.array(range(rows), pa.int64())
    table.append(pa.table({"id": ids, "a": pc.multiply(ids, 3), "b": pc.cast(ids, pa.float64())}))
    (data_file,) = live_files(table)
    decoded_bytes = rows * 24

    baseline = pa.total_allocated_bytes()
    peak = 0
    count = 0
    sizes = []
    for batch in read_data_file(table.io, data_file.file_path, table.schema(), batch_size=4096):
        peak = max(peak, pa.total_allocated_bytes() - baseline)
        sizes.append(batch.num_rows)
        count += int(pc.sum(batch.column("a")).as_py())
        del batch
    assert sum(sizes) == rows and max(sizes) <= 4096 and len(sizes) >= rows // 4096
    assert count == 3 * rows * (rows - 1) // 2
    assert peak < decoded_bytes / 4, f"peak {peak} B of Arrow memory for a {decoded_bytes} B file"


def test_batches_hold_about_batch_bytes_of_the_files_column_data(catalog, monkeypatch):
    """Without a batch size, a batch is BATCH_BYTES of the file's uncompressed columns, in rows."""
    rows = 100_000
    table = create_table(
        catalog, "sized", schema=pa.schema([pa.field("id", pa.int64()), pa.field("a", pa.int64())])
    )
    ids = pa.array(range(rows), pa.int64())
    table.append(pa.table({"id": ids, "a": pc.multiply(ids, 7)}))
    (data_file,) = live_files(table)
    metadata = pq.ParquetFile(data_file.file_path.removeprefix("file://")).metadata
    per_row = sum(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups)) / rows
    monkeypatch.setattr(reading, "BATCH_BYTES", int(per_row * 10_000))
    assert 9_990 <= batch_rows(metadata) <= 10_010
    sizes = [b.num_rows for b in read_data_file(table.io, data_file.file_path, table.schema())]
    assert sum(sizes) == rows and max(sizes) == batch_rows(metadata) and len(sizes) == -(-rows // sizes[0])
    # Bounded both ways: a tiny target still reads thousands of rows, a huge one at most 1 M.
    assert batch_rows(metadata, target_bytes=1) == reading.MIN_BATCH_ROWS
    assert batch_rows(metadata, target_bytes=1 << 40) == reading.MAX_BATCH_ROWS


def test_batches_count_only_the_columns_read(catalog, monkeypatch):
    """A read of fewer columns (a key-only read) gets more rows a batch, by those columns' bytes."""
    rows = 50_000
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("a", pa.int64()), pa.field("note", pa.string())])
    table = create_table(catalog, "keyed", schema=schema)
    ids = pa.array(range(rows), pa.int64())
    table.append(
        pa.table({"id": ids, "a": pc.multiply(ids, 7), "note": pc.cast(ids, pa.string())}, schema=schema)
    )
    (data_file,) = live_files(table)
    metadata = pq.ParquetFile(data_file.file_path.removeprefix("file://")).metadata
    group = metadata.row_group(0)
    size = {group.column(j).path_in_schema: group.column(j).total_uncompressed_size for j in range(3)}
    target = int(sum(size.values()) / rows * 10_000)
    assert batch_rows(metadata, None, target) == target // (sum(size.values()) / rows)
    assert batch_rows(metadata, {"id"}, target) == target // (size["id"] / rows)
    assert batch_rows(metadata, {"id"}, target) > 2 * batch_rows(metadata, None, target)
    # read_data_file sizes a key-only read by the key's bytes.
    monkeypatch.setattr(reading, "BATCH_BYTES", target)
    keys = Schema(table.schema().find_field("id"))
    sizes = [b.num_rows for b in read_data_file(table.io, data_file.file_path, keys)]
    assert max(sizes) == batch_rows(metadata, {"id"}, target) and sum(sizes) == rows


def test_invalid_batch_size(evolved):
    table, old_path, _, schema = evolved
    with pytest.raises(ValueError):
        next(read_data_file(table.io, old_path, schema, batch_size=0))


NESTED = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("tags", pa.list_(pa.string())),
        pa.field("attrs", pa.map_(pa.string(), pa.int32())),
        pa.field("address", pa.struct([pa.field("city", pa.string()), pa.field("zip", pa.int32())])),
    ]
)


def test_nested_columns_evolve_and_keep_one_schema(catalog):
    table = create_table(catalog, "nested", schema=NESTED)
    table.append(
        pa.table(
            {
                "id": [1],
                "tags": [["a", "b"]],
                "attrs": [[("k", 1)]],
                "address": [{"city": "Oslo", "zip": 150}],
            },
            schema=NESTED,
        )
    )
    (path,) = [f.file_path for f in live_files(table)]
    with table.update_schema() as update:
        update.add_column(("address", "country"), StringType())
        update.rename_column("address.city", "town")
        update.update_column("address.zip", LongType())
    schema = table.schema()
    result = read_all(table.io, path, schema)
    assert result.schema.equals(output_schema(schema), check_metadata=True)
    assert result.to_pylist() == [
        {
            "id": 1,
            "tags": ["a", "b"],
            "attrs": [("k", 1)],
            "address": {"town": "Oslo", "zip": 150, "country": None},
        }
    ]


def test_files_without_field_ids_need_the_name_mapping(catalog, tmp_path):
    table = create_table(catalog, "imported", schema=pa.schema([pa.field("id", pa.int64())]))
    path = str(tmp_path / "plain.parquet")
    pq.write_table(pa.table({"id": pa.array([5, 6], pa.int64())}), path)
    schema = table.schema()
    with pytest.raises(ConfigError, match=r"plain\.parquet.*set it on the table"):
        read_all(table.io, path, schema)
    mapped = read_all(table.io, path, schema, name_mapping=schema.name_mapping)
    assert mapped.column("id").to_pylist() == [5, 6]

"""Staged change files: where they go, how they are written, and cleanup of uncommitted ones."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import PyArrowFileIO

from iceberg_cdc.sink.commit import commit_changes
from iceberg_cdc.sink.schema import sink_schema_for, to_sink_arrow
from iceberg_cdc.sink.staging import (
    delete_uncommitted_staged,
    list_staged,
    staged_file_path,
    write_staged_file,
)
from iceberg_cdc.sink.table import ensure_sink_table
from tests.support.sink_tables import (
    SINK,
    SOURCE,
    SOURCE_UUID,
    TS,
    change_rows,
    make_catalog,
    sink_rows,
    source_schema,
    stage,
    stage_and_commit,
)


@pytest.fixture
def catalog(tmp_path):
    return make_catalog(tmp_path)


@pytest.fixture
def sink(catalog):
    return ensure_sink_table(catalog, SINK, source_schema())


def _sink_rows_arrow(ids, snapshot_id=1001):
    return to_sink_arrow(change_rows(ids), sink_schema_for(source_schema()), 1, snapshot_id, TS)


def test_staged_file_path_is_deterministic_under_the_data_location():
    path = staged_file_path("s3://bucket/wh/shop/orders_changes/", 42, "run7-range003")
    assert path == "s3://bucket/wh/shop/orders_changes/data/_staged/snapshot=42/run7-range003.parquet"
    assert path == staged_file_path("s3://bucket/wh/shop/orders_changes", 42, "run7-range003")
    for bad in ("", "a/b"):
        with pytest.raises(ValueError, match="no '/'"):
            staged_file_path("s3://b/t", 1, bad)


def test_write_staged_file_writes_zstd_parquet_with_field_ids(tmp_path):
    io = PyArrowFileIO()
    table = _sink_rows_arrow(range(25))
    path = f"file://{tmp_path}/t/data/_staged/snapshot=1001/a.parquet"
    staged = write_staged_file(io, path, table)
    local = path.removeprefix("file://")
    assert staged.path == path and staged.record_count == 25
    assert staged.file_size == len(open(local, "rb").read())  # noqa: SIM115
    metadata = pq.read_metadata(local)
    assert metadata.row_group(0).column(0).compression == "ZSTD"
    parquet_schema = pq.read_schema(local)
    assert parquet_schema.field("id").metadata[b"PARQUET:field_id"] == b"1"
    assert pq.read_table(local).to_pylist() == table.to_pylist()


def _dictionary_encoded(local: str) -> dict[str, bool]:
    metadata = pq.read_metadata(local)
    row_group = metadata.row_group(0)
    return {
        row_group.column(i).path_in_schema: row_group.column(i).has_dictionary_page
        for i in range(row_group.num_columns)
    }


def test_only_columns_with_few_distinct_values_get_a_dictionary(tmp_path):
    # Arrow would hash every id and every note into a dictionary it drops at 1 MiB; the first
    # batch's sample shows which columns repeat (here status, the constants, the nested column
    # aside: written plain).
    n = 40_000
    table = pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "status": pa.array(["new", "paid", "shipped", "gone"] * (n // 4)),
            "note": pa.array([f"note {i}" for i in range(n)]),
            "half": pa.array([i // 2 for i in range(n)], pa.int64()),  # n/2 distinct: exactly half
            "third": pa.array([i % (n // 2 + 1) for i in range(n)], pa.int64()),  # just over half
            "point": pa.array([{"x": i % 3} for i in range(n)]),
            # an extension column counts by its storage: eight UUIDs repeated
            "uuid": pa.array([bytes([i % 8]) * 16 for i in range(n)], pa.uuid()),
        }
    )
    path = f"{tmp_path}/d.parquet"
    write_staged_file(PyArrowFileIO(), f"file://{path}", table)
    assert _dictionary_encoded(path) == {
        "id": False,
        "status": True,
        "note": False,
        "half": True,
        "third": False,
        "point.x": False,
        "uuid": True,
    }
    assert pq.read_table(path).equals(table)


def test_write_staged_file_streams_batches_and_never_overwrites(tmp_path):
    io = PyArrowFileIO()
    table = _sink_rows_arrow(range(30))
    path = f"file://{tmp_path}/s/x.parquet"
    batches = iter(table.to_batches(max_chunksize=7))
    first = write_staged_file(io, path, batches)  # schema from the first batch
    assert first.record_count == 30
    assert first.file_size == len(open(path.removeprefix("file://"), "rb").read())  # noqa: SIM115
    # a staged file may already be committed: writing it again is refused, the file stays
    with pytest.raises(FileExistsError):
        write_staged_file(io, path, iter(table.slice(0, 5).to_batches()), schema=table.schema)
    assert pq.read_table(path.removeprefix("file://")).num_rows == 30
    # nothing at all but a schema: an empty file that commits as nothing
    empty = f"file://{tmp_path}/s/empty.parquet"
    assert write_staged_file(io, empty, iter([]), schema=table.schema).record_count == 0
    with pytest.raises(ValueError, match="no batches and no schema"):
        write_staged_file(io, f"file://{tmp_path}/s/none.parquet", iter([]))


def test_staged_paths_live_in_the_attempt_directory(sink):
    path = staged_file_path(sink.location(), 1001, "range-00001-abc", attempt="epoch-7")
    assert path.endswith("/data/_staged/snapshot=1001/epoch-7/range-00001-abc.parquet")
    with pytest.raises(ValueError):
        staged_file_path(sink.location(), 1001, "x", attempt="a/b")


def test_list_staged_lists_one_snapshot(sink):
    a = stage(sink, 1001, 1, [change_rows([1]), change_rows([2])])
    stage(sink, 1002, 2, [change_rows([3])])
    listed = list_staged(sink.location(), 1001)
    assert sorted(f.path for f in listed) == sorted(a)
    assert all(f.file_size > 0 for f in listed)
    assert list_staged(sink.location(), 999) == []


def test_delete_uncommitted_staged_removes_only_uncommitted_files(sink):
    committed = stage(sink, 1001, 1, [change_rows([1, 2]), change_rows([3])])
    commit_changes(
        sink,
        staged_paths=committed,
        source_identifier=SOURCE,
        source_uuid=SOURCE_UUID,
        snapshot_id=1001,
        ordinal=1,
    )
    # a failed earlier attempt left a file the commit did not take; another snapshot's run is under way
    leftover = stage(sink, 1001, 1, [change_rows([9])], prefix="attempt0")
    other = stage(sink, 1002, 2, [change_rows([4])])

    deleted = delete_uncommitted_staged(sink, 1001)
    assert deleted == leftover
    assert sorted(f.path for f in list_staged(sink.location(), 1001)) == sorted(committed)
    assert [f.path for f in list_staged(sink.location(), 1002)] == other
    assert len(sink_rows(sink)) == 3  # the committed data still reads
    assert delete_uncommitted_staged(sink, 1001) == []


def test_cleanup_after_a_failed_run_deletes_everything_of_the_snapshot(sink):
    staged = stage(sink, 1001, 1, [change_rows([1]), change_rows([2])])
    assert sorted(delete_uncommitted_staged(sink, 1001)) == sorted(staged)
    assert list_staged(sink.location(), 1001) == []
    assert delete_uncommitted_staged(sink, 1001) == []


def test_files_replaced_by_a_reprocess_stay_for_time_travel(sink):
    first = stage_and_commit(sink, 1001, 1, [1, 2, 3, 4])
    stage_and_commit(sink, 1001, 1, [7], prefix="reprocess1", replace_existing=True)
    # the original files are no longer live, but the first commit's snapshot still references them
    assert delete_uncommitted_staged(sink, 1001) == []
    assert len(sink.scan(snapshot_id=first.sink_snapshot_id).to_arrow()) == 4


def test_cleanup_after_history_expiry_keeps_files_that_are_still_live(sink):
    first = stage_and_commit(sink, 1001, 1, [1, 2])
    stage_and_commit(sink, 1002, 2, [3])
    stage_and_commit(sink, 1003, 3, [4])
    # the commit that added snapshot 1001's files is expired; the files are still live
    sink.maintenance.expire_snapshots().by_id(first.sink_snapshot_id).commit()
    assert sink.snapshot_by_id(first.sink_snapshot_id) is None
    leftover = stage(sink, 1001, 1, [change_rows([5])], prefix="attempt0")

    assert delete_uncommitted_staged(sink, 1001) == leftover
    assert sorted(r["id"] for r in sink_rows(sink, 1001)) == [1, 2]


@pytest.mark.s3
def test_staging_commit_and_cleanup_on_s3(tmp_path, s3_bucket, s3_properties):
    catalog = SqlCatalog(
        "s3cat", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=f"s3://{s3_bucket}/wh", **s3_properties
    )
    sink = ensure_sink_table(catalog, SINK, source_schema())
    assert sink.location().startswith(f"s3://{s3_bucket}/")
    committed = stage(sink, 1001, 1, [change_rows(range(6))])
    result = commit_changes(
        sink,
        staged_paths=committed,
        source_identifier=SOURCE,
        source_uuid=SOURCE_UUID,
        snapshot_id=1001,
        ordinal=1,
    )
    assert result.committed and result.records == 6
    leftover = stage(sink, 1001, 1, [change_rows([9])], prefix="attempt0")

    # an executor only has FileIO properties, no catalog
    executor_io = PyArrowFileIO(properties=s3_properties)
    extra = staged_file_path(sink.location(), 1001, "executor")
    write_staged_file(executor_io, extra, to_sink_arrow(change_rows([11]), sink.schema(), 1, 1001, TS))

    assert sorted(delete_uncommitted_staged(sink, 1001)) == sorted([*leftover, extra])
    assert [f.path for f in list_staged(sink.location(), 1001, properties=s3_properties)] == committed
    # read back over S3: exactly the committed rows, and the swept files are gone from the bucket
    read = [(r["id"], r["name"], r["_change_type"], r["_commit_snapshot_id"]) for r in sink_rows(sink)]
    staged = change_rows(range(6)).to_pylist()
    assert read == [(r["id"], r["name"], r["_change_type"], 1001) for r in staged]
    assert not any(executor_io.new_input(path).exists() for path in [*leftover, extra])
    assert all(executor_io.new_input(path).exists() for path in committed)


def test_cleanup_never_deletes_a_committed_file_whose_name_extends_a_deleted_ones(sink):
    keep = stage(sink, 1001, 1, [change_rows([1])], prefix="a.parquet")  # .../a.parquet-task0.parquet
    commit_changes(
        sink,
        staged_paths=keep,
        source_identifier=SOURCE,
        source_uuid=SOURCE_UUID,
        snapshot_id=1001,
        ordinal=1,
    )
    path = staged_file_path(sink.location(), 1001, "a")  # .../a.parquet: a prefix of the kept key
    write_staged_file(sink.io, path, to_sink_arrow(change_rows([2]), sink.schema(), 1, 1001, TS))
    assert delete_uncommitted_staged(sink, 1001) == [path]
    assert [f.path for f in list_staged(sink.location(), 1001)] == keep
    assert [r["id"] for r in sink_rows(sink)] == [1]

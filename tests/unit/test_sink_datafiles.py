"""Staged Parquet files to Iceberg ``DataFile`` entries (``sink/datafiles.py``), against pyiceberg's own.

The commit registers staged files with entries built from their footers. Two
references built by pyiceberg itself must agree with them on every field a
reader or a planner uses (counts, sizes, bounds, partition): the entry its
writer produces for the file it writes, and the entry its ``add_files`` path
(``parquet_file_to_data_file``) builds from a footer. Files that do not match
the sink's schema are refused by name.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.io.pyarrow import _dataframe_to_data_files, parquet_file_to_data_file
from pyiceberg.manifest import DataFile

from cdc_devtools.orders import BY_REGION, SCHEMA, rows
from iceberg_cdc.errors import SinkSchemaError
from iceberg_cdc.sink.datafiles import data_file_from_parquet, data_files_from_parquet
from iceberg_cdc.sink.schema import to_sink_arrow
from iceberg_cdc.sink.staging import staged_file_path, write_staged_file
from iceberg_cdc.sink.table import ensure_sink_table
from tests.support.sink_tables import SINK, TS, change_rows, make_catalog, source_schema

FIELDS = (
    "content",
    "file_path",
    "file_format",
    "partition",
    "record_count",
    "file_size_in_bytes",
    "column_sizes",
    "value_counts",
    "null_value_counts",
    "nan_value_counts",
    "lower_bounds",
    "upper_bounds",
    "split_offsets",
    "equality_ids",
    "sort_order_id",
)


def _fields(data_file: DataFile) -> dict:
    return {name: getattr(data_file, name) for name in FIELDS}


@pytest.fixture
def catalog(tmp_path):
    return make_catalog(tmp_path)


@pytest.fixture
def sink(catalog):
    return ensure_sink_table(catalog, SINK, source_schema())


def _staged(sink, ids, name: str = "f") -> str:
    path = staged_file_path(sink.location(), 1001, name)
    write_staged_file(sink.io, path, to_sink_arrow(change_rows(ids), sink.schema(), 1, 1001, TS))
    return path


def test_a_staged_file_of_every_type_gets_the_entry_pyiceberg_builds_from_its_footer(sink):
    """Decimals, timestamps, uuids, binary, nested lists and maps, nulls, NaN: the same bounds and counts."""
    path = _staged(sink, range(40))
    ours = data_file_from_parquet(sink.io, sink.metadata, path)
    theirs = parquet_file_to_data_file(sink.io, sink.metadata, path)
    assert _fields(ours) == _fields(theirs)
    # the entry carries the spec it is committed under (pyiceberg's own drops it: no attribute at all)
    assert ours.spec_id == sink.metadata.default_spec_id
    assert ours.record_count == 40 and ours.lower_bounds and ours.upper_bounds
    assert ours.null_value_counts[sink.schema().find_field("name").field_id] > 0  # every third row is null


def test_a_file_pyiceberg_writes_gets_the_entry_its_writer_made(catalog):
    """A partitioned table: partition values come from the footer's bounds, as pyiceberg's writer has them."""
    catalog.create_namespace_if_not_exists("shop")
    table = catalog.create_table("shop.orders", SCHEMA, partition_spec=BY_REGION)
    data = pa.concat_tables([rows(range(20), "eu", status="new"), rows([20, 21], "eu", status=None)])
    (written,) = _dataframe_to_data_files(table.metadata, data, table.io)
    ours = data_file_from_parquet(table.io, table.metadata, written.file_path)
    assert ours.partition == written.partition and ours.partition[0] == "eu"
    for name in FIELDS:
        if name == "sort_order_id":  # not known from a file
            continue
        assert getattr(ours, name) == getattr(written, name), name


def test_many_files_keep_their_order(sink):
    paths = [_staged(sink, range(i * 10, i * 10 + 3 + i), f"part-{i}") for i in range(5)]
    many = data_files_from_parquet(sink.io, sink.metadata, paths)
    assert [f.file_path for f in many] == paths
    assert [f.record_count for f in many] == [3, 4, 5, 6, 7]
    assert [_fields(f) for f in many] == [
        _fields(data_file_from_parquet(sink.io, sink.metadata, p)) for p in paths
    ]
    assert data_files_from_parquet(sink.io, sink.metadata, []) == []


# --------------------------------------------------------------------------- refused files


def _write(sink, table: pa.Table, name: str) -> str:
    path = staged_file_path(sink.location(), 1001, name)
    with sink.io.new_output(path).create() as stream:
        pq.write_table(table, stream)
    return path


def _sink_rows(sink, ids=range(3)) -> pa.Table:
    return to_sink_arrow(change_rows(ids), sink.schema(), 1, 1001, TS)


def _with_field(table: pa.Table, name: str, field: pa.Field, column) -> pa.Table:
    index = table.schema.get_field_index(name)
    return table.set_column(index, field, column)


def test_a_column_the_sink_does_not_have_is_refused(sink):
    rows_ = _sink_rows(sink)
    extra = pa.field("extra", pa.int64(), metadata={"PARQUET:field_id": "9999"})
    path = _write(sink, rows_.append_column(extra, pa.array([1, 2, 3])), "extra")
    with pytest.raises(
        SinkSchemaError, match=r"column 'extra' has field id 9999, which the sink does not have"
    ):
        data_file_from_parquet(sink.io, sink.metadata, path)


def test_a_column_of_another_type_is_refused(sink):
    rows_ = _sink_rows(sink)
    field = rows_.schema.field("qty")
    narrowed = pa.field("qty", pa.string(), metadata=field.metadata)
    path = _write(sink, _with_field(rows_, "qty", narrowed, pa.array(["a", "b", "c"])), "typed")
    with pytest.raises(SinkSchemaError, match=r"column 'qty' is string in the file, \w+ in the sink"):
        data_file_from_parquet(sink.io, sink.metadata, path)


def test_a_missing_required_column_is_refused(sink):
    required = [f.name for f in sink.schema().fields if f.required]
    assert required, "the sink has required columns"
    rows_ = _sink_rows(sink).drop_columns([required[0]])
    path = _write(sink, rows_, "missing")
    with pytest.raises(SinkSchemaError, match=rf"required sink column '{required[0]}' is missing"):
        data_file_from_parquet(sink.io, sink.metadata, path)


def test_a_file_without_field_ids_is_refused(sink):
    plain = pa.table({"id": pa.array([1, 2], pa.int64())})
    path = _write(sink, plain, "plain")
    with pytest.raises(SinkSchemaError, match="has columns without Iceberg field ids"):
        data_file_from_parquet(sink.io, sink.metadata, path)


def test_a_uuid_read_back_as_fixed_16_is_accepted(sink):
    rows_ = _sink_rows(sink)
    field = rows_.schema.field("uid")
    fixed = pa.field("uid", pa.binary(16), nullable=field.nullable, metadata=field.metadata)
    column = pa.array(
        [None if v is None else v.bytes for v in rows_.column("uid").to_pylist()], pa.binary(16)
    )
    path = _write(sink, _with_field(rows_, "uid", fixed, column), "uuid")
    assert data_file_from_parquet(sink.io, sink.metadata, path).record_count == 3

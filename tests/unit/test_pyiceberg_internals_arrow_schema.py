"""What :mod:`iceberg_cdc.pyiceberg_internals.arrow_schema` and ``datafiles.v3_data_file`` rely on, pinned.

The pyiceberg helpers they wrap (``schema_to_pyarrow``, ``pyarrow_to_schema``,
``prune_columns``, ``DataFile.from_args(_table_format_version=)``) are not
documented; a release that renames an argument or changes a result fails here.
"""

from __future__ import annotations

import inspect

import pyarrow as pa
import pytest
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.schema import Schema
from pyiceberg.table.name_mapping import MappedField, NameMapping
from pyiceberg.types import ListType, LongType, NestedField, StringType, StructType, TimestampType

from iceberg_cdc.pyiceberg_internals.arrow_schema import (
    from_arrow_schema,
    select_columns,
    to_arrow_schema,
    to_arrow_type,
)
from iceberg_cdc.pyiceberg_internals.datafiles import v3_data_file
from iceberg_cdc.pyiceberg_internals.manifest_reader import v3_field

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "name", StringType(), required=False),
    NestedField(3, "point", StructType(NestedField(4, "x", LongType()), NestedField(5, "y", LongType()))),
    NestedField(6, "tags", ListType(7, StringType())),
)


def test_the_arrow_schema_uses_large_types_and_field_ids_only_when_asked():
    plain = to_arrow_schema(SCHEMA, include_field_ids=False)
    assert plain.field("id").type == pa.int64() and not plain.field("id").nullable
    assert plain.field("name").type == pa.large_string()
    assert pa.types.is_large_list(plain.field("tags").type)
    assert not plain.field("id").metadata
    with_ids = to_arrow_schema(SCHEMA, include_field_ids=True)
    assert with_ids.field("id").metadata == {b"PARQUET:field_id": b"1"}


def test_an_iceberg_type_maps_to_the_arrow_type_of_its_column():
    assert to_arrow_type(StringType()) == pa.large_string()
    assert to_arrow_type(LongType()) == pa.int64()


def test_the_iceberg_schema_of_an_arrow_schema_keeps_its_field_ids():
    back = from_arrow_schema(to_arrow_schema(SCHEMA, include_field_ids=True), format_version=3)
    assert [(f.field_id, f.name) for f in back.fields] == [(f.field_id, f.name) for f in SCHEMA.fields]


def test_without_field_ids_columns_resolve_through_the_name_mapping_or_fail():
    arrow = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string())])
    with pytest.raises(ValueError):
        from_arrow_schema(arrow)
    mapping = NameMapping([MappedField(field_id=10, names=["id"]), MappedField(field_id=11, names=["name"])])
    assert [f.field_id for f in from_arrow_schema(arrow, mapping).fields] == [10, 11]


def test_nanosecond_timestamps_are_downcast_only_when_asked():
    arrow = pa.schema([pa.field("t", pa.timestamp("ns"), metadata={b"PARQUET:field_id": b"1"})])
    assert (
        from_arrow_schema(arrow, downcast_ns_timestamp_to_us=True).find_field(1).field_type == TimestampType()
    )
    assert "downcast_ns_timestamp_to_us" in inspect.signature(from_arrow_schema).parameters


def test_selecting_columns_keeps_their_ids_and_only_the_selected_nested_fields():
    keys = select_columns(SCHEMA, {1, 4})
    assert [f.field_id for f in keys.fields] == [1, 3]
    assert [f.field_id for f in keys.find_field(3).field_type.fields] == [4]
    # A struct's own id selects none of its fields: callers pass leaf ids (select_full_types=False).
    assert list(select_columns(SCHEMA, {3}).find_field(3).field_type.fields) == []


def test_a_v3_data_file_has_the_deletion_vector_fields():
    data_file = v3_data_file(
        content=DataFileContent.POSITION_DELETES,
        file_path="s3://b/dv.puffin",
        file_format=FileFormat.PUFFIN,
        record_count=3,
        file_size_in_bytes=100,
        referenced_data_file="s3://b/data.parquet",
        content_offset=4,
        content_size_in_bytes=40,
    )
    fields = {
        name: v3_field(data_file, name)
        for name in ("referenced_data_file", "content_offset", "content_size_in_bytes")
    }
    assert fields == {
        "referenced_data_file": "s3://b/data.parquet",
        "content_offset": 4,
        "content_size_in_bytes": 40,
    }
    # pyiceberg's default struct is v2 and drops those fields: why the door names the version.
    v2 = DataFile.from_args(file_path="s3://b/dv.puffin", referenced_data_file="s3://b/data.parquet")
    assert v3_field(v2, "referenced_data_file") is None

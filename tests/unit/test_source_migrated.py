"""Tables migrated from Hive or built with ``add_files``: files without field ids or partition columns.

A Hive-layout Parquet file has no Parquet field ids (columns are matched by
name through the table's name mapping) and no identity-partition columns (the
values live only in the directory names, and in the manifest entry's
``partition``). The source side must read such files exactly as pyiceberg's
own scan does: ``snapshot_changes`` -> write tasks -> ``read_data_file`` with
the name mapping and each file's partition values, compared with
``table.scan().to_arrow()``.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import uuid
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform, TruncateTransform
from pyiceberg.typedef import Record
from pyiceberg.types import (
    BinaryType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
    UUIDType,
)

from iceberg_cdc.errors import ConfigError
from iceberg_cdc.source.change_files import SnapshotChanges
from iceberg_cdc.source.changes import initial_load_changes, snapshot_changes
from iceberg_cdc.source.planning import InputFile, plan_from_dict, plan_to_dict, plan_write_tasks
from iceberg_cdc.source.reading import (
    NAME_MAPPING_PROPERTY,
    file_io,
    name_mapping_from_json,
    output_schema,
    partition_value_from_json,
    partition_value_to_json,
    read_data_file,
    schema_from_json,
    schema_to_json,
    table_name_mapping_json,
)
from tests.support.iceberg_tables import NAMESPACE, cow_rewrite, current_id, live_files, sql_catalog

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "name", StringType(), required=False),
    NestedField(3, "amount", DecimalType(9, 2), required=False),
    NestedField(4, "region", StringType(), required=False),
    NestedField(5, "day", DateType(), required=False),
)
SPEC = PartitionSpec(
    PartitionField(4, 1000, IdentityTransform(), "region"),
    PartitionField(5, 1001, IdentityTransform(), "day"),
    PartitionField(2, 1002, TruncateTransform(1), "name_trunc"),  # not identity: never a column's value
)
DAY1, DAY2 = dt.date(2024, 1, 1), dt.date(2024, 1, 2)


@pytest.fixture
def catalog(tmp_path):
    return sql_catalog(tmp_path)


@pytest.fixture
def table(catalog) -> Table:
    return catalog.create_table(f"{NAMESPACE}.migrated", schema=SCHEMA, partition_spec=SPEC)


def hive_rows(ids: list[int]) -> pa.Table:
    """The columns a Hive-layout file holds: no field ids, no partition columns."""
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([f"n{i}" for i in ids], pa.string()),
            "amount": pa.array([decimal.Decimal(i) / 4 for i in ids], pa.decimal128(9, 2)),
        }
    )


def write_hive_file(table: Table, region: str, day: dt.date, ids: list[int]) -> str:
    """Write a Parquet file as Hive lays it out: ``.../region=US/day=2024-01-01/part.parquet``."""
    path = f"{table.location()}/data/region={region}/day={day.isoformat()}/part-{uuid.uuid4().hex}.parquet"
    local = Path(path.removeprefix("file://"))
    local.parent.mkdir(parents=True, exist_ok=True)
    rows = hive_rows(ids)
    assert all(b"PARQUET:field_id" not in (f.metadata or {}) for f in rows.schema)
    pq.write_table(rows, local)
    return path


def hive_data_file(table: Table, path: str, region: str, day: dt.date) -> DataFile:
    """The manifest entry a Hive migration writes: statistics from the file, partition from the path.

    pyiceberg's ``add_files`` infers partition values from column statistics;
    for a column the file lacks it records null (see
    :func:`test_pyiceberg_add_files_cannot_infer_missing_partition_columns`),
    so the entry is built here, as Spark's ``migrate`` / ``add_files`` build it.
    """
    local = Path(path.removeprefix("file://"))
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=pq.read_metadata(local),
        stats_columns=compute_statistics_plan(table.schema(), table.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(table.schema()),
    )
    return DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=Record(region, (day - dt.date(1970, 1, 1)).days, "n"),
        file_size_in_bytes=local.stat().st_size,
        sort_order_id=None,
        spec_id=table.metadata.default_spec_id,
        equality_ids=None,
        key_metadata=None,
        **statistics.to_serialized_dict(),
    )


def register(table: Table, data_files: list[DataFile]) -> int:
    """One append snapshot of ``data_files``, with the name mapping set as a migration sets it."""
    with table.transaction() as tx:
        if table.metadata.name_mapping() is None:
            tx.set_properties(**{NAME_MAPPING_PROPERTY: table.schema().name_mapping.model_dump_json()})
        with tx.update_snapshot().fast_append() as append:
            for data_file in data_files:
                append.append_data_file(data_file)
    table.refresh()
    return current_id(table)


def read_changes(table: Table, changes: SnapshotChanges) -> tuple[pa.Table, pa.Table]:
    """(DELETE rows, INSERT rows) read the way write tasks read them, from a plan that went through JSON."""
    tasks = plan_from_dict(json.loads(json.dumps(plan_to_dict(plan_write_tasks(changes, 1 << 30)))))
    schema = schema_from_json(schema_to_json(table.schemas()[changes.schema_id]))
    mapping = name_mapping_from_json(json.loads(json.dumps(table_name_mapping_json(table))))
    io = file_io(table.io.properties)
    read: dict[str, list[pa.RecordBatch]] = {"DELETE": [], "INSERT": []}
    for task in tasks:
        for file in task.files:
            read[file.op].extend(
                read_data_file(
                    io, file.path, schema, name_mapping=mapping, partition_values=file.partition_values
                )
            )
    target = output_schema(schema)
    return (
        pa.Table.from_batches(read["DELETE"], schema=target),
        pa.Table.from_batches(read["INSERT"], schema=target),
    )


def rows(data: pa.Table) -> Counter:
    return Counter(tuple(sorted(row.items())) for row in data.to_pylist())


def pyiceberg_state(table: Table, snapshot_id: int | None) -> Counter:
    if snapshot_id is None:
        return Counter()
    return rows(table.scan(snapshot_id=snapshot_id).to_arrow())


def test_pyiceberg_add_files_cannot_infer_missing_partition_columns(table):
    # Why the tests build entries themselves: add_files takes partition values from column
    # statistics, and a Hive file has no statistics for a column it lacks (pyiceberg 0.12).
    path = write_hive_file(table, "US", DAY1, [1])
    table.add_files([path])
    (data_file,) = live_files(table)
    assert list(data_file.partition) == [None, None, "n"]  # only the column the file has
    assert table.properties.get(NAME_MAPPING_PROPERTY), "add_files sets the name mapping"


def test_hive_files_read_like_pyiceberg_scan(table):
    us1 = write_hive_file(table, "US", DAY1, [1, 2, 3])
    eu2 = write_hive_file(table, "EU", DAY2, [4, 5])
    first = register(table, [hive_data_file(table, us1, "US", DAY1), hive_data_file(table, eu2, "EU", DAY2)])

    changes = snapshot_changes(table, first)
    by_path = {ref.path: ref for ref in changes.added}
    assert by_path[us1].partition_values == {4: "US", 5: (DAY1 - dt.date(1970, 1, 1)).days}
    deleted, inserted = read_changes(table, changes)
    assert deleted.num_rows == 0
    expected = table.scan(snapshot_id=first).to_arrow()
    assert set(expected.column("region").to_pylist()) == {"US", "EU"}, "pyiceberg fills them too"
    assert rows(inserted) == rows(expected)
    assert inserted.schema == output_schema(table.schema())

    # A copy-on-write update of the migrated data: the Hive file is removed, its rows rewritten by
    # pyiceberg (with field ids and the partition columns), one row moving to another partition.
    old = next(f for f in live_files(table) if f.file_path == us1)
    rewritten = table.scan(snapshot_id=first).to_arrow().filter(pc.field("region") == "US")
    region = pa.array(["US", "US", "EU"], pa.large_string())
    rewritten = rewritten.set_column(rewritten.schema.get_field_index("region"), "region", region)
    second = cow_rewrite(table, [old], rewritten)

    changes = snapshot_changes(table, second)
    deleted, inserted = read_changes(table, changes)
    assert set(deleted.column("region").to_pylist()) == {"US"}, "the removed Hive file's rows, filled"
    before, after = pyiceberg_state(table, first), pyiceberg_state(table, second)
    assert before - rows(deleted) + rows(inserted) == after
    assert not rows(deleted) - before

    # The whole state read as an initial load agrees with pyiceberg's scan as well.
    _, loaded = read_changes(table, initial_load_changes(table, second))
    assert rows(loaded) == after


def test_hive_files_with_their_partition_columns_through_add_files(table):
    # Files that do hold the partition column (no field ids): pyiceberg's add_files infers the
    # partition from statistics, and the file's own values are read.
    path = f"{table.location()}/data/with-columns.parquet"
    data = (
        hive_rows([7, 8])
        .append_column("region", pa.array(["EU", "EU"]))
        .append_column("day", pa.array([DAY2, DAY2], pa.date32()))
    )
    Path(path.removeprefix("file://")).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(data, path.removeprefix("file://"))
    table.add_files([path])
    changes = snapshot_changes(table, current_id(table))
    (ref,) = changes.added
    assert ref.partition_values == {4: "EU", 5: (DAY2 - dt.date(1970, 1, 1)).days}
    _, inserted = read_changes(table, changes)
    assert rows(inserted) == rows(table.scan().to_arrow())


def test_partition_values_fill_only_columns_the_file_lacks(table, tmp_path):
    path = write_hive_file(table, "US", DAY1, [1])
    mapping = table.schema().name_mapping
    io = file_io({})
    lying = {4: "EU", 1: 99}  # a value for a column the file holds is ignored: the file wins
    (batch,) = read_data_file(io, path, table.schema(), name_mapping=mapping, partition_values=lying)
    assert batch.to_pylist() == [
        {"id": 1, "name": "n1", "amount": decimal.Decimal("0.25"), "region": "EU", "day": None}
    ]
    # Without the values, a missing partition column is null (the old behaviour)...
    (batch,) = read_data_file(io, path, table.schema(), name_mapping=mapping)
    assert batch.column("region").to_pylist() == [None]
    # ... and without the name mapping, the error says what to set.
    with pytest.raises(
        ConfigError,
        match=r"without Parquet field ids.*schema\.name-mapping\.default property, and none was given",
    ):
        list(read_data_file(io, path, table.schema()))


def test_plan_form_of_partition_values_is_backwards_compatible():
    plain = InputFile("s3://b/f.parquet", 10, 2, "INSERT")
    assert plain.partition_values is None
    assert "partition_values" not in plain.to_dict()
    assert InputFile.from_dict(plain.to_dict()) == plain
    old_form = {"path": "s3://b/f.parquet", "size": 10, "record_count": 2, "op": "INSERT"}
    assert InputFile.from_dict(old_form) == plain
    with_values = InputFile("s3://b/f.parquet", 10, 2, "INSERT", {4: "US", 5: 19723})
    as_json = json.loads(json.dumps(with_values.to_dict()))
    assert as_json["partition_values"] == {"4": "US", "5": 19723}
    assert InputFile.from_dict(as_json) == with_values
    hash(with_values)  # still usable in sets, as frozen dataclasses were


@pytest.mark.parametrize(
    ("field_type", "value"),
    [
        (StringType(), "ü"),
        (LongType(), 2**40),
        (DateType(), 19723),
        (TimestampType(), 1704164645000000),
        (DecimalType(9, 2), decimal.Decimal("-1.25")),
        (BinaryType(), b"\x00\xff"),
        (FixedType(3), b"abc"),
        (UUIDType(), uuid.UUID(int=5)),
        (DoubleType(), 1.5),
        (DoubleType(), float("inf")),
        (DoubleType(), float("-inf")),
    ],
)
def test_partition_values_round_trip_through_strict_json(field_type, value):
    encoded = json.loads(json.dumps(partition_value_to_json(value), allow_nan=False))
    decoded = partition_value_from_json(field_type, encoded)
    assert decoded == value and type(decoded) is type(value)
    pa.scalar(decoded, type=output_schema(Schema(NestedField(1, "c", field_type))).field(0).type)


def test_nan_partition_value_round_trips():
    encoded = json.loads(json.dumps(partition_value_to_json(float("nan")), allow_nan=False))
    assert math.isnan(partition_value_from_json(DoubleType(), encoded))


def test_name_mapping_of_the_table(table):
    assert table_name_mapping_json(table) is None
    register(table, [])
    text = table_name_mapping_json(table)
    assert name_mapping_from_json(text) == table.schema().name_mapping
    assert name_mapping_from_json(None) is None
    with table.transaction() as tx:
        tx.set_properties(**{NAME_MAPPING_PROPERTY: "{not json"})
    with pytest.raises(
        ConfigError, match=r"db\.migrated: property schema\.name-mapping\.default is not a valid"
    ):
        table_name_mapping_json(table)

"""Helpers for the sink tests: a real SQLite catalog, a source schema with every type, change rows.

The change rows look like the merge output: source columns in the plain Arrow
types a Parquet reader returns (``string``, ``list``, ``fixed_size_binary(16)``
for uuids), plus ``_change_type``.
"""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.expressions import EqualTo
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from iceberg_cdc.sink.commit import CommitResult, commit_changes
from iceberg_cdc.sink.rows import to_sink_arrow
from iceberg_cdc.sink.schema import COMMIT_SNAPSHOT_ID
from iceberg_cdc.sink.staging import staged_file_path, write_staged_file

SOURCE = "shop.orders"
SINK = "shop.orders_changes"
SOURCE_UUID = "7d3e2b8e-0000-4000-8000-000000000001"


def make_catalog(tmp_path: Path) -> SqlCatalog:
    """A real pyiceberg SQL catalog on SQLite, with a file:// warehouse."""
    warehouse = tmp_path / "wh"
    warehouse.mkdir(exist_ok=True)
    return SqlCatalog("t", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=f"file://{warehouse}")


def source_schema() -> Schema:
    """A source schema using every type the sink must carry, nested ones included."""
    return Schema(
        NestedField(1, "id", LongType(), required=True, doc="order id"),
        NestedField(2, "name", StringType(), doc="customer name"),
        NestedField(3, "flag", BooleanType()),
        NestedField(4, "qty", IntegerType()),
        NestedField(5, "price", DecimalType(10, 2)),
        NestedField(6, "big", DecimalType(38, 9)),
        NestedField(7, "ratio", FloatType()),
        NestedField(8, "score", DoubleType()),
        NestedField(9, "day", DateType()),
        NestedField(10, "at", TimeType()),
        NestedField(11, "ts", TimestampType()),
        NestedField(12, "tstz", TimestamptzType()),
        NestedField(13, "uid", UUIDType()),
        NestedField(14, "blob", BinaryType()),
        NestedField(15, "code", FixedType(4)),
        NestedField(
            16,
            "address",
            StructType(
                NestedField(17, "city", StringType()),
                NestedField(
                    18,
                    "geo",
                    StructType(NestedField(19, "lat", DoubleType()), NestedField(20, "lon", DoubleType())),
                ),
            ),
        ),
        NestedField(21, "tags", ListType(22, StringType(), element_required=False)),
        NestedField(
            23,
            "items",
            ListType(
                24,
                StructType(NestedField(25, "sku", StringType()), NestedField(26, "n", IntegerType())),
                element_required=False,
            ),
        ),
        NestedField(27, "attrs", MapType(28, StringType(), 29, LongType(), value_required=False)),
        identifier_field_ids=[1],
    )


def source_arrow_schema() -> pa.Schema:
    """The merge output's Arrow schema for :func:`source_schema` (plain reader types)."""
    return pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            pa.field("name", pa.string()),
            pa.field("flag", pa.bool_()),
            pa.field("qty", pa.int32()),
            pa.field("price", pa.decimal128(10, 2)),
            pa.field("big", pa.decimal128(38, 9)),
            pa.field("ratio", pa.float32()),
            pa.field("score", pa.float64()),
            pa.field("day", pa.date32()),
            pa.field("at", pa.time64("us")),
            pa.field("ts", pa.timestamp("us")),
            pa.field("tstz", pa.timestamp("us", tz="+00:00")),
            pa.field("uid", pa.binary(16)),
            pa.field("blob", pa.binary()),
            pa.field("code", pa.binary(4)),
            pa.field(
                "address",
                pa.struct(
                    [
                        ("city", pa.string()),
                        ("geo", pa.struct([("lat", pa.float64()), ("lon", pa.float64())])),
                    ]
                ),
            ),
            pa.field("tags", pa.list_(pa.string())),
            pa.field("items", pa.list_(pa.struct([("sku", pa.string()), ("n", pa.int32())]))),
            pa.field("attrs", pa.map_(pa.string(), pa.int64())),
            pa.field("_change_type", pa.string(), nullable=False),
        ]
    )


_KINDS = ("INSERT", "DELETE", "UPDATE_BEFORE", "UPDATE_AFTER")


def change_rows(ids: Sequence[int], *, nulls: bool = True) -> pa.Table:
    """Change rows with one distinct value of every type per id; every third row is mostly null."""
    rows = []
    for i in ids:
        sparse = nulls and i % 3 == 0
        rows.append(
            {
                "id": i,
                "name": None if sparse else f"name-{i}-ü",
                "flag": None if sparse else i % 2 == 0,
                "qty": None if sparse else i - 5,
                "price": None if sparse else decimal.Decimal(f"{i}.{i % 100:02d}"),
                "big": None if sparse else decimal.Decimal(f"{i}12345678901234567890.123456789"),
                "ratio": None if sparse else i / 4,
                "score": None if sparse else i * 1.5,
                "day": None if sparse else dt.date(2024, 1, 1) + dt.timedelta(days=i),
                "at": None if sparse else dt.time(12, i % 60, 30, 123456),
                "ts": None if sparse else dt.datetime(2024, 5, 1, 8, 30, 0, i),
                "tstz": None if sparse else dt.datetime(2024, 5, 1, 8, 30, 0, i, tzinfo=dt.UTC),
                "uid": None if sparse else uuid.UUID(int=i + 1).bytes,
                "blob": None if sparse else bytes([i % 256, 0, 255]),
                "code": None if sparse else (i % 10000).to_bytes(4, "big"),
                "address": None
                if sparse
                else {"city": f"city-{i}", "geo": None if i % 2 else {"lat": i / 3, "lon": -i / 7}},
                "tags": None if sparse else [f"t{i}", None, "x"],
                "items": None if sparse else [{"sku": f"s{i}", "n": i}, {"sku": None, "n": None}],
                "attrs": None if sparse else [("a", i), ("b", None)],
                "_change_type": _KINDS[i % 4],
            }
        )
    return pa.Table.from_pylist(rows, schema=source_arrow_schema())


# A fixed epoch for the test snapshots' commit times (2023-11-14T22:13:20Z).
TS = 1_700_000_000_000


def commit_timestamp_ms(snapshot_id: int) -> int:
    """The ``_commit_timestamp`` (ms) the helpers give a test snapshot: distinct per snapshot id."""
    return TS + snapshot_id * 1000


def stage(
    sink_table: Table, snapshot_id: int, ordinal: int, parts: Sequence[pa.Table], prefix: str = "run1"
) -> list[str]:
    """Write each change table as one staged file of the snapshot; return the paths."""
    paths = []
    for index, part in enumerate(parts):
        path = staged_file_path(sink_table.location(), snapshot_id, f"{prefix}-task{index}")
        write_staged_file(
            sink_table.io,
            path,
            to_sink_arrow(part, sink_table.schema(), ordinal, snapshot_id, commit_timestamp_ms(snapshot_id)),
        )
        paths.append(path)
    return paths


def stage_and_commit(
    sink_table: Table,
    snapshot_id: int,
    ordinal: int,
    ids: Sequence[int],
    *,
    prefix: str = "run1",
    replace_existing: bool = False,
) -> CommitResult:
    """Stage the change rows of ``ids`` (two files) and commit them as one source snapshot."""
    half = len(ids) // 2
    parts = [change_rows(ids[:half]), change_rows(ids[half:])]
    paths = stage(sink_table, snapshot_id, ordinal, [p for p in parts if p.num_rows], prefix=prefix)
    return commit_changes(
        sink_table,
        staged_paths=paths,
        source_identifier=SOURCE,
        source_uuid=SOURCE_UUID,
        snapshot_id=snapshot_id,
        ordinal=ordinal,
        replace_existing=replace_existing,
    )


def sink_rows(sink_table: Table, snapshot_id: int | None = None) -> list[dict]:
    """The sink's rows (optionally of one source snapshot), sorted, as Python values."""
    scan = (
        sink_table.scan()
        if snapshot_id is None
        else sink_table.scan(row_filter=EqualTo(COMMIT_SNAPSHOT_ID, snapshot_id))
    )
    rows = scan.to_arrow().to_pylist()
    return sorted(rows, key=lambda r: (r[COMMIT_SNAPSHOT_ID], r["id"], r["_change_type"]))

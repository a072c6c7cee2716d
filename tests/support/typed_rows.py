"""Rows of every Iceberg type, written the way engines write them, and exact checks of what reaches the sink.

Why the source files are written here and not with pyiceberg's ``append``:
pyiceberg 0.12 rebuilds ``list<struct>`` and ``map<_, struct>`` columns
without their validity bitmap, on write *and* on read
(apache/iceberg-python#3833). A file pyiceberg writes already holds ``[]``
where the row had a null list, and a pyiceberg scan of a file that holds a
null list returns ``[]``. Spark and Trino write and read those nulls
faithfully. So:

* :class:`RawSource` writes data files with pyarrow straight from the Arrow
  table (field ids in the Parquet schema, statistics computed by pyiceberg's
  own Parquet writer), keeps every file's rows itself, and commits
  fast-append / copy-on-write ``overwrite`` snapshots. Its rows are the
  ground truth of the table, independent of any reader.
* :func:`sink_changes` reads the sink's files with plain pyarrow, not a
  pyiceberg scan, so a null that the pipeline kept is seen as null.
* :func:`exact` compares values strictly: float bits (NaN, -0.0), decimal
  scale (``1.10`` is not ``1.1``), timestamps with their UTC offset, uuid bytes.

The replay check of :mod:`cdc_devtools.replay` reads both the source states
and the sink through pyiceberg scans; the lossy read hits both sides the same
way, so it stays valid but cannot see the null-vs-empty distinction -- the
exact checks here do.
"""

from __future__ import annotations

import datetime as dt
import decimal
import struct
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.expressions import AlwaysTrue, EqualTo
from pyiceberg.io.pyarrow import ArrowScan, ParquetFormatWriter, schema_to_pyarrow
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.typedef import Record
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
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

from cdc_devtools.oracle import row_key
from cdc_devtools.replay import ADDED, REMOVED, multiset
from iceberg_cdc.sink import field_ids
from iceberg_cdc.sink.schema import CHANGE_COLUMNS, COMMIT_SNAPSHOT_ID

UTC = dt.UTC

# ----------------------------------------------------------------------------- exact values


def exact(value: Any) -> Any:
    """A hashable form of a ``to_pylist`` value that keeps everything a sink must not lose.

    Floats by bit pattern, decimals with their scale, datetimes with their UTC
    offset, uuids as their 16 bytes (a uuid column may read back as uuid or as
    its fixed[16] storage), struct fields and map entries in order.
    """
    if isinstance(value, dt.datetime):
        return ("datetime", value.isoformat())
    if value is None or isinstance(value, (bool, int, str, dt.date, dt.time)):
        return value
    if isinstance(value, float):
        return ("float", struct.pack(">d", value))
    if isinstance(value, decimal.Decimal):
        return ("decimal", str(value))
    if isinstance(value, uuid.UUID):
        return ("bytes", value.bytes)
    if isinstance(value, bytes):
        return ("bytes", value)
    if isinstance(value, dict):
        return ("struct", tuple((k, exact(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("list", tuple(exact(v) for v in value))
    if isinstance(value, tuple):  # a map entry
        return ("entry", tuple(exact(v) for v in value))
    raise TypeError(f"no exact form for {type(value).__name__}: {value!r}")


def exact_row(row: dict, names: Sequence[str]) -> tuple:
    return tuple(exact(row[name]) for name in names)


# ----------------------------------------------------------------------------- schemas


def shape(typ: IcebergType) -> Any:
    """A type's structure without field ids (the sink has its own ids): names, types, requiredness."""
    if isinstance(typ, StructType):
        return ("struct", tuple((f.name, f.required, shape(f.field_type)) for f in typ.fields))
    if isinstance(typ, ListType):
        return ("list", typ.element_required, shape(typ.element_type))
    if isinstance(typ, MapType):
        return ("map", shape(typ.key_type), typ.value_required, shape(typ.value_type))
    return str(typ)


def column_shapes(schema: Schema) -> dict[str, Any]:
    return {f.name: shape(f.field_type) for f in schema.fields}


def assert_sink_types_follow(source_schema: Schema, sink_schema: Schema) -> None:
    """Every source column is in the sink with the same type (nested structure included)."""
    sink = column_shapes(sink_schema)
    for name, source_shape in column_shapes(source_schema).items():
        assert name in sink, f"source column {name!r} missing from the sink ({list(sink)})"
        assert sink[name] == source_shape, f"column {name!r}: sink {sink[name]} != source {source_shape}"
    names = [f.name for f in sink_schema.fields]
    assert tuple(names[-len(CHANGE_COLUMNS) :]) == CHANGE_COLUMNS, f"change columns are not last: {names}"
    assert str(sink_schema.find_type("_change_type")) == "string"
    assert str(sink_schema.find_type("_change_ordinal")) == "int"
    assert str(sink_schema.find_type("_commit_snapshot_id")) == "long"
    assert str(sink_schema.find_type("_commit_timestamp")) == "timestamptz"


# ----------------------------------------------------------------------------- every type


ALL_TYPES = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "flag", BooleanType()),
    NestedField(3, "i32", IntegerType()),
    NestedField(4, "i64", LongType()),
    NestedField(5, "f32", FloatType()),
    NestedField(6, "f64", DoubleType()),
    NestedField(7, "dec_9_2", DecimalType(9, 2)),
    NestedField(8, "dec_18_6", DecimalType(18, 6)),
    NestedField(9, "dec_38_10", DecimalType(38, 10)),
    NestedField(10, "dec_38_0", DecimalType(38, 0)),
    NestedField(11, "day", DateType()),
    NestedField(12, "tod", TimeType()),
    NestedField(13, "ts", TimestampType()),
    NestedField(14, "tstz", TimestamptzType()),
    NestedField(15, "text", StringType()),
    NestedField(16, "uid", UUIDType()),
    NestedField(17, "code", FixedType(5)),
    NestedField(18, "blob", BinaryType()),
    NestedField(
        19,
        "point",
        StructType(
            NestedField(20, "x", DoubleType()),
            NestedField(21, "label", StringType()),
            NestedField(22, "tags", ListType(23, StringType(), element_required=False)),
        ),
    ),
    NestedField(
        24,
        "items",
        ListType(
            25,
            StructType(
                NestedField(26, "sku", StringType()),
                NestedField(27, "qty", IntegerType()),
                NestedField(28, "price", DecimalType(9, 2)),
            ),
            element_required=False,
        ),
    ),
    NestedField(
        29,
        "attrs",
        MapType(
            30,
            StringType(),
            31,
            StructType(NestedField(32, "v", LongType()), NestedField(33, "note", StringType())),
            value_required=False,
        ),
    ),
    NestedField(34, "nums", ListType(35, LongType(), element_required=False)),
    NestedField(36, "labels", MapType(37, StringType(), 38, StringType(), value_required=False)),
    NestedField(
        39, "grid", ListType(40, ListType(41, IntegerType(), element_required=False), element_required=False)
    ),
    identifier_field_ids=[1],
)

_F32_EDGES = [float("nan"), -0.0, 0.0, float("inf"), float("-inf"), 2.0**-149, 3.4028234663852886e38, 1.5]
_F64_EDGES = [float("nan"), -0.0, 0.0, float("inf"), float("-inf"), 5e-324, 1.7976931348623157e308, -2.5]
_DEC_9_2 = ["9999999.99", "-9999999.99", "0.00", "0.01", "-0.01", "1.10"]
_DEC_18_6 = ["999999999999.999999", "-999999999999.999999", "0.000001", "0.000000", "12.500000"]
_DEC_38_10 = [
    "9999999999999999999999999999.9999999999",
    "-9999999999999999999999999999.9999999999",
    "0.0000000001",
    "0E-10",
    "3.1415926535",
]
_DEC_38_0 = [str(10**38 - 1), str(-(10**38 - 1)), "0", "1"]
_DAYS = [
    dt.date(1, 1, 1),
    dt.date(9999, 12, 31),
    dt.date(1970, 1, 1),
    dt.date(1969, 12, 31),
    dt.date(2024, 2, 29),
]
_TIMES = [dt.time(0, 0), dt.time(23, 59, 59, 999999), dt.time(12, 0, 0, 1)]
_STAMPS = [
    dt.datetime(1, 1, 1),
    dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
    dt.datetime(1969, 12, 31, 23, 59, 59, 999999),
    dt.datetime(1970, 1, 1),
    dt.datetime(2024, 3, 31, 2, 30, 0, 123456),
]
# Inputs in several zones: a timestamptz stores the instant, and reads back in UTC.
_TSTZ = [
    dt.datetime(1, 1, 1, tzinfo=UTC),
    dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30))),
    dt.datetime(1970, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=-8))),
    dt.datetime(2024, 3, 31, 2, 30, 0, 123456, tzinfo=UTC),
]
_TEXTS = ["", "ü日本語🎉", "a\x00b", "x" * 300, "  padded  ", "Ω"]
_UUIDS = [uuid.UUID(int=0), uuid.UUID(int=2**128 - 1), uuid.UUID("12345678-1234-5678-1234-567812345678")]
_CODES = [b"\x00" * 5, b"\xff" * 5, b"abcde"]
_BLOBS = [b"", b"\x00", bytes(range(256)), b"\xff\xfe"]


def _pick(values: Sequence, i: int, version: int) -> Any:
    """Value ``i`` of ``values``, shifted by the version so that consecutive versions always differ."""
    return values[(i + version) % len(values)]


def _point(i: int, version: int) -> dict | None:
    case = (i + version) % 5
    if case == 0:
        return None  # null struct
    if case == 1:
        return {"x": None, "label": None, "tags": None}  # struct of nulls, null nested list
    if case == 2:
        return {"x": -0.0, "label": "", "tags": []}  # empty nested list
    return {"x": i / 3 + version, "label": f"p{i}v{version}", "tags": ["a", None, f"t{version}"]}


def _items(i: int, version: int) -> list | None:
    case = (i + 2 * version) % 5
    if case == 0:
        return None  # null list<struct>
    if case == 1:
        return []
    if case == 2:
        return [None, {"sku": None, "qty": None, "price": None}]  # null element, struct of nulls
    return [
        {"sku": f"s{i}", "qty": version, "price": decimal.Decimal(f"{i}.{version:02d}")},
        {"sku": "ü", "qty": -(2**31), "price": decimal.Decimal("-9999999.99")},
    ]


def _attrs(i: int, version: int) -> dict | list | None:
    case = (i + version) % 4
    if case == 0:
        return None  # null map
    if case == 1:
        return {}
    if case == 2:
        return {"k": None, "": {"v": None, "note": None}}  # null map value, struct of nulls
    return {"a": {"v": i * 1000 + version, "note": "ok"}, "b": {"v": -(2**63), "note": ""}}


def _grid(i: int, version: int) -> list | None:
    case = (i + version) % 4
    return [None, [], [[None]], [[1, None], None, [], [version, i]]][case]


def typed_row(i: int, version: int = 0) -> dict[str, Any]:
    """Row ``i`` of :data:`ALL_TYPES` in version ``version``: every column differs between versions.

    Rows with ``i % 7 == 0`` are null in every optional column.
    """
    if i % 7 == 0 and version == 0:
        return {"id": i, **{f.name: None for f in ALL_TYPES.fields if f.name != "id"}}
    return {
        "id": i,
        "flag": (i + version) % 2 == 0,
        "i32": [-(2**31), 2**31 - 1, 0, i][(i + version) % 4],
        "i64": [-(2**63), 2**63 - 1, 0, i * 10**12][(i + version) % 4],
        "f32": _pick(_F32_EDGES, i, version),
        "f64": _pick(_F64_EDGES, i, version),
        "dec_9_2": decimal.Decimal(_pick(_DEC_9_2, i, version)),
        "dec_18_6": decimal.Decimal(_pick(_DEC_18_6, i, version)),
        "dec_38_10": decimal.Decimal(_pick(_DEC_38_10, i, version)),
        "dec_38_0": decimal.Decimal(_pick(_DEC_38_0, i, version)),
        "day": _pick(_DAYS, i, version),
        "tod": _pick(_TIMES, i, version),
        "ts": _pick(_STAMPS, i, version),
        "tstz": _pick(_TSTZ, i, version),
        "text": _pick(_TEXTS, i, version),
        "uid": _pick(_UUIDS, i, version),
        "code": _pick(_CODES, i, version),
        "blob": _pick(_BLOBS, i, version),
        "point": _point(i, version),
        "items": _items(i, version),
        "attrs": _attrs(i, version),
        "nums": [None, [], [None], [2**63 - 1, None, -1]][(i + version) % 4],
        "labels": [None, {}, {"k": None}, {"ключ": "значение", "e": ""}][(i + version) % 4],
        "grid": _grid(i, version),
    }


# ----------------------------------------------------------------------------- a source written as Spark writes


def arrow_rows(table: Table, rows: Sequence[dict]) -> pa.Table:
    """``rows`` in the table's Arrow schema with field ids, nulls kept at every level."""
    return pa.Table.from_pylist(list(rows), schema=schema_to_pyarrow(table.schema(), include_field_ids=True))


def write_data_file(table: Table, rows: Sequence[dict], name: str) -> tuple[DataFile, list[dict]]:
    """One Parquet data file of ``rows``, written straight from Arrow (not committed).

    Returns the file and its rows as stored (after Arrow's conversion: float32
    rounding, timestamptz in UTC), which are the ground truth for the checks.
    """
    if not table.spec().is_unpartitioned():
        raise ValueError("write_data_file writes unpartitioned tables only")
    data = arrow_rows(table, rows)
    path = f"{table.location()}/data/{name}.parquet"
    writer = ParquetFormatWriter(table.io.new_output(path), table.schema(), table.properties)
    with writer:
        writer.write(data)
    statistics = writer.result()
    data_file = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=Record(),
        file_size_in_bytes=len(table.io.new_input(path)),
        sort_order_id=None,
        equality_ids=None,
        key_metadata=None,
        **statistics.to_serialized_dict(),
    )
    data_file.spec_id = table.metadata.default_spec_id  # not a from_args field in pyiceberg 0.12
    return data_file, data.to_pylist()


class RawSource:
    """A source table whose every data file is written here and whose rows are tracked here.

    ``key`` names the identifier columns used to find the rows a merge touches.
    """

    def __init__(self, table: Table, key: Sequence[str]) -> None:
        self.table = table
        self.key = list(key)
        self.files: list[tuple[DataFile, list[dict]]] = []
        self._count = 0

    def rows(self) -> list[dict]:
        return [row for _, rows in self.files for row in rows]

    def _key(self, row: dict) -> tuple:
        return exact_row(row, self.key)

    def _write(self, rows: Sequence[dict]) -> tuple[DataFile, list[dict]]:
        self._count += 1
        return write_data_file(self.table, rows, f"raw-{self._count:04d}-{uuid.uuid4().hex[:8]}")

    def _commit(self, remove: Sequence[DataFile], add: Sequence[DataFile]) -> int:
        with self.table.transaction() as tx:
            producer = tx.update_snapshot().overwrite() if remove else tx.update_snapshot().fast_append()
            with producer as snapshot:
                for data_file in remove:
                    snapshot.delete_data_file(data_file)
                for data_file in add:
                    snapshot.append_data_file(data_file)
        self.table.refresh()
        current = self.table.current_snapshot()
        assert current is not None
        return current.snapshot_id

    def append(self, *batches: Sequence[dict]) -> int:
        """An insert-only snapshot: one new file per batch."""
        written = [self._write(batch) for batch in batches]
        snapshot_id = self._commit([], [f for f, _ in written])
        self.files.extend(written)
        return snapshot_id

    def merge(self, upserts: Sequence[dict] = (), deletes: Iterable[dict] = ()) -> tuple[int, list[dict]]:
        """A copy-on-write snapshot: every file holding a touched key is rewritten, untouched rows carried over.

        ``deletes`` are rows (only their key columns matter). Returns the
        snapshot id and the rows the removed files held (the deleted side).
        """
        new_rows = arrow_rows(self.table, upserts).to_pylist()
        gone = arrow_rows(self.table, list(deletes)).to_pylist()
        touched = {self._key(r) for r in new_rows} | {self._key(r) for r in gone}
        hit = [any(self._key(r) in touched for r in rows) for _, rows in self.files]
        removed = [entry for entry, h in zip(self.files, hit, strict=True) if h]
        kept = [r for _, rows in removed for r in rows if self._key(r) not in touched]
        added = self._write([*kept, *new_rows]) if kept or new_rows else None
        snapshot_id = self._commit([f for f, _ in removed], [added[0]] if added else [])
        self.files = [entry for entry, h in zip(self.files, hit, strict=True) if not h]
        self.files += [added] if added else []
        return snapshot_id, [r for _, rows in removed for r in rows]


# ----------------------------------------------------------------------------- reading the sink exactly


def sink_changes(sink: Table, snapshot_id: int) -> list[dict]:
    """The sink's rows of one source snapshot, read from its Parquet files with pyarrow (no pyiceberg scan)."""
    sink.refresh()
    rows: list[dict] = []
    for task in sink.scan(row_filter=EqualTo(COMMIT_SNAPSHOT_ID, snapshot_id)).plan_files():
        with sink.io.new_input(task.file.file_path).open() as stream:
            data = pq.read_table(stream)
        rows.extend(r for r in data.to_pylist() if r[COMMIT_SNAPSHOT_ID] == snapshot_id)
    return rows


def change_multiset(rows: Iterable[dict], names: Sequence[str]) -> Counter:
    """(exact row, change type) pairs."""
    return Counter((exact_row(r, names), r["_change_type"]) for r in rows)


def expected_multiset(
    before: Sequence[dict], after: Sequence[dict], key: Sequence[str], names: Sequence[str]
) -> Counter:
    """The changes from state ``before`` to state ``after`` for a table with unique keys ``key``."""
    old = {exact_row(r, key): r for r in before}
    new = {exact_row(r, key): r for r in after}
    out: Counter = Counter()
    for k, row in old.items():
        if k not in new:
            out[(exact_row(row, names), "DELETE")] += 1
        elif exact_row(row, names) != exact_row(new[k], names):
            out[(exact_row(row, names), "UPDATE_BEFORE")] += 1
            out[(exact_row(new[k], names), "UPDATE_AFTER")] += 1
    for k, row in new.items():
        if k not in old:
            out[(exact_row(row, names), "INSERT")] += 1
    return out


def assert_exact_replay(
    before: Sequence[dict], after: Sequence[dict], changes: Sequence[dict], names: Sequence[str]
) -> None:
    """before - {DELETE, UPDATE_BEFORE} + {INSERT, UPDATE_AFTER} == after, with exact values."""
    state = Counter(exact_row(r, names) for r in before)
    removed = Counter(exact_row(r, names) for r in changes if r["_change_type"] in REMOVED)
    added = Counter(exact_row(r, names) for r in changes if r["_change_type"] in ADDED)
    assert not removed - state, "removed rows that the parent state does not hold"
    state.subtract(removed)
    state.update(added)
    assert +state == Counter(exact_row(r, names) for r in after), "exact replay differs"


# ----------------------------------------------------------------------------- replay across schema changes


def state_in_schema(source: Table, snapshot_id: int | None, schema: Schema) -> pa.Table:
    """The table's rows as of ``snapshot_id``, projected by field id onto ``schema`` (pyiceberg's reader)."""
    if snapshot_id is None:
        return schema_to_pyarrow(schema, include_field_ids=False).empty_table()
    tasks = list(source.scan(snapshot_id=snapshot_id).plan_files())
    return ArrowScan(source.metadata, source.io, schema, AlwaysTrue()).to_table(tasks)


def _project(value: Any, typ: IcebergType) -> Any:
    """A ``to_pylist`` value reduced to the fields of ``typ`` (a sink struct may have gained fields since)."""
    if value is None or typ.is_primitive:
        return value
    if isinstance(typ, StructType):
        return {f.name: _project(value.get(f.name), f.field_type) for f in typ.fields}
    if isinstance(typ, ListType):
        return [_project(v, typ.element_type) for v in value]
    if isinstance(typ, MapType):
        return [(k, _project(v, typ.value_type)) for k, v in value]
    raise TypeError(f"unexpected type {typ}")


def _rows_multiset(table: pa.Table, schema: Schema) -> Counter:
    """Rows as frozen tuples of the schema's columns, nested values projected onto the schema's fields."""
    fields = schema.fields
    return Counter(
        row_key({f.name: _project(row[f.name], f.field_type) for f in fields}, [f.name for f in fields])
        for row in table.select([f.name for f in fields]).to_pylist()
    )


def in_sink_names(schema: Schema, sink: Table) -> Schema:
    """``schema`` (a source schema) with every field, nested ones too, named as its sink field.

    The sink follows renames by field id (``cdc.source-field-ids``), so a field
    of an old snapshot is found under the name the sink has for it now -- the
    source's current name while the field exists. Source states are projected by
    field id onto this schema, so both sides compare under the same names. A
    sink without the mapping keeps the source names.
    """
    mapping = field_ids.read(sink.properties)
    if mapping is None:
        return schema
    by_source = field_ids.reverse(mapping)
    sink_schema = sink.schema()

    def name(f: NestedField) -> str:
        sink_id = by_source.get(f.field_id)
        return f.name if sink_id is None else sink_schema.find_field(sink_id).name

    def rename(typ: IcebergType) -> IcebergType:
        if isinstance(typ, StructType):
            return StructType(
                *(
                    NestedField(f.field_id, name(f), rename(f.field_type), f.required, f.doc)
                    for f in typ.fields
                )
            )
        if isinstance(typ, ListType):
            return ListType(typ.element_id, rename(typ.element_type), typ.element_required)
        if isinstance(typ, MapType):
            return MapType(typ.key_id, typ.key_type, typ.value_id, rename(typ.value_type), typ.value_required)
        return typ

    renamed = rename(schema.as_struct())
    assert isinstance(renamed, StructType)
    return Schema(
        *renamed.fields, schema_id=schema.schema_id, identifier_field_ids=schema.identifier_field_ids
    )


def assert_replay_in_snapshot_schema(
    source: Table, sink: Table, snapshot_id: int, identifier_columns: Sequence[str]
) -> Counter:
    """The replay invariant with both states read in the snapshot's own schema.

    :func:`cdc_devtools.replay.assert_replay` reads each state in its own
    snapshot's schema, which cannot be compared once columns were added,
    renamed or dropped in between; the pipeline reads a snapshot's removed
    files in that snapshot's schema, and so does this check, under the names
    the sink has for its fields now (:func:`in_sink_names`). Sink rows are
    compared on the snapshot schema's columns and nested fields (the sink may
    have gained columns, nested fields and wider types since). Returns the
    change-type counts.
    """
    source.refresh()
    sink.refresh()
    snapshot = source.snapshot_by_id(snapshot_id)
    assert snapshot is not None and snapshot.schema_id is not None
    schema = in_sink_names(source.schemas()[snapshot.schema_id], sink)
    changes = sink.scan(row_filter=EqualTo(COMMIT_SNAPSHOT_ID, snapshot_id)).to_arrow()
    kind = changes.column("_change_type")
    removed = _rows_multiset(changes.filter(pc.is_in(kind, pa.array(REMOVED))), schema)
    added = _rows_multiset(changes.filter(pc.is_in(kind, pa.array(ADDED))), schema)
    state = _rows_multiset(state_in_schema(source, snapshot.parent_snapshot_id, schema), schema)
    assert not removed - state, f"snapshot {snapshot_id}: removed rows not in the parent's state"
    assert not (removed & added), f"snapshot {snapshot_id}: a row is both removed and added"
    state.subtract(removed)
    state.update(added)
    expected = _rows_multiset(state_in_schema(source, snapshot_id, schema), schema)
    assert +state == expected, (
        f"snapshot {snapshot_id}: replay differs: missing {sum((expected - +state).values())}, "
        f"extra {sum((+state - expected).values())}"
    )
    before = multiset(changes.filter(pc.equal(kind, "UPDATE_BEFORE")), identifier_columns)
    after = multiset(changes.filter(pc.equal(kind, "UPDATE_AFTER")), identifier_columns)
    assert before == after, f"snapshot {snapshot_id}: updates do not pair per key"
    return Counter(kind.to_pylist())

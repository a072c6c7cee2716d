"""Sink schema: derivation from the source, evolution with it, and change rows shaped for it."""

from __future__ import annotations

import decimal
import io
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyiceberg.schema import Schema
from pyiceberg.types import (
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
)

from iceberg_cdc.errors import SinkSchemaError
from iceberg_cdc.sink.schema import (
    CHANGE_ORDINAL,
    CHANGE_TYPE,
    CHANGE_TYPES,
    COMMIT_SNAPSHOT_ID,
    COMMIT_TIMESTAMP,
    evolve_sink_schema,
    plan_sink_evolution,
    sink_arrow_schema,
    sink_schema_for,
    to_sink_arrow,
)
from iceberg_cdc.sink.table import ensure_sink_table
from tests.support.sink_tables import (
    SINK,
    TS,
    change_rows,
    commit_timestamp_ms,
    make_catalog,
    sink_rows,
    source_schema,
    stage_and_commit,
)

CHANGE_COLUMNS = [CHANGE_TYPE, CHANGE_ORDINAL, COMMIT_SNAPSHOT_ID, COMMIT_TIMESTAMP]


@pytest.fixture
def catalog(tmp_path):
    return make_catalog(tmp_path)


def _small_source(*extra: NestedField) -> Schema:
    return Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "qty", IntegerType(), required=True),
        NestedField(3, "addr", StructType(NestedField(4, "city", StringType()))),
        *extra,
    )


def _arrow_field_ids(typ: pa.DataType | pa.Schema) -> list[bytes | None]:
    """Every field's PARQUET:field_id, depth first."""
    found: list[bytes | None] = []
    fields = list(typ) if isinstance(typ, pa.Schema) else [typ.field(i) for i in range(typ.num_fields)]
    for field in fields:
        found.append((field.metadata or {}).get(b"PARQUET:field_id"))
        inner = field.type
        if pa.types.is_map(inner):
            found.extend(_arrow_field_ids(pa.struct([inner.key_field, inner.item_field])))
        elif pa.types.is_large_list(inner) or pa.types.is_list(inner):
            found.extend(_arrow_field_ids(pa.struct([inner.value_field])))
        elif pa.types.is_struct(inner):
            found.extend(_arrow_field_ids(inner))
    return found


# ----------------------------------------------------------------------------- derivation


def test_sink_schema_keeps_source_columns_then_change_columns():
    source = source_schema()
    sink = sink_schema_for(source)
    assert [f.name for f in sink.fields] == [f.name for f in source.fields] + CHANGE_COLUMNS
    for source_field in source.fields:
        sink_field = sink.find_field(source_field.name)
        assert sink_field.field_type == source_field.field_type  # nested types included
        assert sink_field.required == source_field.required
        assert sink_field.doc == source_field.doc
    assert str(sink.find_field(CHANGE_TYPE).field_type) == "string"
    assert isinstance(sink.find_field(CHANGE_ORDINAL).field_type, IntegerType)
    assert isinstance(sink.find_field(COMMIT_SNAPSHOT_ID).field_type, LongType)
    assert all(sink.find_field(name).required for name in CHANGE_COLUMNS)
    assert sink.identifier_field_ids == []  # many rows per key in a changelog
    assert len(set(sink.field_ids)) == len(sink.field_ids)


def test_source_column_with_a_reserved_name_is_refused():
    source = Schema(NestedField(1, "id", LongType()), NestedField(2, "_change_type", StringType()))
    with pytest.raises(SinkSchemaError, match=r"'_change_type'.*reserve.*rename the source column"):
        sink_schema_for(source)


def test_ensure_creates_namespace_and_table_in_order(catalog):
    table = ensure_sink_table(catalog, SINK, source_schema(), properties={"owner": "cdc"})
    assert ("shop",) in catalog.list_namespaces()
    assert [f.name for f in table.schema().fields] == [
        f.name for f in source_schema().fields
    ] + CHANGE_COLUMNS
    assert table.spec().is_unpartitioned()
    assert table.properties["owner"] == "cdc"
    schema_id = table.schema().schema_id
    again = ensure_sink_table(catalog, SINK, source_schema())
    assert again.schema().schema_id == schema_id  # nothing to evolve: no new schema
    assert again.metadata_location == table.metadata_location


# ----------------------------------------------------------------------------- evolution


def test_added_columns_join_the_sink_before_the_change_columns_and_old_rows_read_null(catalog):
    table = ensure_sink_table(catalog, SINK, source_schema())
    stage_and_commit(table, 101, 1, list(range(1, 7)))
    evolved = Schema(
        *source_schema().fields,
        NestedField(90, "coupon", StringType(), required=True, doc="new"),
        identifier_field_ids=[1],
    )
    # a nested field added to an existing struct, too
    address = evolved.find_field("address")
    new_address = NestedField(
        address.field_id,
        "address",
        StructType(*address.field_type.fields, NestedField(91, "zip", StringType())),
    )
    evolved = Schema(*[new_address if f.name == "address" else f for f in evolved.fields])

    changes = evolve_sink_schema(table, evolved)
    assert changes.added == ["address.zip", "coupon"]
    names = [f.name for f in table.schema().fields]
    assert names[-5:] == ["coupon", *CHANGE_COLUMNS]
    coupon = table.schema().find_field("coupon")
    assert coupon.optional and coupon.doc == "new"  # optional: the old rows have no value
    assert table.schema().find_field("address.zip").optional

    rows = sink_rows(table)
    assert len(rows) == 6
    assert all(r["coupon"] is None for r in rows)
    assert all(r["address"] is None or r["address"]["zip"] is None for r in rows)
    # nothing left to do the second time
    assert not evolve_sink_schema(table, evolved).changed


def test_widened_source_types_widen_the_sink(catalog):
    source = _small_source(NestedField(5, "ratio", FloatType()), NestedField(6, "price", DecimalType(10, 2)))
    table = ensure_sink_table(catalog, SINK, source)
    wider = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "qty", LongType(), required=True),
        NestedField(3, "addr", StructType(NestedField(4, "city", StringType()))),
        NestedField(5, "ratio", DoubleType()),
        NestedField(6, "price", DecimalType(14, 2)),
    )
    assert sorted(evolve_sink_schema(table, wider).widened) == ["price", "qty", "ratio"]
    schema = table.schema()
    assert isinstance(schema.find_field("qty").field_type, LongType)
    assert isinstance(schema.find_field("ratio").field_type, DoubleType)
    assert schema.find_field("price").field_type == DecimalType(14, 2)


def test_sink_already_wider_stays_and_rows_are_cast_up(catalog):
    wide = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "qty", LongType()))
    narrow = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "qty", IntegerType()))
    table = ensure_sink_table(catalog, SINK, wide)
    assert not evolve_sink_schema(table, narrow).changed
    changes = pa.table(
        {
            "id": pa.array([1], pa.int64()),
            "qty": pa.array([7], pa.int32()),
            CHANGE_TYPE: ["INSERT"],
        }
    )
    out = to_sink_arrow(changes, table.schema(), 3, 99, TS)
    assert out.schema.field("qty").type == pa.int64()
    assert out.column("qty").to_pylist() == [7]


@pytest.mark.parametrize(
    ("sink_field", "source_field", "expected"),
    [
        (
            NestedField(2, "qty", StringType()),
            NestedField(2, "qty", LongType()),
            r"column 'qty': the sink has string, the source has long",
        ),
        (
            NestedField(2, "qty", DecimalType(10, 2)),
            NestedField(2, "qty", DecimalType(12, 3)),
            r"column 'qty': the sink has decimal\(10, 2\), the source has decimal\(12, 3\)",
        ),
        (
            NestedField(2, "qty", StructType(NestedField(7, "a", LongType()))),
            NestedField(2, "qty", LongType()),
            r"column 'qty': the sink has struct<.*>, the source has long \(a column cannot change between nested",
        ),
        (
            NestedField(2, "qty", LongType()),
            NestedField(2, "qty", IntegerType()),
            None,  # sink wider: fine
        ),
        (
            NestedField(2, "m", MapType(5, IntegerType(), 6, StringType())),
            NestedField(2, "m", MapType(5, LongType(), 6, StringType())),
            r"column 'm.key': the sink has int, the source has long \(Iceberg cannot change the type of a map key",
        ),
        (
            NestedField(2, "l", ListType(5, StringType())),
            NestedField(2, "l", ListType(5, LongType())),
            r"column 'l.element': the sink has string, the source has long",
        ),
    ],
)
def test_type_conflicts_name_the_column_both_types_and_the_fix(catalog, sink_field, source_field, expected):
    table = ensure_sink_table(
        catalog, SINK, Schema(NestedField(1, "id", LongType(), required=True), sink_field)
    )
    before = table.metadata_location
    source = Schema(NestedField(1, "id", LongType(), required=True), source_field)
    if expected is None:
        evolve_sink_schema(table, source)
        return
    with pytest.raises(SinkSchemaError, match=expected) as info:
        evolve_sink_schema(table, source)
    assert "RENAME COLUMN" in str(info.value) and "recreate the sink table" in str(info.value)
    assert "Nothing was changed" in str(info.value)
    table.refresh()
    assert table.metadata_location == before


def test_all_conflicts_are_reported_together(catalog):
    table = ensure_sink_table(
        catalog, SINK, Schema(NestedField(1, "a", StringType()), NestedField(2, "b", StringType()))
    )
    with pytest.raises(SinkSchemaError) as info:
        evolve_sink_schema(table, Schema(NestedField(1, "a", LongType()), NestedField(2, "b", DoubleType())))
    assert "'a'" in str(info.value) and "'b'" in str(info.value)


def test_dropped_columns_stay_and_become_optional(catalog):
    table = ensure_sink_table(catalog, SINK, _small_source())
    assert table.schema().find_field("qty").required
    dropped = Schema(NestedField(1, "id", LongType(), required=True))
    changes = evolve_sink_schema(table, dropped)
    assert changes.made_optional == ["qty"]
    schema = table.schema()
    assert schema.find_field("qty").optional  # new rows hold null
    assert schema.find_field("addr").optional
    # the change columns are never touched
    assert all(schema.find_field(n).required for n in CHANGE_COLUMNS)
    out = to_sink_arrow(
        pa.table({"id": pa.array([5], pa.int64()), CHANGE_TYPE: ["DELETE"]}), schema, 1, 2, TS
    )
    assert out.column("qty").to_pylist() == [None]
    assert out.column("addr").to_pylist() == [None]


def test_optional_source_relaxes_a_required_sink_column(catalog):
    table = ensure_sink_table(catalog, SINK, _small_source())
    relaxed = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "qty", IntegerType(), required=False),
        NestedField(3, "addr", StructType(NestedField(4, "city", StringType()))),
    )
    assert evolve_sink_schema(table, relaxed).made_optional == ["qty"]
    assert table.schema().find_field("qty").optional


def test_sink_without_change_columns_is_refused(catalog):
    catalog.create_namespace("shop")
    foreign = catalog.create_table(SINK, schema=_small_source())
    with pytest.raises(SinkSchemaError, match="no '_change_type' column"):
        plan_sink_evolution(foreign.schema(), _small_source())


# ----------------------------------------------------------------------------- change rows


def test_to_sink_arrow_gives_exactly_the_sink_schema_with_field_ids_everywhere():
    sink = sink_schema_for(source_schema())
    out = to_sink_arrow(change_rows(range(12)), sink, 7, 123456789012, TS)
    expected = sink_arrow_schema(sink)
    assert out.schema.equals(expected, check_metadata=True)
    for column, field in zip(out.columns, expected, strict=True):
        assert column.type.equals(field.type, check_metadata=True)  # nested field ids on the data too
    ids = _arrow_field_ids(out.schema)
    assert None not in ids and len(ids) == len(set(ids)) == len(sink.field_ids)
    assert out.column(CHANGE_ORDINAL).to_pylist() == [7] * 12
    assert out.column(COMMIT_SNAPSHOT_ID).to_pylist() == [123456789012] * 12


def test_to_sink_arrow_round_trips_every_type_through_parquet(tmp_path):
    sink = sink_schema_for(source_schema())
    source = change_rows(range(30))
    out = to_sink_arrow(source, sink, 1, 5, TS)
    path = tmp_path / "f.parquet"
    pq.write_table(out, path, compression="zstd", store_decimal_as_integer=True)
    back = pq.read_table(path)
    assert back.to_pylist() == out.to_pylist()
    # values unchanged from the merge output (uuid bytes come back as UUID objects)
    original = source.to_pylist()
    for before, after in zip(original, back.to_pylist(), strict=True):
        for name, value in before.items():
            got = after[name]
            if name == "uid" and value is not None:
                got = got.bytes
            if name == "tstz" and value is not None:
                assert got == value
                continue
            assert got == value, name
    # Parquet carries the Iceberg field ids
    parquet_schema = pq.read_schema(path)
    assert _arrow_field_ids(parquet_schema) == _arrow_field_ids(out.schema)


def test_to_sink_arrow_handles_empty_and_dictionary_input():
    sink = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "s", StringType()),
        NestedField(3, "d", DecimalType(9, 3)),
        NestedField(4, CHANGE_TYPE, StringType(), required=True),
        NestedField(5, CHANGE_ORDINAL, IntegerType(), required=True),
        NestedField(6, COMMIT_SNAPSHOT_ID, LongType(), required=True),
    )
    changes = pa.table(
        {
            "id": pa.array([1, 2], pa.int64()),
            "s": pa.array(["a", None]).dictionary_encode(),
            "d": pa.array([decimal.Decimal("1.500"), None], pa.decimal128(5, 3)),
            CHANGE_TYPE: pa.array(["INSERT", "UPDATE_AFTER"]).dictionary_encode(),
        }
    )
    out = to_sink_arrow(changes, sink, 2, 3, TS)
    assert out.column("s").to_pylist() == ["a", None]
    assert out.column("d").to_pylist() == [decimal.Decimal("1.500"), None]
    empty = to_sink_arrow(changes.slice(0, 0), sink, 2, 3, TS)
    assert empty.num_rows == 0 and empty.schema.equals(sink_arrow_schema(sink), check_metadata=True)


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        (
            pa.table({"id": pa.array([1], pa.int64()), "qty": ["7"], CHANGE_TYPE: ["INSERT"]}),
            SinkSchemaError,
            r"'qty' is string, the sink has int32",
        ),
        (
            pa.table({"id": pa.array([1], pa.int64()), "extra": [1], CHANGE_TYPE: ["INSERT"]}),
            SinkSchemaError,
            r"'extra'.*not in the sink schema; evolve the sink",
        ),
        (
            pa.table(
                {
                    "id": pa.array([1], pa.int64()),
                    "addr": pa.array([{"city": "x", "zip": "1"}]),
                    CHANGE_TYPE: ["INSERT"],
                }
            ),
            SinkSchemaError,
            r"'addr.zip' is not in the sink schema",
        ),
        (
            pa.table({"id": pa.array([1], pa.int64()), CHANGE_TYPE: ["UPSERT"]}),
            ValueError,
            r"must be one of INSERT, DELETE, UPDATE_BEFORE, UPDATE_AFTER; found \['UPSERT'\]",
        ),
        (
            pa.table({"id": pa.array([None], pa.int64()), CHANGE_TYPE: ["INSERT"]}),
            SinkSchemaError,
            r"sink column 'id' is required but 1 change rows have null",
        ),
        (
            pa.table({"id": pa.array([1], pa.int64())}),
            ValueError,
            r"no '_change_type' column",
        ),
        (
            pa.table({"id": pa.array([1], pa.int64()), CHANGE_TYPE: ["INSERT"], CHANGE_ORDINAL: [1]}),
            ValueError,
            r"must not carry '_change_ordinal'",
        ),
    ],
)
def test_to_sink_arrow_refuses_rows_the_sink_cannot_take(changes, error, message):
    sink = sink_schema_for(
        Schema(
            NestedField(1, "id", LongType(), required=True),
            NestedField(2, "qty", IntegerType()),
            NestedField(3, "addr", StructType(NestedField(4, "city", StringType()))),
        )
    )
    with pytest.raises(error, match=message):
        to_sink_arrow(changes, sink, 1, 1, TS)


def test_required_sink_column_missing_from_changes_is_an_error():
    sink = sink_schema_for(_small_source())
    with pytest.raises(
        SinkSchemaError, match=r"sink column 'qty' is required but the changes do not have it"
    ):
        to_sink_arrow(pa.table({"id": pa.array([1], pa.int64()), CHANGE_TYPE: ["INSERT"]}), sink, 1, 1, TS)


def test_to_sink_arrow_matches_nested_fields_by_name_and_fills_missing_ones():
    sink = sink_schema_for(
        Schema(
            NestedField(1, "id", LongType(), required=True),
            NestedField(
                2, "addr", StructType(NestedField(3, "city", StringType()), NestedField(4, "zip", LongType()))
            ),
        )
    )
    changes = pa.table(
        {
            "id": pa.array([1, 2], pa.int64()),
            # fields in another order, one of them missing (dropped from the source's struct)
            "addr": pa.array([{"zip": 75001}, None], pa.struct([("zip", pa.int32())])),
            CHANGE_TYPE: ["INSERT", "DELETE"],
        }
    )
    out = to_sink_arrow(changes, sink, 1, 1, TS)
    assert out.column("addr").to_pylist() == [{"city": None, "zip": 75001}, None]


_SMALL_SINK = sink_schema_for(
    Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "qty", LongType()),  # the changes carry int32: cast up
        NestedField(3, "s", StringType()),
        NestedField(4, "tags", ListType(5, StringType(), element_required=False)),
        NestedField(6, "gone", DecimalType(9, 2)),  # dropped from the source: null-filled
    )
)
_ROW = st.tuples(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.none() | st.integers(min_value=-(2**31), max_value=2**31 - 1),
    st.none() | st.text(max_size=8),
    st.none() | st.lists(st.none() | st.text(max_size=4), max_size=3),
    st.sampled_from(CHANGE_TYPES),
)


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(_ROW, max_size=25), chunks=st.integers(min_value=1, max_value=3))
def test_to_sink_arrow_keeps_every_value_through_parquet(rows, chunks):
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            pa.field("qty", pa.int32()),
            pa.field("s", pa.string()),
            pa.field("tags", pa.list_(pa.string())),
            pa.field(CHANGE_TYPE, pa.string(), nullable=False),
        ]
    )
    table = pa.Table.from_pylist([dict(zip(schema.names, row, strict=True)) for row in rows], schema=schema)
    step = max(1, len(rows) // chunks)
    chunked = pa.concat_tables([table.slice(i, step) for i in range(0, max(len(rows), 1), step)])
    out = to_sink_arrow(chunked, _SMALL_SINK, 9, 77, TS)
    buffer = io.BytesIO()
    pq.write_table(out, buffer, compression="zstd", store_decimal_as_integer=True)
    back = pq.read_table(io.BytesIO(buffer.getvalue())).to_pylist()
    assert back == [
        {
            "id": r[0],
            "qty": r[1],
            "s": r[2],
            "tags": r[3],
            "gone": None,
            CHANGE_TYPE: r[4],
            CHANGE_ORDINAL: 9,
            COMMIT_SNAPSHOT_ID: 77,
            COMMIT_TIMESTAMP: datetime.fromtimestamp(TS / 1000, UTC),
        }
        for r in rows
    ]


def test_evolution_reaches_into_lists_and_maps(catalog):
    source = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "l", ListType(3, IntegerType(), element_required=True)),
        NestedField(4, "m", MapType(5, StringType(), 6, IntegerType(), value_required=True)),
        NestedField(
            7, "ls", ListType(8, StructType(NestedField(9, "a", IntegerType())), element_required=False)
        ),
    )
    table = ensure_sink_table(catalog, SINK, source)
    evolved = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "l", ListType(3, LongType(), element_required=False)),
        NestedField(4, "m", MapType(5, StringType(), 6, LongType(), value_required=False)),
        NestedField(
            7,
            "ls",
            ListType(
                8,
                StructType(NestedField(9, "a", IntegerType()), NestedField(10, "b", StringType())),
                element_required=False,
            ),
        ),
    )
    changes = evolve_sink_schema(table, evolved)
    assert changes.added == ["ls.element.b"]
    assert sorted(changes.widened) == ["l.element", "m.value"]
    assert sorted(changes.made_optional) == ["l.element", "m.value"]
    schema = table.schema()
    lst = schema.find_field("l").field_type
    assert isinstance(lst, ListType) and lst.element_type == LongType() and not lst.element_required
    m = schema.find_field("m").field_type
    assert isinstance(m, MapType) and m.value_type == LongType() and not m.value_required
    assert schema.find_field("ls.element.b").optional
    assert not evolve_sink_schema(table, evolved).changed


# ----------------------------------------------------------------------------- _commit_timestamp


def _legacy_sink_schema(source: Schema) -> Schema:
    """A sink as created before ``_commit_timestamp`` joined the contract: three change columns."""
    return Schema(*sink_schema_for(source).fields[:-1], schema_id=0, identifier_field_ids=[])


def test_new_sinks_end_with_a_required_commit_timestamp():
    sink = sink_schema_for(source_schema())
    last = sink.fields[-1]
    assert (last.name, str(last.field_type), last.required) == (COMMIT_TIMESTAMP, "timestamptz", True)


def test_an_older_sink_gains_commit_timestamp_last_and_its_old_rows_read_null(catalog):
    catalog.create_namespace("shop")
    table = catalog.create_table(SINK, schema=_legacy_sink_schema(source_schema()))
    assert COMMIT_TIMESTAMP not in [f.name for f in table.schema().fields]
    old = to_sink_arrow(change_rows([1, 2]), table.schema(), 1, 1001)  # no timestamp column: none needed
    assert COMMIT_TIMESTAMP not in old.column_names
    stage_and_commit(table, 1001, 1, [1, 2])

    assert plan_sink_evolution(table.schema(), source_schema()).added == [COMMIT_TIMESTAMP]
    table = ensure_sink_table(catalog, SINK, source_schema())  # what detect does on every run
    assert not plan_sink_evolution(table.schema(), source_schema()).changed  # once is enough
    names = [f.name for f in table.schema().fields]
    assert names[-4:] == CHANGE_COLUMNS
    added = table.schema().find_field(COMMIT_TIMESTAMP)
    assert added.optional and str(added.field_type) == "timestamptz"  # old rows cannot have a value

    stage_and_commit(table, 1002, 2, [3])
    rows = sink_rows(table)
    stamps = {r[COMMIT_SNAPSHOT_ID]: r[COMMIT_TIMESTAMP] for r in rows}
    assert stamps[1001] is None
    assert stamps[1002] == datetime.fromtimestamp(commit_timestamp_ms(1002) / 1000, UTC)


def test_to_sink_arrow_needs_the_commit_time_when_the_sink_has_the_column():
    sink = sink_schema_for(_small_source())
    changes = pa.table(
        {"id": pa.array([1], pa.int64()), "qty": pa.array([1], pa.int32()), CHANGE_TYPE: ["INSERT"]}
    )
    with pytest.raises(ValueError, match="commit_timestamp_ms"):
        to_sink_arrow(changes, sink, 1, 1)
    stamped = changes.append_column(COMMIT_TIMESTAMP, pa.array([0], pa.int64()))
    with pytest.raises(ValueError, match="must not carry '_commit_timestamp'"):
        to_sink_arrow(stamped, sink, 1, 1, TS)
    out = to_sink_arrow(changes, sink, 1, 1, 1_700_000_000_123)
    assert out.schema.field(COMMIT_TIMESTAMP).type == pa.timestamp("us", tz="UTC")
    assert out.column(COMMIT_TIMESTAMP).cast(pa.int64()).to_pylist() == [1_700_000_000_123_000]


def test_a_source_column_named_commit_timestamp_is_refused():
    with pytest.raises(SinkSchemaError, match="_commit_timestamp"):
        sink_schema_for(_small_source(NestedField(9, COMMIT_TIMESTAMP, LongType())))


def test_the_sink_checks_the_change_types_the_merge_writes():
    from iceberg_cdc.changelog import merge

    assert CHANGE_TYPE is merge.CHANGE_TYPE_COLUMN == "_change_type"
    assert sorted(CHANGE_TYPES) == sorted(t.name for t in merge.ChangeType)

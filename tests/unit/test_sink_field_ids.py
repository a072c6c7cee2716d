"""The sink follows the source's schema by field id: renames, drops, re-adds, legacy sinks, old snapshots.

Real SQLite catalog and real sink commits: rows are shaped with the sink's
stored mapping (as the read and insert tasks do) and read back by scanning the
sink, so a wrong mapping shows up as values under the wrong column.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import (
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
from iceberg_cdc.sink import field_ids
from iceberg_cdc.sink.columns import CHANGE_COLUMNS, CHANGE_TYPE
from iceberg_cdc.sink.commit import commit_changes
from iceberg_cdc.sink.rows import to_sink_arrow
from iceberg_cdc.sink.schema import evolve_sink_schema, plan_sink_evolution, sink_schema_for
from iceberg_cdc.sink.staging import staged_file_path, write_staged_file
from iceberg_cdc.sink.table import ensure_sink_table
from tests.support.sink_tables import SINK, SOURCE, SOURCE_UUID, commit_timestamp_ms, make_catalog


@pytest.fixture
def catalog(tmp_path):
    return make_catalog(tmp_path)


ID = NestedField(1, "id", LongType(), required=True)
QTY = NestedField(2, "qty", IntegerType(), required=True)
ADDR = NestedField(3, "addr", StructType(NestedField(4, "city", StringType())))


def _schema(*fields: NestedField) -> Schema:
    return Schema(*fields)


def _write(table: Table, source: Schema, snapshot_id: int, rows: list[dict]) -> None:
    """Commit ``rows`` (named by ``source``) as INSERTs, shaped through the sink's stored mapping."""
    changes = pa.Table.from_pylist(rows, schema=schema_to_pyarrow(source, include_field_ids=False))
    changes = changes.append_column(CHANGE_TYPE, pa.array(["INSERT"] * len(rows)))
    mapping = field_ids.read(table.properties)
    assert mapping is not None, "the sink has no field-id mapping"
    arrow = to_sink_arrow(
        changes,
        table.schema(),
        snapshot_id,
        snapshot_id,
        commit_timestamp_ms(snapshot_id),
        source_schema=source,
        field_ids=mapping,
    )
    path = staged_file_path(table.location(), snapshot_id, "t0")
    write_staged_file(table.io, path, arrow)
    commit_changes(
        table,
        staged_paths=[path],
        source_identifier=SOURCE,
        source_uuid=SOURCE_UUID,
        snapshot_id=snapshot_id,
        ordinal=snapshot_id,
    )


def _read(table: Table) -> list[dict]:
    rows = table.scan().to_arrow().drop_columns(list(CHANGE_COLUMNS[1:])).to_pylist()
    return sorted(rows, key=lambda r: r["id"])


def _names(table: Table) -> list[str]:
    return [f.name for f in table.schema().fields]


def _mapped_names(table: Table) -> dict[int, str]:
    """Source field id -> the sink column name (full path) it maps to, from the stored property."""
    mapping = field_ids.read(table.properties)
    assert mapping is not None
    schema = table.schema()
    return {source: schema.find_column_name(sink) for sink, source in mapping.items()}


def _fresh(catalog, _: Table) -> Table:
    """The sink as another process sees it: only what was committed."""
    return catalog.load_table(SINK)


# ----------------------------------------------------------------------------- creation


def test_a_new_sink_maps_every_source_field_nested_ones_too_in_its_creating_commit(catalog):
    source = _schema(
        ID,
        ADDR,
        NestedField(5, "tags", ListType(6, StructType(NestedField(7, "k", StringType())))),
        NestedField(8, "attrs", MapType(9, StringType(), 10, StructType(NestedField(11, "v", LongType())))),
    )
    table = ensure_sink_table(catalog, SINK, source)
    assert table.metadata.metadata_log == []  # one metadata file: schema and mapping were one commit
    assert _mapped_names(_fresh(catalog, table)) == {
        1: "id",
        3: "addr",
        4: "addr.city",
        5: "tags",
        6: "tags.element",
        7: "tags.element.k",
        8: "attrs",
        9: "attrs.key",
        10: "attrs.value",
        11: "attrs.value.v",
    }


# ----------------------------------------------------------------------------- renames


def test_a_renamed_column_is_renamed_in_the_sink_and_holds_rows_from_before_and_after(catalog):
    before = _schema(ID, QTY, ADDR)
    table = ensure_sink_table(catalog, SINK, before)
    _write(table, before, 1, [{"id": 1, "qty": 10, "addr": {"city": "Oslo"}}])
    after = _schema(ID, NestedField(2, "quantity", IntegerType(), required=True), ADDR)

    changes = evolve_sink_schema(table, after)

    assert changes.renamed == ["qty -> quantity"] and changes.added == [] and changes.made_optional == []
    table = _fresh(catalog, table)
    assert _names(table)[:3] == ["id", "quantity", "addr"]
    _write(table, after, 2, [{"id": 2, "quantity": 20, "addr": None}])
    assert [(r["id"], r["quantity"]) for r in _read(table)] == [(1, 10), (2, 20)]
    assert not evolve_sink_schema(table, after).changed


def test_nested_renames_follow_struct_fields_list_elements_and_map_values(catalog):
    def source(addr: str, city: str, k: str, v: str) -> Schema:
        return _schema(
            ID,
            NestedField(3, addr, StructType(NestedField(4, city, StringType()))),
            NestedField(5, "tags", ListType(6, StructType(NestedField(7, k, StringType())))),
            NestedField(8, "attrs", MapType(9, StringType(), 10, StructType(NestedField(11, v, LongType())))),
        )

    old = source("addr", "city", "k", "v")
    table = ensure_sink_table(catalog, SINK, old)
    _write(
        table, old, 1, [{"id": 1, "addr": {"city": "Oslo"}, "tags": [{"k": "a"}], "attrs": {"x": {"v": 1}}}]
    )
    new = source("address", "town", "key", "val")

    changes = evolve_sink_schema(table, new)

    assert sorted(changes.renamed) == [
        "addr -> address",
        "addr.city -> town",
        "attrs.value.v -> val",
        "tags.element.k -> key",
    ]
    assert changes.added == []
    table = _fresh(catalog, table)
    _write(
        table,
        new,
        2,
        [{"id": 2, "address": {"town": "Rome"}, "tags": [{"key": "b"}], "attrs": {"y": {"val": 2}}}],
    )
    rows = _read(table)
    assert [r["address"] for r in rows] == [{"town": "Oslo"}, {"town": "Rome"}]
    assert [r["tags"] for r in rows] == [[{"key": "a"}], [{"key": "b"}]]
    assert [r["attrs"] for r in rows] == [[("x", {"val": 1})], [("y", {"val": 2})]]


def test_a_rename_also_widens_relaxes_and_updates_the_doc_in_one_commit(catalog):
    table = ensure_sink_table(
        catalog, SINK, _schema(ID, QTY, NestedField(3, "ratio", FloatType(), required=True))
    )
    log = len(table.metadata.metadata_log)
    new = _schema(
        ID,
        NestedField(2, "quantity", LongType(), required=False, doc="how many"),
        NestedField(3, "ratio", DoubleType(), required=True),
    )
    changes = evolve_sink_schema(table, new)
    assert changes.renamed == ["qty -> quantity"]
    assert sorted(changes.widened) == ["qty", "ratio"]
    assert changes.made_optional == ["qty"] and changes.docs_updated == ["qty"]
    table = _fresh(catalog, table)
    assert len(table.metadata.metadata_log) == log + 1
    quantity = table.schema().find_field("quantity")
    assert (quantity.field_type, quantity.required, quantity.doc) == (LongType(), False, "how many")


def test_two_columns_swapping_names_swap_in_the_sink(catalog):
    a, b = NestedField(2, "a", StringType()), NestedField(3, "b", StringType())
    table = ensure_sink_table(catalog, SINK, _schema(ID, a, b))
    _write(table, _schema(ID, a, b), 1, [{"id": 1, "a": "A1", "b": "B1"}])
    swapped = _schema(ID, NestedField(2, "b", StringType()), NestedField(3, "a", StringType()))
    evolve_sink_schema(table, swapped)
    table = _fresh(catalog, table)
    _write(table, swapped, 2, [{"id": 2, "b": "A2", "a": "B2"}])  # field 2 is now called b
    assert [(r["b"], r["a"]) for r in _read(table)] == [("A1", "B1"), ("A2", "B2")]


def test_a_conflict_through_a_rename_names_the_sink_column_both_types_and_the_fix(catalog):
    table = ensure_sink_table(catalog, SINK, _schema(ID, QTY))
    before = table.metadata_location
    with pytest.raises(
        SinkSchemaError, match=r"column 'qty': the sink has int, the source has string"
    ) as info:
        evolve_sink_schema(table, _schema(ID, NestedField(2, "quantity", StringType())))
    assert "RENAME COLUMN" in str(info.value) and "Nothing was changed" in str(info.value)
    assert _fresh(catalog, table).metadata_location == before


# ----------------------------------------------------------------------------- adds and drops


def test_an_added_field_gets_a_column_before_the_change_columns_and_a_mapping_entry(catalog):
    table = ensure_sink_table(catalog, SINK, _schema(ID, QTY))
    changes = evolve_sink_schema(table, _schema(ID, QTY, NestedField(9, "note", StringType(), required=True)))
    assert changes.added == ["note"]
    table = _fresh(catalog, table)
    assert _names(table)[:4] == ["id", "qty", "note", CHANGE_TYPE]
    assert table.schema().find_field("note").optional
    assert _mapped_names(table)[9] == "note"


def test_a_dropped_field_stays_optional_and_mapped(catalog):
    table = ensure_sink_table(catalog, SINK, _schema(ID, QTY))
    changes = evolve_sink_schema(table, _schema(ID))
    assert changes.made_optional == ["qty"] and changes.renamed == []
    table = _fresh(catalog, table)
    assert table.schema().find_field("qty").optional
    assert _mapped_names(table)[2] == "qty"


def test_a_column_dropped_and_added_again_under_its_name_is_a_new_column(catalog):
    old = _schema(ID, QTY)
    table = ensure_sink_table(catalog, SINK, old)
    _write(table, old, 1, [{"id": 1, "qty": 10}])
    evolve_sink_schema(table, _schema(ID))  # dropped
    readded = _schema(ID, NestedField(5, "qty", StringType()))  # a new field id, even a new type

    changes = evolve_sink_schema(table, readded)

    assert changes.renamed == ["qty -> qty__dropped_2"] and changes.added == ["qty"]
    table = _fresh(catalog, table)
    assert _mapped_names(table) == {1: "id", 2: "qty__dropped_2", 5: "qty"}
    _write(table, readded, 2, [{"id": 2, "qty": "ten"}])
    assert [(r["qty__dropped_2"], r["qty"]) for r in _read(table)] == [(10, None), (None, "ten")]


def test_a_rename_onto_a_dropped_columns_name_moves_the_history_column_aside(catalog):
    amount = NestedField(6, "amount", IntegerType())
    old = _schema(ID, QTY, amount)
    table = ensure_sink_table(catalog, SINK, old)
    _write(table, old, 1, [{"id": 1, "qty": 10, "amount": 100}])
    evolve_sink_schema(table, _schema(ID, amount))  # qty dropped: stays as history
    renamed = _schema(ID, NestedField(6, "qty", IntegerType()))  # amount takes the name

    changes = evolve_sink_schema(table, renamed)

    assert sorted(changes.renamed) == ["amount -> qty", "qty -> qty__dropped_2"]
    table = _fresh(catalog, table)
    _write(table, renamed, 2, [{"id": 2, "qty": 200}])
    assert [(r["qty__dropped_2"], r["qty"]) for r in _read(table)] == [(10, 100), (None, 200)]
    assert not evolve_sink_schema(table, renamed).changed


# ----------------------------------------------------------------------------- legacy sinks


def _legacy_sink(catalog, sink_schema: Schema) -> Table:
    catalog.create_namespace_if_not_exists("shop")
    return catalog.create_table(SINK, schema=sink_schema)


def test_a_legacy_sink_is_paired_by_name_on_its_first_evolve(catalog):
    source = _schema(ID, QTY, ADDR)
    table = _legacy_sink(catalog, sink_schema_for(source))
    assert field_ids.PROPERTY not in table.properties

    changes = evolve_sink_schema(table, source)

    assert not changes.changed and changes.mapping_written
    assert _mapped_names(_fresh(catalog, table)) == {1: "id", 2: "qty", 3: "addr", 4: "addr.city"}
    assert not evolve_sink_schema(table, source).mapping_written  # written once


def test_a_legacy_sink_that_split_a_renamed_column_keeps_the_old_one_as_unmapped_history(catalog):
    # What name matching made of 'qty' renamed to 'quantity': a second column.
    split = sink_schema_for(_schema(ID, QTY, NestedField(20, "quantity", IntegerType())))
    table = _legacy_sink(catalog, split)
    source = _schema(ID, NestedField(2, "quantity", IntegerType(), required=True))

    changes = evolve_sink_schema(table, source)

    assert changes.renamed == [] and changes.made_optional == ["qty"]
    table = _fresh(catalog, table)
    assert _mapped_names(table) == {1: "id", 2: "quantity"}
    _write(table, source, 1, [{"id": 1, "quantity": 5}])
    assert [(r["qty"], r["quantity"]) for r in _read(table)] == [(None, 5)]
    # A new source column taking the history column's name moves it aside, by its sink id.
    qty_sink_id = table.schema().find_field("qty").field_id
    readded = _schema(
        ID, NestedField(2, "quantity", IntegerType(), required=True), NestedField(7, "qty", LongType())
    )
    assert evolve_sink_schema(table, readded).renamed == [f"qty -> qty__unmapped_{qty_sink_id}"]


def test_an_unreadable_mapping_is_refused_with_the_property_and_the_fix(catalog):
    table = ensure_sink_table(catalog, SINK, _schema(ID, QTY))
    with table.transaction() as txn:
        txn.set_properties({field_ids.PROPERTY: "9:1=1"})
    with pytest.raises(
        SinkSchemaError, match=r"'cdc.source-field-ids' has version '9'.*remove the sink table property"
    ):
        evolve_sink_schema(table, _schema(ID, QTY))
    with pytest.raises(SinkSchemaError, match="maps source field id 1 to two sink fields"):
        field_ids.decode("1:1=1,2=1")


# ----------------------------------------------------------------------------- old snapshots


def test_reprocessing_an_old_snapshot_adds_only_its_vanished_fields_and_never_renames_back(catalog):
    old = _schema(ID, QTY, NestedField(5, "note", StringType()))
    current = _schema(
        ID, NestedField(2, "quantity", LongType(), required=True)
    )  # renamed, widened; note dropped
    table = ensure_sink_table(catalog, SINK, current)  # made after the changes: no 'note'

    changes = evolve_sink_schema(table, current, history=old)

    assert changes.added == ["note"] and changes.renamed == [] and changes.widened == []
    table = _fresh(catalog, table)
    assert table.schema().find_field("quantity").field_type == LongType()
    _write(table, old, 1, [{"id": 1, "qty": 3, "note": "n"}])  # rows named by the old schema
    assert [(r["quantity"], r["note"]) for r in _read(table)] == [(3, "n")]
    assert not evolve_sink_schema(table, current, history=old).changed


def test_an_old_snapshots_field_whose_name_is_taken_gets_a_dropped_name(catalog):
    old = _schema(ID, QTY)
    current = _schema(ID, NestedField(5, "qty", StringType()))  # qty dropped, re-added as a new field
    table = ensure_sink_table(catalog, SINK, current)
    changes = evolve_sink_schema(table, current, history=old)
    assert changes.added == ["qty__dropped_2"]
    table = _fresh(catalog, table)
    _write(table, old, 1, [{"id": 1, "qty": 4}])
    assert [(r["qty__dropped_2"], r["qty"]) for r in _read(table)] == [(4, None)]


# ----------------------------------------------------------------------------- rows


def test_rows_of_an_unmapped_source_field_are_refused_before_writing(catalog):
    table = ensure_sink_table(catalog, SINK, _schema(ID))
    source = _schema(ID, NestedField(9, "extra", StringType()))
    changes = pa.table({"id": [1], "extra": ["x"], CHANGE_TYPE: ["INSERT"]})
    with pytest.raises(SinkSchemaError, match=r"'extra' \(source field id 9\) has no column in the sink"):
        to_sink_arrow(
            changes, table.schema(), 1, 1, 1, source_schema=source, field_ids=field_ids.read(table.properties)
        )


def test_plan_without_a_mapping_pairs_by_name():
    sink = sink_schema_for(_schema(ID, QTY))
    plan = plan_sink_evolution(sink, _schema(ID, NestedField(2, "quantity", IntegerType(), required=True)))
    # No mapping: 'qty' is not known to be field 2, so the renamed field is new (the legacy behaviour).
    assert plan.added == ["quantity"] and plan.renamed == []

"""The Iceberg mirror's planned schema (real SQLite catalog): by field id, staged but never committed."""

from __future__ import annotations

import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import IntegerType, LongType, NestedField, StringType, StructType

from iceberg_cdc.errors import MirrorSchemaError
from iceberg_cdc.mirror.iceberg.schema import mapping_json, planned_schema
from iceberg_cdc.mirror.iceberg.summary import MAPPING_PROPERTY

MIRROR = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "a", StringType(), required=False),
    NestedField(3, "b", StringType(), required=False),
    NestedField(4, "n", IntegerType(), required=True),
    identifier_field_ids=[1],
)


@pytest.fixture
def mirror(tmp_path):
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path / 'c.db'}", warehouse=f"file://{tmp_path}")
    catalog.create_namespace("m")
    table = catalog.create_table("m.orders", schema=MIRROR)
    with table.transaction() as tx:  # changelog ids 11.. map to the mirror's 1..
        tx.set_properties({MAPPING_PROPERTY: mapping_json({11: 1, 12: 2, 13: 3, 14: 4})})
    return catalog.load_table("m.orders")


def sink(*fields: NestedField) -> list[NestedField]:
    return list(fields)


def test_swapped_names_keep_each_column_its_values(mirror):
    plan = planned_schema(
        mirror,
        sink(
            NestedField(11, "id", LongType(), required=True),
            NestedField(12, "b", StringType()),
            NestedField(13, "a", StringType()),
            NestedField(14, "n", IntegerType(), required=True),
        ),
    )
    assert plan.schema.find_field("b").field_id == 2 and plan.schema.find_field("a").field_id == 3
    assert plan.mapping == {11: 1, 12: 2, 13: 3, 14: 4}
    assert mirror.schema() == MIRROR  # nothing committed
    assert len(mirror.metadata.schemas) == 1


def test_a_column_the_mirror_no_longer_gets_is_kept_and_made_optional_and_a_struct_added(mirror):
    plan = planned_schema(
        mirror,
        sink(
            NestedField(11, "id", LongType(), required=True),
            NestedField(12, "a", StringType()),
            NestedField(13, "b", StringType()),
            NestedField(15, "addr", StructType(NestedField(16, "city", StringType()))),
        ),
    )
    assert not plan.schema.find_field("n").required  # kept, null in new rows
    addr = plan.schema.find_field("addr")
    city = plan.schema.find_field("addr.city")
    assert plan.mapping == {11: 1, 12: 2, 13: 3, 14: 4, 15: addr.field_id, 16: city.field_id}
    assert plan.figures["added"] == ["addr"]


def test_a_widening_is_planned_and_an_unrelated_type_refused(mirror):
    plan = planned_schema(
        mirror,
        sink(
            NestedField(11, "id", LongType(), required=True),
            NestedField(12, "a", StringType()),
            NestedField(13, "b", StringType()),
            NestedField(14, "n", LongType(), required=True),
        ),
    )
    assert plan.schema.find_field("n").field_type == LongType() and plan.figures["widened"] == ["n"]
    with pytest.raises(MirrorSchemaError, match=r"column 'a' is string in the mirror, int in the changelog"):
        planned_schema(mirror, sink(NestedField(12, "a", IntegerType())))

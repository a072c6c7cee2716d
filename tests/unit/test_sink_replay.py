"""The changelog's replay (a bridge's base when its snapshot is gone): whole rows by multiplicity.

A real SQLite catalog holding a changelog-shaped table; the source schema's
columns come back under the source's field ids, renamed columns by the map.
"""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import DoubleType, LongType, NestedField, StringType

from iceberg_cdc.errors import SourceHistoryError
from iceberg_cdc.sink.replay import changelog_rows, replayed_state

SOURCE = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "price", DoubleType(), required=False),
    NestedField(3, "note", StringType(), required=False),
)


def changelog(tmp_path, rows: list[tuple]):
    catalog = SqlCatalog("r", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("shop")
    schema = Schema(
        NestedField(10, "id", LongType(), required=False),
        NestedField(11, "amount", DoubleType(), required=False),  # the source's ``price``, renamed since
        NestedField(12, "_change_type", StringType(), required=False),
    )
    table = catalog.create_table("shop.changes", schema=schema)
    ids, amounts, kinds = zip(*rows, strict=True) if rows else ((), (), ())
    table.append(
        pa.table(
            {"id": list(ids), "amount": list(amounts), "_change_type": list(kinds)},
            schema=table.schema().as_arrow(),
        )
    )
    return table


def as_rows(table: pa.Table) -> Counter:
    return Counter(zip(*(table.column(n).to_pylist() for n in table.column_names), strict=True))


def test_after_images_minus_before_images_by_whole_row(tmp_path):
    table = changelog(
        tmp_path,
        [
            (1, 1.0, "INSERT"),
            (1, 1.0, "INSERT"),  # a duplicate row is two rows of the state
            (2, 2.0, "INSERT"),
            (3, float("nan"), "INSERT"),
            (2, 2.0, "UPDATE_BEFORE"),
            (2, 2.5, "UPDATE_AFTER"),
            (1, 1.0, "DELETE"),
            (3, float("nan"), "DELETE"),  # NaN equals NaN, as the changelog compares rows
            (4, None, "INSERT"),
        ],
    )
    state = replayed_state(table, SOURCE, {2: "amount"})
    assert state.schema == SOURCE.as_arrow(), "the source's columns and field ids"
    assert as_rows(state) == Counter({(1, 1.0, None): 1, (2, 2.5, None): 1, (4, None, None): 1})
    assert changelog_rows(table) == 9


def test_a_row_removed_more_often_than_added_is_an_error_not_a_guess(tmp_path):
    table = changelog(tmp_path, [(1, 1.0, "INSERT"), (1, 1.0, "DELETE"), (1, 1.0, "DELETE")])
    with pytest.raises(SourceHistoryError, match=r"removed 1 more time.*start: latest"):
        replayed_state(table, SOURCE, {2: "amount"})

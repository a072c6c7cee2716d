"""The mirror's changelog reader gets rows under the changelog's current names, whatever schema wrote them.

A real SQLite catalog and real Parquet files: rows written before a rename
carry the old name in their files (same field id).
"""

from __future__ import annotations

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.schema import Schema
from pyiceberg.types import IntegerType, LongType, NestedField, StringType

from iceberg_cdc.mirror.changelog import _scan

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "status", StringType(), required=False),
    NestedField(3, "qty", IntegerType(), required=False),
)


def test_rows_before_a_rename_and_a_widening_read_under_the_current_names_and_types(tmp_path):
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path / 'c.db'}", warehouse=f"file://{tmp_path}")
    catalog.create_namespace("n")
    table = catalog.create_table("n.changelog", schema=SCHEMA)
    table.append(pa.table({"id": [1, 2], "status": ["a", "b"], "qty": [5, None]}).cast(SCHEMA.as_arrow()))
    old = table.current_snapshot().snapshot_id
    with table.update_schema() as update:
        update.rename_column("status", "label")
        update.update_column("qty", LongType())
        update.add_column("note", StringType())
    table.append(
        pa.table({"id": [3], "label": ["c"], "qty": [2**40], "note": ["n"]}).cast(table.schema().as_arrow())
    )
    new = table.current_snapshot().snapshot_id
    columns = ["id", "label", "qty", "note"]
    # at the current snapshot: pyiceberg reads the old file by field id, under the new name
    now = _scan(table, new, AlwaysTrue(), columns).sort_by("id")
    assert now.column("label").to_pylist() == ["a", "b", "c"]
    # at the snapshot before the rename: its schema still says "status" and int
    before = _scan(table, old, AlwaysTrue(), columns).sort_by("id")
    assert before.column_names == columns
    assert before.column("label").to_pylist() == ["a", "b"]
    assert before.column("qty").to_pylist() == [5, None] and pa.types.is_int64(before.column("qty").type)
    assert before.column("note").to_pylist() == [None, None]
    assert before.schema == now.schema

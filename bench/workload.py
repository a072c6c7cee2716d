"""The benchmark's source tables: real Iceberg tables in a SQLite catalog, warehouse on local disk.

A source table of ``rows`` rows (a dozen columns: longs, strings, a decimal,
timestamps; partitioned by the low-cardinality ``region``) is appended in
``appends`` chunks, each chunk writing one file per region. Then ONE
copy-on-write ``overwrite`` snapshot rewrites every data file: 10% of rows
updated (a fifth of those move to another region), 1% deleted, the rest
carried over unchanged. That is copy-on-write's realistic worst case: the
snapshot's removed and added files hold the whole table twice.

Rows come from ``engine_bench``'s vectorized generators, so the engine-only
figures and these describe the same data. The rewrite is built the same way
(the generator knows every row's new version), chunk by chunk as an engine's
tasks would write it, and committed as one snapshot; reading 5 M rows back
through pyiceberg to rewrite them (``cow_merge``) would take minutes.

The warehouse is ``file://``, so the Spark-native baseline reads the very
same Parquet files from local disk.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from engine_bench import deleted_mask, table_batch, updated_mask
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import _dataframe_to_data_files
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import (
    BooleanType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
    TimestamptzType,
)

from cdc_devtools.cow import cow_merge
from iceberg_cdc.sink.commit import advance_watermark
from iceberg_cdc.sink.table import ensure_sink_table

NAMESPACE = "bench"
CATALOG_NAME = "bench"
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "customer_id", LongType(), required=False),
    NestedField(3, "region", StringType(), required=False),
    NestedField(4, "status", StringType(), required=False),
    NestedField(5, "amount", DecimalType(18, 2), required=False),
    NestedField(6, "quantity", IntegerType(), required=False),
    NestedField(7, "price", DoubleType(), required=False),
    NestedField(8, "created_at", TimestamptzType(), required=False),
    NestedField(9, "updated_at", TimestampType(), required=False),
    NestedField(10, "sku", StringType(), required=False),
    NestedField(11, "note", StringType(), required=False),
    NestedField(12, "active", BooleanType(), required=False),
    identifier_field_ids=[1],
)
COLUMNS = [field.name for field in SCHEMA.fields]


@dataclass(frozen=True)
class Workload:
    """One source table and the copy-on-write snapshot the benchmark processes."""

    table: str  # source identifier
    rows: int
    parent_id: int
    snapshot_id: int
    parent_ordinal: int  # position of the parent in the table's history (1-based)
    removed: list[str]  # data file paths the snapshot removed (DELETE rows)
    added: list[str]  # data file paths it added (INSERT rows)
    removed_bytes: int
    added_bytes: int


def open_catalog(work: Path) -> SqlCatalog:
    (work / "warehouse").mkdir(parents=True, exist_ok=True)
    catalog = SqlCatalog(
        CATALOG_NAME, uri=f"sqlite:///{work / 'catalog.db'}", warehouse=(work / "warehouse").as_uri()
    )
    catalog.create_namespace_if_not_exists(NAMESPACE)
    return catalog


def catalog_properties(work: Path) -> dict[str, str]:
    """The same catalog as :func:`open_catalog`, as the pipeline's config names it."""
    return {
        "name": CATALOG_NAME,
        "type": "sql",
        "uri": f"sqlite:///{work / 'catalog.db'}",
        "warehouse": (work / "warehouse").as_uri(),
    }


def _chunks(rows: int, appends: int) -> list[tuple[int, int]]:
    size = -(-rows // appends)
    return [(start, min(size, rows - start)) for start in range(0, rows, size)]


def _version(first_id: int, n: int, version: int) -> pa.Table:
    """Rows ``first_id ..`` as of the parent (0) or the snapshot (1, deleted rows dropped)."""
    batch = table_batch(first_id, n, version)
    if version == 1:
        batch = batch.filter(pa.array(~deleted_mask(batch.column("id").to_numpy())))
    return pa.Table.from_batches([batch]).cast(SCHEMA.as_arrow())


def _rewrite(table: Table, chunks: list[tuple[int, int]]) -> int:
    """One overwrite snapshot removing every live file and adding the rewritten chunks."""
    remove = [task.file for task in table.scan().plan_files()]

    def new_files() -> Iterator:
        for first, n in chunks:
            yield from _dataframe_to_data_files(table.metadata, _version(first, n, 1), table.io)

    added = list(new_files())
    with table.transaction() as tx, tx.update_snapshot().overwrite() as rewrite:
        for data_file in remove:
            rewrite.delete_data_file(data_file)
        for data_file in added:
            rewrite.append_data_file(data_file)
    table.refresh()
    return table.current_snapshot().snapshot_id


def build_source(catalog: Catalog, name: str, rows: int, appends: int) -> Workload:
    """The source table with ``appends`` append snapshots, then the copy-on-write snapshot."""
    identifier = f"{NAMESPACE}.{name}"
    spec = PartitionSpec(PartitionField(3, 1000, IdentityTransform(), "region"))
    table = catalog.create_table(identifier, schema=SCHEMA, partition_spec=spec)
    chunks = _chunks(rows, appends)
    for first, n in chunks:
        table.append(_version(first, n, 0))
    parent_id = table.current_snapshot().snapshot_id
    snapshot_id = _rewrite(table, chunks)
    return describe(table, identifier, rows, parent_id, snapshot_id, parent_ordinal=len(chunks))


def describe(
    table: Table, identifier: str, rows: int, parent_id: int, snapshot_id: int, parent_ordinal: int
) -> Workload:
    from iceberg_cdc.source.changes import snapshot_changes

    changes = snapshot_changes(table, snapshot_id)
    return Workload(
        table=identifier,
        rows=rows,
        parent_id=parent_id,
        snapshot_id=snapshot_id,
        parent_ordinal=parent_ordinal,
        removed=[ref.path for ref in changes.deleted],
        added=[ref.path for ref in changes.added],
        removed_bytes=sum(ref.size for ref in changes.deleted),
        added_bytes=sum(ref.size for ref in changes.added),
    )


def start_sink_at_parent(catalog: Catalog, workload: Workload, sink: str) -> None:
    """Create ``sink`` with its watermark at the snapshot's parent, so the next run takes the snapshot.

    The appends before it are insert-only history the benchmark is not about.
    """
    source = catalog.load_table(workload.table)
    table = ensure_sink_table(catalog, sink, source.schema())
    advance_watermark(
        table, workload.table, str(source.metadata.table_uuid), workload.parent_id, workload.parent_ordinal
    )


def build_one_row_update(catalog: Catalog, name: str, rows: int) -> Workload:
    """A small table (one append) and a copy-on-write snapshot that updates one row."""
    identifier = f"{NAMESPACE}.{name}"
    spec = PartitionSpec(PartitionField(3, 1000, IdentityTransform(), "region"))
    table = catalog.create_table(identifier, schema=SCHEMA, partition_spec=spec)
    table.append(_version(0, rows, 0))
    parent_id = table.current_snapshot().snapshot_id
    row = _version(0, 1, 0)
    updated = row.set_column(
        COLUMNS.index("status"), "status", pa.array(["closed"], row.schema.field("status").type)
    )
    snapshot_id = cow_merge(table, upserts=updated)
    return describe(table, identifier, rows, parent_id, snapshot_id, parent_ordinal=1)


def expected_counts(rows: int) -> dict[str, int]:
    """Update pairs and deletes the generator puts into a snapshot of ``rows`` rows."""
    ids = np.arange(rows, dtype=np.int64)
    deleted = deleted_mask(ids)
    updated = updated_mask(ids) & ~deleted
    return {"updates": int(updated.sum()), "deletes": int(deleted.sum())}


def describe_workload(workload: Workload) -> dict[str, Any]:
    """A workload as the results record it: its figures, and its files counted rather than listed."""
    data = asdict(workload)
    data["removed_files"] = len(data.pop("removed"))
    data["added_files"] = len(data.pop("added"))
    return data

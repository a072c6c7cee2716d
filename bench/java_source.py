"""The bench's copy-on-write snapshot, written by Apache Iceberg Java instead of pyiceberg.

``workload.build_source`` commits the benchmark's snapshot through pyiceberg; the real peer
(``peer.py``, Iceberg's own ``create_changelog_view``) should run on a table as Iceberg Java itself
writes it. Same rows, same change: the generator's rows (``engine_bench.table_batch``) are staged as
Parquet, then one Iceberg Java session (``cdc_devtools.iceberg_java``, in the bench's SQLite catalog)

1. creates the table (v2, copy-on-write for deletes, updates and merges; partitioned by region;
   identifier ``id``), the bench's schema in Spark SQL types;
2. appends the rows in ``appends`` INSERTs;
3. runs one ``MERGE INTO`` from the staged change rows: 10% of rows updated (a fifth of them move
   region), 1% deleted -- copy-on-write, so every data file holding a changed row (all of them) is
   rewritten in one ``overwrite`` snapshot.

The JVM exits before pyiceberg reads the table back (``workload.describe``).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import workload as wl
from engine_bench import deleted_mask, table_batch, updated_mask
from pyiceberg.catalog import Catalog

from cdc_devtools.iceberg_java import IcebergJava

COW = ", ".join(
    f"'{key}'='copy-on-write'" for key in ("write.delete.mode", "write.update.mode", "write.merge.mode")
)
# The bench's schema (workload.SCHEMA) as Spark SQL declares it: timestamp is Iceberg's timestamptz,
# timestamp_ntz its timestamp.
DDL = (
    "id bigint NOT NULL, customer_id bigint, region string, status string, amount decimal(18,2), "
    "quantity int, price double, created_at timestamp, updated_at timestamp_ntz, sku string, "
    "note string, active boolean"
)
GONE = "_gone"  # the staged change rows' flag: delete this id (else: update it to this row)


def stage(staging: Path, rows: int, appends: int) -> tuple[list[Path], Path]:
    """The base rows, one Parquet file per append, and the change rows of the snapshot."""
    staging.mkdir(parents=True, exist_ok=True)
    arrow_schema = wl.SCHEMA.as_arrow()
    bases, changes = [], []
    for number, (first, n) in enumerate(wl._chunks(rows, appends)):
        base = staging / f"base-{number}.parquet"
        pq.write_table(pa.Table.from_batches([table_batch(first, n, 0)]).cast(arrow_schema), base)
        bases.append(base)
        after = pa.Table.from_batches([table_batch(first, n, 1)]).cast(arrow_schema)
        ids = after.column("id").to_numpy()
        deleted = deleted_mask(ids)
        changed = after.filter(pa.array(updated_mask(ids) | deleted))
        gone = pc.is_in(changed.column("id"), pa.array(ids[deleted], pa.int64()))
        changes.append(changed.append_column(GONE, gone))
    change_file = staging / "changes.parquet"
    pq.write_table(pa.concat_tables(changes), change_file)
    return bases, change_file


def steps(table: str, bases: list[Path], changes: Path) -> list[dict[str, str]]:
    """Create, append, then the one copy-on-write MERGE: the Iceberg Java statements, in order."""
    columns = [field.name for field in wl.SCHEMA.fields]
    select = ", ".join(columns)
    update = ", ".join(f"t.{c} = s.{c}" for c in columns if c != "id")
    return [
        {
            "sql": f"CREATE TABLE {table} ({DDL}) USING iceberg PARTITIONED BY (region) "
            f"TBLPROPERTIES ('format-version'='2', {COW})"
        },
        {"sql": f"ALTER TABLE {table} SET IDENTIFIER FIELDS id"},
        *({"sql": f"INSERT INTO {table} SELECT {select} FROM parquet.`{base}`"} for base in bases),
        {
            "sql": f"MERGE INTO {table} t USING (SELECT * FROM parquet.`{changes}`) s ON t.id = s.id "
            f"WHEN MATCHED AND s.{GONE} THEN DELETE WHEN MATCHED THEN UPDATE SET {update}"
        },
    ]


def build(
    catalog: Catalog, java: IcebergJava, name: str, rows: int, appends: int, staging: Path
) -> wl.Workload:
    """The table ``bench.<name>`` written by Iceberg Java, described as ``workload.build_source`` does."""
    identifier = f"{wl.NAMESPACE}.{name}"
    bases, changes = stage(staging, rows, appends)
    # Qualified by the catalog: Spark reads a leading "bench." as the catalog of that name.
    java.run(steps(f"{wl.CATALOG_NAME}.{identifier}", bases, changes), timeout=1800)
    table = catalog.load_table(identifier)
    current = table.current_snapshot()
    if current is None or current.parent_snapshot_id is None or current.summary is None:
        raise RuntimeError(f"{identifier}: Iceberg Java left no snapshot with a parent")
    if current.summary.operation.value != "overwrite":
        raise RuntimeError(f"{identifier}: the MERGE committed {current.summary.operation}, not an overwrite")
    history = [snapshot.snapshot_id for snapshot in table.snapshots()]
    parent = current.parent_snapshot_id
    made = wl.describe(table, identifier, rows, parent, current.snapshot_id, history.index(parent) + 1)
    live = table.inspect.data_files().num_rows
    if len(made.added) != live or not made.removed:
        raise RuntimeError(
            f"{identifier}: the MERGE rewrote {len(made.removed)} files, added {len(made.added)}"
        )
    return made

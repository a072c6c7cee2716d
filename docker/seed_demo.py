"""Give the stack something to capture: create or change the first configured source table.

``docker compose --profile demo run --rm demo-seed`` runs this inside the
project image against the stack's catalog (whatever ``CDC_CONFIG`` names).
The first run creates the table, partitioned by ``region``, with 2,000 rows
(one append snapshot). Every later run commits ONE copy-on-write overwrite
snapshot, as Spark's MERGE would: 100 rows updated (20 of them moved to
another region), 10 deleted and 50 inserted. Each run adds a snapshot for the
table's DAG to process, so the pipeline can be watched doing real work.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType

from cdc_devtools.cow import cow_merge
from iceberg_cdc.config import load_config
from iceberg_cdc.pipeline.runtime import load_catalog_from_config

REGIONS = ["us", "eu", "apac", "latam"]
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "region", StringType(), required=False),
    NestedField(3, "status", StringType(), required=False),
    NestedField(4, "amount_cents", LongType(), required=False),
    identifier_field_ids=[1],
)
INITIAL_ROWS = 2_000


def orders(ids: np.ndarray, rng: np.random.Generator, status: str) -> pa.Table:
    return pa.Table.from_pydict(
        {
            "id": pa.array(ids, pa.int64()),
            "region": pa.array(rng.choice(REGIONS, len(ids))),
            "status": pa.array([status] * len(ids)),
            "amount_cents": pa.array(rng.integers(100, 100_000, len(ids)), pa.int64()),
        },
        schema=SCHEMA.as_arrow(),
    )


def create(catalog, identifier: str, rng: np.random.Generator) -> int:
    """The table and its first snapshot: an append of INITIAL_ROWS new rows."""
    namespace = identifier.rsplit(".", 1)[0]
    with contextlib.suppress(NamespaceAlreadyExistsError):
        catalog.create_namespace(namespace)
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "region"))
    table = catalog.create_table(identifier, schema=SCHEMA, partition_spec=spec)
    table.append(orders(np.arange(INITIAL_ROWS), rng, "placed"))
    return table.current_snapshot().snapshot_id


def merge(table, rng: np.random.Generator) -> int:
    """One copy-on-write snapshot: updates (some moving region), deletes and inserts."""
    current = table.scan().to_arrow()
    ids = current.column("id").to_numpy()
    touched = rng.choice(ids, 110, replace=False)
    updated_ids, deleted_ids = touched[:100], touched[100:]
    updated = current.filter(pc.is_in(current.column("id"), value_set=pa.array(updated_ids)))
    regions = updated.column("region").to_pylist()
    moved = [REGIONS[(REGIONS.index(r) + 1) % len(REGIONS)] if i < 20 else r for i, r in enumerate(regions)]
    updated = updated.set_column(1, "region", pa.array(moved)).set_column(
        2, "status", pa.array(["shipped"] * updated.num_rows)
    )
    new = orders(np.arange(int(ids.max()) + 1, int(ids.max()) + 51), rng, "placed")
    snapshot_id = cow_merge(
        table, upserts=pa.concat_tables([updated.cast(new.schema), new]), delete_keys=deleted_ids.tolist()
    )
    if snapshot_id is None:
        raise RuntimeError(f"the merge on {table.name()} changed nothing")
    return snapshot_id


def seed(config_path: str | None = None, seed_value: int | None = None) -> tuple[str, int]:
    """Create or change the first configured source table; returns (what was done, new snapshot id)."""
    config = load_config(config_path)
    identifier = config.tables[0].source
    catalog = load_catalog_from_config(config)
    rng = np.random.default_rng(seed_value)
    try:
        table = catalog.load_table(identifier)
    except NoSuchTableError:
        return f"created {identifier} with {INITIAL_ROWS} rows", create(catalog, identifier, rng)
    return f"merged into {identifier}: 100 updated, 10 deleted, 50 inserted", merge(table, rng)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=None, help="config file (default: $CDC_CONFIG)")
    args = parser.parse_args(argv)
    what, snapshot_id = seed(args.config)
    print(f"{what}: snapshot {snapshot_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

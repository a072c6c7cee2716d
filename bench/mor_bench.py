"""Merge-on-read against copy-on-write: the same 1 % of rows deleted, written both ways.

Two tables of the benchmark's shape (``N`` rows in the same appends, same
rows) each get ONE snapshot that deletes the same 1 % of rows
(``engine_bench.deleted_mask``):

* **merge-on-read**: equality delete files on ``id``, one per region
  partition, as a Flink job commits deletes. No data file changes; the
  pipeline finds the data files the deletes apply to (partition, sequence
  number, ``id`` bounds), masks rows per batch and shuffles only the deleted
  rows' full images;
* **copy-on-write**: every data file rewritten without the deleted rows, as
  Spark's ``DELETE`` commits it: the removed and added files hold the table
  twice and all but 1 % is carryover.

Both run through the same pipeline path as the main comparison (phases by
``spark-submit``, shuffle on file://), in one run; the sink's rows must be
exactly the deletes the generator made.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import workload as wl
from engine_bench import REGIONS, deleted_mask
from pyiceberg.catalog import Catalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record

from cdc_devtools.mor import commit_row_delta, equality_delete_file, write_data_files


def _base_table(
    catalog: Catalog, name: str, rows: int, appends: int
) -> tuple[Table, str, list[tuple[int, int]]]:
    identifier = f"{wl.NAMESPACE}.{name}"
    spec = PartitionSpec(PartitionField(3, 1000, IdentityTransform(), "region"))
    table = catalog.create_table(identifier, schema=wl.SCHEMA, partition_spec=spec)
    chunks = wl._chunks(rows, appends)
    for first, n in chunks:
        table.append(wl._version(first, n, 0))
    return table, identifier, chunks


def _deleted_rows(chunks: list[tuple[int, int]]) -> pa.Table:
    parts = []
    for first, n in chunks:
        rows = wl._version(first, n, 0)
        parts.append(
            rows.filter(pa.array(deleted_mask(rows.column("id").to_numpy()))).select(["id", "region"])
        )
    return pa.concat_tables(parts)


def build_mor_delete(catalog: Catalog, rows: int, appends: int) -> wl.Workload:
    """The table, then one snapshot of equality deletes (one file per region) for 1 % of ids."""
    table, identifier, chunks = _base_table(catalog, "orders_mor", rows, appends)
    parent_id = table.current_snapshot().snapshot_id
    victims = _deleted_rows(chunks)
    spec = table.spec()
    deletes = []
    for region in REGIONS:
        ids = victims.filter(pc.equal(victims.column("region"), str(region))).column("id")
        if len(ids):
            keys = pa.table({"id": ids.cast(pa.int64())})
            deletes.append(
                equality_delete_file(table, keys, spec_id=spec.spec_id, partition=Record(str(region)))
            )
    snapshot_id = commit_row_delta(table, add=deletes, operation=Operation.DELETE)
    return wl.describe(table, identifier, rows, parent_id, snapshot_id, parent_ordinal=len(chunks))


def build_cow_delete(catalog: Catalog, rows: int, appends: int) -> wl.Workload:
    """The same table, then one copy-on-write snapshot rewriting every file without the 1 %."""
    table, identifier, chunks = _base_table(catalog, "orders_cow_delete", rows, appends)
    parent_id = table.current_snapshot().snapshot_id
    remove = [task.file for task in table.scan().plan_files()]
    added = []
    for first, n in chunks:
        kept = wl._version(first, n, 0)
        kept = kept.filter(pa.array(~deleted_mask(kept.column("id").to_numpy())))
        added.extend(write_data_files(table, kept))
    snapshot_id = commit_row_delta(table, add=added, remove=remove, operation=Operation.DELETE)
    return wl.describe(table, identifier, rows, parent_id, snapshot_id, parent_ordinal=len(chunks))


def expected_deletes(rows: int) -> int:
    return int(deleted_mask(np.arange(rows, dtype=np.int64)).sum())


def _summary(result: dict[str, Any]) -> dict[str, Any]:
    b = result["breakdown"]
    return {
        "wall_seconds": result["wall_seconds"],
        "phase_seconds": result["phase_seconds"],
        "input_files": result["input_files"],
        "input_file_bytes": result["input_file_bytes"],
        "shuffle_bytes": sum(result["map_data_bytes"]),
        "rows": b["rows"],
    }


def run_mor_vs_cow(bench, rows: int, appends: int, log) -> dict[str, Any]:
    """Both snapshots through the pipeline (file:// shuffle, spark-submit per phase), checked."""
    log(f"merge-on-read: {rows:,}-row table, one snapshot of equality deletes for 1 % of ids")
    mor = build_mor_delete(bench.catalog, rows, appends)
    log(f"copy-on-write: the same {rows:,} rows, one snapshot rewriting every file without the same 1 %")
    cow = build_cow_delete(bench.catalog, rows, appends)
    out: dict[str, Any] = {"expected_deletes": expected_deletes(rows)}
    for label, workload in (("mor", mor), ("cow", cow)):
        log(f"pipeline on the {label} delete snapshot")
        out[label] = _summary(bench.pipeline(f"{label}-delete", workload, "file"))
    out["equal"] = all(
        out[k]["rows"]["deletes"] == out["expected_deletes"]
        and out[k]["rows"]["updates"] == 0
        and out[k]["rows"]["inserts"] == 0
        for k in ("mor", "cow")
    )
    return out


def mor_line(result: dict[str, Any]) -> str:
    mor, cow = result["mor"], result["cow"]
    return (
        f"merge-on-read: 1% equality deletes {mor['wall_seconds']:.1f} s "
        f"({mor['shuffle_bytes'] / 2**20:.1f} MB shuffled), copy-on-write, same deletes "
        f"{cow['wall_seconds']:.1f} s ({cow['shuffle_bytes'] / 2**20:.1f} MB shuffled), "
        f"ratio={mor['wall_seconds'] / max(cow['wall_seconds'], 1e-9):.2f}"
    )

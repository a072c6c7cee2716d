"""Demo: the shuffle engine on one copy-on-write snapshot, against a local S3 server.

An ``orders`` table partitioned by region holds one data file per region. A
copy-on-write MERGE then updates some orders (some of them moving to another
region), deletes a few and adds new ones: every touched file is removed and
rewritten, so most rows of the snapshot's difference are carryover, and each
partition move is a DELETE in one region's file and an INSERT in another's.

Write tasks are planned per region, so a moved order's two halves land in
different tasks; the shuffle by ``id`` brings them together. The demo prints
what each phase did, the changes found and a few rows, and checks the replay
invariant: state(before) - removed + added == state(after).
"""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdc_devtools.local_s3 import LocalS3Server
from iceberg_cdc.changelog.merge import MergeStats, merge_changes
from iceberg_cdc.shuffle.coalesce import coalesce
from iceberg_cdc.shuffle.fetch import fetch_range
from iceberg_cdc.shuffle.partitioner import HashPartitioner
from iceberg_cdc.shuffle.reader import read_index
from iceberg_cdc.shuffle.rows import Op, shuffle_schema
from iceberg_cdc.shuffle.writer import MapOutputWriter
from iceberg_cdc.storage import open_store

REGIONS = ["us", "eu", "apac", "latam"]
ROWS = 200_000
PARTITIONS = 64


def orders_before(rng: np.random.Generator) -> pa.Table:
    return pa.table(
        {
            "id": np.arange(ROWS, dtype=np.int64),
            "region": pa.array(rng.choice(REGIONS, ROWS)),
            "customer": pa.array([f"c{n}" for n in rng.integers(0, 20_000, ROWS)]),
            "amount": pa.array(rng.integers(100, 100_000, ROWS).astype(np.int32)).cast(pa.decimal128(12, 2)),
            "status": pa.array(["paid"] * ROWS),
        }
    )


def merge_snapshot(before: pa.Table, rng: np.random.Generator) -> pa.Table:
    """The table after one MERGE: 5% updated (a fifth of those move region), 1% deleted, 1% new."""
    n = before.num_rows
    chosen = rng.permutation(n)
    updated, deleted = chosen[: n // 20], chosen[n // 20 : n // 20 + n // 100]
    moved = updated[: len(updated) // 5]
    status = np.array(before.column("status").to_pylist(), dtype=object)
    status[updated] = "shipped"
    region = np.array(before.column("region").to_pylist(), dtype=object)
    region[moved] = [REGIONS[(REGIONS.index(r) + 1) % len(REGIONS)] for r in region[moved]]
    after = before.set_column(1, "region", pa.array(region.tolist())).set_column(
        4, "status", pa.array(status.tolist())
    )
    keep = np.ones(n, dtype=bool)
    keep[deleted] = False
    new = orders_before(rng).slice(0, n // 100)
    new = new.set_column(0, "id", pa.array(np.arange(n, n + new.num_rows, dtype=np.int64)))
    return pa.concat_tables([after.filter(pa.array(keep)), new])


def by_region(table: pa.Table) -> dict[str, pa.Table]:
    """One data file per region partition."""
    return {r: table.filter(pc.equal(table.column("region"), r)) for r in REGIONS}


def main() -> None:
    rng = np.random.default_rng(2026)
    before = orders_before(rng)
    after = merge_snapshot(before, rng)
    removed_files, added_files = by_region(before), by_region(after)
    timings: dict[str, float] = {}

    with LocalS3Server() as s3:
        s3.client().create_bucket(Bucket="shuffle")
        store = open_store("s3://shuffle/demo/orders/snapshot-2", s3.properties)
        print(f"local S3 server on {s3.endpoint}; shuffle at {store.uri}\n")

        started = time.perf_counter()
        names, shuffle_bytes = [], 0
        for region in REGIONS:  # one SHUFFLE_WRITE task per rewritten partition
            name = f"map-{region}"
            with MapOutputWriter(store, name, before.schema, HashPartitioner(PARTITIONS, ["id"])) as writer:
                writer.write(removed_files[region], Op.DELETE)
                writer.write(added_files[region], Op.INSERT)
                stats = writer.commit()
            names.append(name)
            shuffle_bytes += stats.data_bytes
            print(
                f"  SHUFFLE_WRITE {name:10s} {stats.rows['DELETE']:>7,} DELETE + "
                f"{stats.rows['INSERT']:>7,} INSERT rows -> {stats.data_bytes / 1e6:.1f} MB"
            )
        timings["write"] = time.perf_counter() - started

        started = time.perf_counter()
        indexes = [read_index(store, name, PARTITIONS) for name in names]
        plan = coalesce(np.sum([ix.partition_sizes() for ix in indexes], axis=0), 1_000_000)
        timings["coalesce"] = time.perf_counter() - started
        print(
            f"\n  coalesce: {PARTITIONS} partitions, {shuffle_bytes / 1e6:.1f} MB -> "
            f"{len(plan.ranges)} read ranges of ~1 MB"
        )

        started = time.perf_counter()
        totals, changes = MergeStats(), []
        schema = shuffle_schema(before.schema)
        for r in plan.ranges:
            table = fetch_range(store, indexes, r.start, r.end, schema)
            out, stats = merge_changes(table, ["id"])
            totals.add(stats)
            changes.append(out)
        timings["read + merge"] = time.perf_counter() - started
        store.delete_prefix("")

    result = pa.concat_tables(changes)
    kinds = Counter(result.column("_change_type").to_pylist())
    print("\nsnapshot 2 (overwrite, copy-on-write MERGE)")
    print(f"  rows in removed/added files : {totals.input_rows:,}")
    print(f"  carryover removed           : {totals.carryover_rows:,} rows")
    for kind in ("INSERT", "DELETE", "UPDATE_BEFORE", "UPDATE_AFTER"):
        print(f"  {kind:28s}: {kinds.get(kind, 0):,}")
    moves = partition_moves(result)
    print(f"  updates that moved region   : {moves.num_rows // 2:,}")
    print("  seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in timings.items()))

    print("\na partition move (DELETE in one region's file, INSERT in another's, paired by id):")
    print(moves.slice(0, 2).to_pandas().to_string(index=False))
    print("\na few other changes:")
    kind = result.column("_change_type")
    sample = [result.filter(pc.equal(kind, k)).slice(0, 2) for k in ("INSERT", "DELETE")]
    print(pa.concat_tables(sample).to_pandas().to_string(index=False))

    check_replay(before, after, result)


def partition_moves(result: pa.Table) -> pa.Table:
    kinds = result.column("_change_type").to_numpy(zero_copy_only=False)
    regions = result.column("region").to_numpy(zero_copy_only=False)
    before_rows = np.flatnonzero(kinds == "UPDATE_BEFORE")
    moved = before_rows[regions[before_rows] != regions[before_rows + 1]]
    return result.take(pa.array(np.column_stack([moved, moved + 1]).ravel()))


def check_replay(before: pa.Table, after: pa.Table, changes: pa.Table) -> None:
    def rows(table: pa.Table) -> Counter:
        return Counter(
            map(tuple, zip(*[table.column(n).to_pylist() for n in before.schema.names], strict=True))
        )

    kind = changes.column("_change_type")
    removed = rows(changes.filter(pc.is_in(kind, pa.array(["DELETE", "UPDATE_BEFORE"]))))
    added = rows(changes.filter(pc.is_in(kind, pa.array(["INSERT", "UPDATE_AFTER"]))))
    replayed = rows(before)
    replayed.subtract(removed)
    replayed.update(added)
    ok = +replayed == rows(after) and not (removed & added)
    print(f"\nreplay invariant (before - removed + added == after): {'OK' if ok else 'FAILED'}")
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()

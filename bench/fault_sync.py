"""`make sync` through a faulty network: every run must succeed and the replay must be exact.

The issue's goal, measured as a user would run it: a local S3 server behind
:class:`~cdc_devtools.fault_proxy.FaultProxy` answering 10% of
requests with 500/503 and dropping 5% of connections (after forwarding, so
the outcome is unknown to the client); the catalog, the Airflow tasks and the
Spark executors all reach S3 only through the proxy. A table history of an
append and three copy-on-write MERGEs is built with the faults paused, then
``make sync``'s function runs one ``airflow dags test`` per snapshot and stops
at the first failed run. The result line::

    faults: make sync 4 runs, 0 failed; 1234 requests, 61 x 500, 60 x 503, 59 dropped; replay exact

is printed and written to ``bench/results/faults.txt``.

Usage: ``python bench/fault_sync.py [--error-rate 0.10] [--drop-rate 0.05] [--seed N]``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

import pyarrow as pa  # noqa: E402
import yaml  # noqa: E402
from pyiceberg.catalog import load_catalog  # noqa: E402

from cdc_devtools.cow import cow_merge  # noqa: E402
from cdc_devtools.fault_proxy import FaultProxy  # noqa: E402
from cdc_devtools.local_s3 import LocalS3Server  # noqa: E402
from cdc_devtools.orders import BY_REGION, SCHEMA, rows  # noqa: E402
from cdc_devtools.replay import assert_replay  # noqa: E402
from cdc_devtools.sync import sync  # noqa: E402
from iceberg_cdc.source.history import current_ancestry  # noqa: E402

WORK = REPO / ".cdc" / "fault-sync"
RESULT = REPO / "bench" / "results" / "faults.txt"


def build(catalog) -> list[int]:
    catalog.create_namespace("shop")
    source = catalog.create_table("shop.orders", schema=SCHEMA, partition_spec=BY_REGION)
    source.append(pa.concat_tables([rows(range(0, 3000), "us"), rows(range(3000, 5000), "eu")]))
    for round_ in range(3):
        moved = rows(range(round_ * 100, round_ * 100 + 100), "eu", f"moved-{round_}")
        updated = rows(range(3000 + round_ * 50, 3050 + round_ * 50), "eu", f"v{round_}")
        new = rows(range(10_000 + round_ * 10, 10_010 + round_ * 10), "us")
        deleted = range(4000 + round_ * 20, 4020 + round_ * 20)
        cow_merge(source, upserts=pa.concat_tables([moved, updated, new]), delete_keys=deleted)
    return [s.snapshot_id for s in current_ancestry(source)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--error-rate", type=float, default=0.10)
    parser.add_argument("--drop-rate", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    with LocalS3Server(log_path=WORK / "s3.log") as s3, FaultProxy(s3.endpoint, seed=args.seed) as proxy:
        client = s3.client()
        for bucket in ("cdc-faults-wh", "cdc-faults-shuffle"):
            client.create_bucket(Bucket=bucket)
        properties = proxy.properties(s3.properties)
        catalog_properties = {
            "type": "sql",
            "uri": f"sqlite:///{WORK / 'catalog.db'}",
            "warehouse": "s3://cdc-faults-wh/",
        }
        config = {
            "catalog": {"name": "faults", **catalog_properties, **properties},
            "shuffle": {
                "uri": "s3://cdc-faults-shuffle/cdc",
                "partitions": 8,
                "target_partition_size": "256KB",
            },
            "spark": {"parallel_jobs": 1},
            "tables": [{"source": "shop.orders", "sink": "shop.orders_changes"}],
        }
        config_path = WORK / "cdc.yaml"
        config_path.write_text(yaml.safe_dump(config))
        catalog = load_catalog("faults", **catalog_properties, **properties)
        with proxy.paused():
            snapshots = build(catalog)
        proxy.set_rates(error_rate=args.error_rate, drop_rate=args.drop_rate)
        started = time.perf_counter()
        code = sync(str(config_path), str(WORK / "airflow"))
        seconds = time.perf_counter() - started
        counts = proxy.counts.copy()
        with proxy.paused():
            source, sink = catalog.load_table("shop.orders"), catalog.load_table("shop.orders_changes")
            exact = True
            for snapshot in snapshots:
                try:
                    assert_replay(source, sink, snapshot, ["id"])
                except AssertionError as exc:
                    exact = False
                    print(f"replay of {snapshot}: {exc}", file=sys.stderr)
    line = (
        f"faults: make sync {len(snapshots)} snapshots, {'0 failed' if code == 0 else 'a run FAILED'} in "
        f"{seconds:.0f} s; {counts['requests']} S3 requests, {counts['error_500']} x 500, "
        f"{counts['error_503']} x 503, {counts['drop']} dropped "
        f"(rates {args.error_rate:.0%} errors, {args.drop_rate:.0%} drops, seed {args.seed}); "
        f"replay {'exact' if exact else 'NOT exact'}"
    )
    print(line)
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(line + "\n")
    return 0 if code == 0 and exact else 1


if __name__ == "__main__":
    sys.exit(main())

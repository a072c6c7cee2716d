"""Spark driver for one phase group: ``--phase write|read|insert --plan KEY --group N``.

The Spark application runs the group's units (write tasks, read ranges or
insert tasks) as Spark tasks, one unit each, so Spark's scheduler spreads
them over executors and retries a failed one. The driver only loads the plan
and collects small figures; executors read and write storage themselves.

When a write unit finally fails, the driver leaves a failure marker for each
of the group's unfinished tasks, so the barrier fails fast and names them.

The driver proves at start that its run still holds the table's lease (the
plan's epoch) and renews it from a heartbeat while the job runs; if another
run takes the table over meanwhile, the heartbeat cancels the job.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import traceback

from iceberg_cdc.config import load_config
from iceberg_cdc.coordination.heartbeat import LeaseHeartbeat
from iceberg_cdc.coordination.lease import TableLease
from iceberg_cdc.errors import LeaseLostError
from iceberg_cdc.pipeline.groups import PHASE_FUNCTIONS, record_group, units_of
from iceberg_cdc.pipeline.plan import SnapshotPlan
from iceberg_cdc.pipeline.runtime import runtime_from_config

log = logging.getLogger("iceberg_cdc.spark")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--phase", choices=["write", "read", "insert"], required=True)
    parser.add_argument("--plan", required=True, help="key of the snapshot plan in the shuffle store")
    parser.add_argument("--group", type=int, required=True)
    parser.add_argument("--label", default="", help="human label, shown in the Airflow UI")
    parser.add_argument("--config", default=None, help="config file (default: $CDC_CONFIG)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(sys.argv[1:] if argv is None else argv)
    config = load_config(args.config)
    runtime = runtime_from_config(config)
    store = runtime.store()
    plan = SnapshotPlan.load(store, args.plan)
    paths = plan.paths
    lease = TableLease(store, plan.source)
    try:
        lease.renew(plan.run_id, plan.epoch, plan.lease_ttl_seconds)
    except LeaseLostError as exc:
        log.error("%s", exc)
        return 1
    units = units_of(args.phase, plan, args.group, store)
    function = PHASE_FUNCTIONS[args.phase]

    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.appName(
            f"cdc {plan.source} snapshot {plan.snapshot_id} {args.phase} {args.group + 1}"
        )
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    started = time.perf_counter()
    log.info(
        "%s: %s (%d units) for %s snapshot %s",
        args.phase,
        args.label,
        len(units),
        plan.source,
        plan.snapshot_id,
    )
    heartbeat = LeaseHeartbeat(
        lease,
        plan.run_id,
        plan.epoch,
        plan.lease_ttl_seconds,
        on_lost=lambda _: spark.sparkContext.cancelAllJobs(),
    )
    try:
        with heartbeat:
            results = (
                spark.sparkContext.parallelize(units, max(1, len(units)))
                .map(lambda unit: function(plan, runtime, unit))
                .collect()
            )
        heartbeat.check()
    except Exception as exc:
        if args.phase == "write":
            reason = "".join(traceback.format_exception_only(type(exc), exc)).strip()[-4000:]
            for task_id in units:
                if not store.list(paths.written(task_id)):
                    store.put(
                        paths.failed(task_id), json.dumps({"task_id": task_id, "error": reason}).encode()
                    )
        log.error("%s group %d failed: %s", args.phase, args.group, exc)
        spark.stop()
        return 1
    seconds = round(time.perf_counter() - started, 3)
    record_group(store, plan, args.phase, args.group, seconds, results)
    for result in results:
        log.info("%s done: %s", args.phase, json.dumps(result, sort_keys=True)[:500])
    log.info("%s group %d: %d units in %.1f s", args.phase, args.group, len(units), seconds)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

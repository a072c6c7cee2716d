"""Spark driver for one phase group: ``--phase write|read|insert --plan KEY --group N``.

The Spark application runs the group's units (write tasks, read ranges or
insert tasks) as Spark tasks, one unit each, so Spark's scheduler spreads
them over executors and retries a failed one. The driver only loads the plan
and collects small figures; executors read and write storage themselves.

When a write unit finally fails, the driver leaves a failure marker for each
of the group's unfinished tasks, so the barrier fails fast and names them.

The driver proves at start that its run still holds the table's lease (the
plan's epoch) and renews it from a heartbeat while the job runs; if another
run takes the table over meanwhile, the heartbeat cancels the job. Those
steps are shared with the Spark Connect driver (:mod:`.connect_app`) in
:mod:`.phase_driver`; only how the units reach Spark differs.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from iceberg_cdc.config import load_config
from iceberg_cdc.pipeline import worker_heap
from iceberg_cdc.pipeline.groups import PHASE_FUNCTIONS, phase_names
from iceberg_cdc.pipeline.phase_driver import run_phase_group
from iceberg_cdc.pipeline.plan import SnapshotPlan
from iceberg_cdc.pipeline.runtime import ConnectionProperties, Runtime, runtime_from_config

log = logging.getLogger("iceberg_cdc.spark")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--phase", choices=phase_names(), required=True)
    parser.add_argument("--plan", required=True, help="key of the snapshot plan in the shuffle store")
    parser.add_argument("--group", type=int, required=True)
    parser.add_argument("--label", default="", help="human label, shown in the Airflow UI")
    parser.add_argument("--config", default=None, help="config file (default: $CDC_CONFIG)")
    return parser.parse_args(argv)


class RddUnitRunner:
    """The group's units as one RDD partition each, in this application's SparkContext."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark

    def map_units(self, phase: str, plan: SnapshotPlan, runtime: Runtime, units: list[Any]) -> list[Any]:
        function = PHASE_FUNCTIONS[phase]

        def run_unit(unit: Any) -> Any:
            worker_heap.keep_worker_memory()
            try:
                return function(plan, runtime, unit)
            finally:
                worker_heap.settle_worker_heap()  # by reference: its state lives in the worker's module

        return self.spark.sparkContext.parallelize(units, max(1, len(units))).map(run_unit).collect()

    def cancel(self) -> None:
        self.spark.sparkContext.cancelAllJobs()


def main(argv: list[str] | None = None, connections: ConnectionProperties | None = None) -> int:
    """Run one phase group; ``connections`` resolves connections the config names (the launcher's)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(sys.argv[1:] if argv is None else argv)
    config = load_config(args.config)
    runtime = runtime_from_config(config, connections)
    sessions: list[Any] = []

    def start_runner(plan: SnapshotPlan) -> RddUnitRunner:
        from pyspark.sql import SparkSession

        # A spark-submit driver is never a Spark Connect client, whatever a Connect session in the
        # Airflow worker that launched it left in the environment (pyspark sets
        # SPARK_CONNECT_MODE_ENABLED when it opens one).
        for name in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE"):
            os.environ.pop(name, None)

        spark = (
            SparkSession.builder.appName(
                f"cdc {plan.source} snapshot {plan.snapshot_id} {args.phase} {args.group + 1}"
            )
            .config("spark.ui.showConsoleProgress", "false")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("WARN")
        sessions.append(spark)
        return RddUnitRunner(spark)

    try:
        run_phase_group(runtime, args.plan, args.phase, args.group, start_runner, label=args.label)
    except Exception as exc:
        log.error("%s group %d failed: %s", args.phase, args.group, exc)
        return 1
    finally:
        for spark in sessions:
            spark.stop()
    return 0

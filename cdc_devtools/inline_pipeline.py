"""A whole pipeline in one process for tests and benches: SQLite catalog, file:// (or S3) warehouse and shuffle.

:class:`InlinePipeline` writes a real config, creates the source table and
runs snapshots through :mod:`cdc_devtools.inline_run` — the DAG's
steps and the Spark tasks' functions, without Airflow or Spark.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.table import Table

from cdc_devtools.inline_run import InlineRun, run_snapshot, run_until_caught_up
from iceberg_cdc.config import CdcConfig, parse_config
from iceberg_cdc.sink.table import read_watermark
from iceberg_cdc.watermark import Watermark

SOURCE = "shop.orders"
SINK = "shop.orders_changes"

# How carryover is cancelled before the shuffle (every path must give the same changes):
CANCEL_CONFIG: dict[str, dict[str, Any]] = {
    "in memory": {},  # a partition's removed and added files in one task, cancelled in memory
    "spilled": {"cancel_memory": "1KB"},  # past the budget: hash buckets on local disk
    "a task per partition": {"write_task_size": "1KB"},  # partitions above the task size stay whole
    "too big to group": {"write_task_size": "1KB", "cancel_partition_max_size": "1KB"},  # file by file
    "off": {"cancel_before_shuffle": False},  # every row through the shuffle
}
CANCEL_MODES = sorted(CANCEL_CONFIG)


class InlinePipeline:
    def __init__(
        self,
        tmp: Path,
        *,
        table: dict[str, Any] | None = None,
        shuffle: dict[str, Any] | None = None,
        catalog: dict[str, Any] | None = None,
    ) -> None:
        (tmp / "wh").mkdir(parents=True, exist_ok=True)
        self.raw: dict[str, Any] = {
            "catalog": {
                "name": "inline",
                "type": "sql",
                "uri": f"sqlite:///{tmp / 'catalog.db'}",
                "warehouse": f"file://{tmp / 'wh'}",
                **(catalog or {}),
            },
            "shuffle": {
                "uri": f"file://{tmp / 'shuffle'}",
                "partitions": 8,
                "target_partition_size": "16KB",
                **(shuffle or {}),
            },
            "spark": {"parallel_jobs": 2},
            "tables": [{"source": SOURCE, "sink": SINK, **(table or {})}],
        }
        self.config: CdcConfig = parse_config(self.raw)
        self.catalog: Catalog = load_catalog(
            "inline", **{k: v for k, v in self.raw["catalog"].items() if k != "name"}
        )
        self.catalog.create_namespace_if_not_exists("shop")

    def create_source(self, schema, **kwargs) -> Table:
        return self.catalog.create_table(SOURCE, schema=schema, **kwargs)

    @property
    def source(self) -> Table:
        return self.catalog.load_table(SOURCE)

    @property
    def sink(self) -> Table:
        return self.catalog.load_table(SINK)

    def watermark(self) -> Watermark | None:
        if not self.catalog.table_exists(SINK):
            return None
        return read_watermark(self.sink, SOURCE)

    def run(self, snapshot_id: int | None = None) -> InlineRun:
        return run_snapshot(self.config, SOURCE, snapshot_id=snapshot_id)

    def catch_up(self) -> list[InlineRun]:
        return run_until_caught_up(self.config, SOURCE)

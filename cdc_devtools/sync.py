"""``make sync CONFIG=...``: run each table's DAG until its sink has caught up.

One ``airflow dags test`` per pending snapshot. Progress is checked against
the sink's watermark after every run, so a run that fails -- or succeeds
without moving the watermark -- stops the sync with a non-zero exit instead
of looping. With nothing pending it runs no DAG and changes nothing.

With ``spark.mode: connect`` the runs use the Spark Connect server the config
(``spark.connect_url``) or the environment (``AIRFLOW_CONN_SPARK_CONNECT_DEFAULT``)
names when it answers; otherwise a local one is started for the sync, and
stopped at its end. Only when something is pending.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

from cdc_devtools.airflow_env import airflow_env, dags_test, ensure_airflow_db
from cdc_devtools.connect_server import connect_server_for
from iceberg_cdc.config import CdcConfig, TableConfig, load_config
from iceberg_cdc.errors import CdcError
from iceberg_cdc.pipeline.runtime import load_catalog_from_config
from iceberg_cdc.sink.table import read_watermark
from iceberg_cdc.source.history import next_snapshot


def table_status(config: CdcConfig, table: TableConfig) -> tuple[int | None, int]:
    """(watermark snapshot id, number of snapshots still pending)."""
    catalog = load_catalog_from_config(config)
    source = catalog.load_table(table.source)
    mark = None
    if catalog.table_exists(table.sink):
        mark = read_watermark(catalog.load_table(table.sink), table.source)
    pending = next_snapshot(source, mark, table.start)
    return (mark.snapshot_id if mark else None), (0 if pending is None else pending.remaining + 1)


def sync(config_path: str, home: str, *, quiet: bool = False) -> int:
    config = load_config(config_path)
    env = airflow_env(home, config_path)
    ensure_airflow_db(env)
    logs = Path(home) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as spark:
        spark_ready = False
        for table in config.tables:
            if not spark_ready and table_status(config, table)[1]:
                # Spark Connect mode: a server for the runs (started here if none answers).
                spark.enter_context(connect_server_for(config, env, Path(home) / "spark-connect"))
                spark_ready = True
            if not sync_table(config, table, env, logs):
                return 1
    return 0


def sync_table(config: CdcConfig, table: TableConfig, env: dict[str, str], logs: Path) -> bool:
    """One DAG run per pending snapshot of ``table``; False when a run failed or did not progress."""
    runs = 0
    while True:
        mark, pending = table_status(config, table)
        if pending == 0:
            print(f"{table.source}: caught up (watermark {mark}); {runs} run(s)", flush=True)
            return True
        log_path = logs / f"{table.dag_id}-{int(time.time() * 1000)}.log"
        print(
            f"{table.source}: {pending} snapshot(s) pending after {mark}; running {table.dag_id} ...",
            flush=True,
        )
        started = time.perf_counter()
        with open(log_path, "w") as log_file:
            code = dags_test(env, table.dag_id, {"trigger_next": False}, log_file)
        runs += 1
        new_mark, _ = table_status(config, table)
        if code != 0 or new_mark == mark:
            print(
                f"{table.source}: the DAG run failed (exit {code}, watermark {mark} -> {new_mark}); "
                f"see {log_path}",
                file=sys.stderr,
            )
            return False
        print(f"  done in {time.perf_counter() - started:.0f} s: watermark {mark} -> {new_mark}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True)
    parser.add_argument("--home", default=".cdc/airflow", help="Airflow home for the local runs")
    args = parser.parse_args(argv)
    try:
        return sync(args.config, args.home)
    except CdcError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""``make sync CONFIG=...``: run each table's DAG until its sink has caught up, then its mirrors' DAGs.

One ``airflow dags test`` per pending snapshot. Progress is checked against
the sink's watermark after every run, so a run that fails -- or succeeds
without moving the watermark -- stops the sync with a non-zero exit instead
of looping. With nothing pending it runs no DAG and changes nothing.
``--snapshots N`` (``make sync SNAPSHOTS=N``) stops each table after N runs,
to step through a history: exit 0, with the number still pending printed.

With ``spark.mode: connect`` the runs use the Spark Connect server the config
(``spark.connect_url``) or the environment (``AIRFLOW_CONN_SPARK_CONNECT_DEFAULT``)
names when it answers; otherwise a local one is started for the sync, and
stopped at its end. Only when something is pending.

After a table's changelog has caught up, each of its mirrors whose watermark
is behind the changelog's gets one run of its DAG (``cdc_mirror__...``), which
applies everything pending at once; the mirror's watermark must then equal the
changelog's, or the sync fails. A mirror already caught up gets no run.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

from cdc_devtools.airflow_env import airflow_env, dags_test, ensure_airflow_db
from cdc_devtools.connect_server import connect_server_for
from iceberg_cdc.config import CdcConfig, MirrorConfig, TableConfig, load_config
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


def sync(config_path: str, home: str, *, quiet: bool = False, snapshots: int | None = None) -> int:
    """Every table caught up (or ``snapshots`` runs each), then its mirrors: 0, or 1 when a run failed."""
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
            if not sync_table(config, table, env, logs, limit=snapshots):
                return 1
            for mirror in table.mirrors:
                if not sync_mirror(config, table, mirror, env, logs):
                    return 1
    return 0


def mirror_status(config: CdcConfig, table: TableConfig, mirror: MirrorConfig) -> tuple[object, object]:
    """(the mirror's watermark, the changelog's state), as ChangelogMarks (None when there is none)."""
    from iceberg_cdc.airflow.hooks import mirror_postgres  # noqa: F401  (conn_id -> DSN, Postgres provider)
    from iceberg_cdc.mirror.changelog import changelog_mark
    from iceberg_cdc.mirror.targets import read_mirror_mark
    from iceberg_cdc.run.context import Context

    ctx = Context.of(config, table.source)
    catalog = load_catalog_from_config(config)
    changelog = (
        changelog_mark(catalog.load_table(table.sink), table.source)
        if catalog.table_exists(table.sink)
        else None
    )
    return read_mirror_mark(ctx, mirror), changelog


def sync_mirror(
    config: CdcConfig, table: TableConfig, mirror: MirrorConfig, env: dict[str, str], logs: Path
) -> bool:
    """One run of the mirror's DAG when it is behind the changelog; False when it failed or did not catch up."""
    dag_id = table.mirror_dag_id(mirror)
    mark, changelog = mirror_status(config, table, mirror)
    if changelog is None or mark == changelog:
        print(f"  {mirror.describe()}: caught up ({_at(mark)})", flush=True)
        return True
    log_path = logs / f"{dag_id}-{int(time.time() * 1000)}.log"
    print(
        f"  {mirror.describe()}: at {_at(mark)}, changelog at {_at(changelog)}; running {dag_id} ...",
        flush=True,
    )
    started = time.perf_counter()
    with open(log_path, "w") as log_file:
        code = dags_test(env, dag_id, None, log_file)
    new_mark, changelog = mirror_status(config, table, mirror)
    if code != 0 or new_mark != changelog:
        print(
            f"  {mirror.describe()}: the mirror run failed (exit {code}; at {_at(new_mark)}, changelog at "
            f"{_at(changelog)}); see {log_path}",
            file=sys.stderr,
        )
        return False
    print(
        f"  done in {time.perf_counter() - started:.0f} s: {mirror.describe()} at {_at(new_mark)}", flush=True
    )
    return True


def _at(mark) -> str:
    return "nothing applied" if mark is None else f"source snapshot {mark.source_snapshot_id}"


def sync_table(
    config: CdcConfig, table: TableConfig, env: dict[str, str], logs: Path, *, limit: int | None = None
) -> bool:
    """One DAG run per pending snapshot of ``table`` (at most ``limit``); False when a run failed or did not
    progress."""
    runs = 0
    while True:
        mark, pending = table_status(config, table)
        if pending == 0:
            print(f"{table.source}: caught up (watermark {mark}); {runs} run(s)", flush=True)
            return True
        if limit is not None and runs >= limit:
            print(
                f"{table.source}: stopped after {runs} run(s) as asked (--snapshots {limit}); "
                f"{pending} snapshot(s) still pending after watermark {mark}",
                flush=True,
            )
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
    parser.add_argument(
        "--snapshots",
        type=_positive,
        help="stop each table after this many DAG runs (snapshots), leaving the rest pending",
    )
    args = parser.parse_args(argv)
    try:
        return sync(args.config, args.home, snapshots=args.snapshots)
    except CdcError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of snapshots, 1 or more")
    return value


if __name__ == "__main__":
    sys.exit(main())

"""Event-driven runs: each table's DAG runs when its source gets a new snapshot, the clock as fallback.

The source table is an Airflow Asset (``cdc-source:<source>``) with an
``AssetWatcher`` whose trigger polls the catalog
(:class:`~iceberg_cdc.airflow.triggers.catalog_snapshots.CatalogSnapshotTrigger`,
one poll per catalog, or the Iceberg provider's ``IcebergTableSnapshotTrigger``
with ``events.trigger: provider``). The DAG's schedule is
``AssetOrTimeSchedule``: a run starts on the asset's event *or* on the
table's ``schedule`` (the clock catches anything an event missed: a triggerer
down, a poll error). ``schedule: null`` leaves the event alone; ``events:
{enabled: false}`` the clock alone (the behaviour before events).

Runs started by an event are ordinary runs (``asset_triggered``): they take
the oldest pending snapshot and chain while more are pending; of the runs
events start while the table is busy at most one queues for it, the others
end at once, taking no lease (``run/queue.py``; one chain per table:
``run/detect.py``); an event for a snapshot already processed
starts a run that finds nothing pending and ends at once. Backfills and manual runs keep their own rules (``run/kinds.py``).
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any

from airflow.sdk import AssetWatcher

from iceberg_cdc.airflow.assets import HashOnceAsset
from iceberg_cdc.airflow.compat import AssetOrTimeSchedule, CronTriggerTimetable
from iceberg_cdc.airflow.triggers.catalog_snapshots import CatalogSnapshotTrigger, digest_of, watched_tables
from iceberg_cdc.config import CONFIG_ENV, CdcConfig, TableConfig, catalog_key

log = logging.getLogger("iceberg_cdc")

CAPACITY_HEADROOM = 0.9  # of a triggerer's capacity the watchers may take before the DAG file warns

_PRESETS = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}


def source_asset_name(table: TableConfig) -> str:
    return f"cdc-source:{table.source}"


def watcher_trigger(config: CdcConfig, table: TableConfig, config_path: str) -> Any:
    """The trigger that fires on the source's new snapshots (``events.trigger``)."""
    events = config.events
    if events.trigger == "provider":
        from airflow.providers.apache.iceberg.triggers.iceberg import IcebergTableSnapshotTrigger

        return IcebergTableSnapshotTrigger(
            table=table.source, iceberg_conn_id=events.iceberg_conn_id, poll_interval=events.poll_interval
        )
    return CatalogSnapshotTrigger(
        config_path=config_path,
        table=table.source,
        catalog_key=catalog_key(config.catalog),
        watched_digest=_watched_digest(config),
        poll_interval=events.poll_interval,
    )


_DIGESTS: list[tuple[Any, str]] = []  # (a config's table list, its digest): one config per DAG file parse


def _watched_digest(config: CdcConfig) -> str:
    """The watched tables' digest, computed once per config rather than once per table (N^2 at parse)."""
    for tables, digest in _DIGESTS:
        if tables is config.tables:
            return digest
    digest = digest_of(watched_tables(config))
    _DIGESTS[:] = [(config.tables, digest)]
    return digest


def source_asset(config: CdcConfig, table: TableConfig, config_path: str | None) -> HashOnceAsset:
    """The source table as an Asset, watched for new snapshots when events are on and a config path is known."""
    watchers = []
    if config.events.enabled and config_path:
        watchers.append(
            AssetWatcher(
                name=f"cdc_source_{table.source.replace('.', '__')}",
                trigger=watcher_trigger(config, table, config_path),
            )
        )
    return HashOnceAsset(
        name=source_asset_name(table),
        uri=f"iceberg://{config.catalog.name}/{table.source.replace('.', '/')}",
        group="cdc",
        watchers=watchers,
    )


def schedule_for(config: CdcConfig, table: TableConfig, config_path: str | None = None) -> Any:
    """The DAG's ``schedule``: the source's events or the table's clock (either alone when the other is off)."""
    config_path = config_path or os.environ.get(CONFIG_ENV)
    if not config.events.enabled:
        return table.schedule
    if not config_path:
        log.warning(
            "%s: no config file path (%s) to hand the event trigger; the table runs on its clock only",
            table.source,
            CONFIG_ENV,
        )
        return table.schedule
    asset = source_asset(config, table, str(config_path))
    if table.schedule is None:
        return [asset]
    cron = _PRESETS.get(table.schedule, table.schedule)
    return AssetOrTimeSchedule(timetable=CronTriggerTimetable(cron, timezone="UTC"), assets=[asset])


def triggerer_capacity() -> int:
    """``[triggerer] capacity``: the most triggers one triggerer runs (Airflow's default: 1,000)."""
    from airflow.configuration import conf

    return conf.getint("triggerer", "capacity", fallback=1000)


def capacity_warning(config: CdcConfig, capacity: int) -> str | None:
    """What to say when the config's source watchers (one trigger per table) fill 90% of a triggerer.

    A triggerer assigns itself at most ``capacity`` triggers; past that, the
    watchers left over fire no events and their tables run on their clock
    only (or not at all with ``schedule: null``) -- nothing else says so.
    The 10% headroom is for other triggers (deferred tasks) on the same triggerer.
    """
    if not config.events.enabled:
        return None
    watchers = len(config.tables)
    if watchers < CAPACITY_HEADROOM * capacity:
        return None
    enough = math.floor(watchers / CAPACITY_HEADROOM) + 1
    triggerers = math.floor(watchers / (CAPACITY_HEADROOM * capacity)) + 1
    return (
        f"{watchers} tables' event watchers are {watchers} triggers, and one triggerer runs at most "
        f"{capacity} ([triggerer] capacity): tables past it get no events. Set AIRFLOW__TRIGGERER__CAPACITY "
        f"to at least {enough} (the watchers share one catalog poll, so they cost little) or run "
        f"{triggerers} triggerers"
    )

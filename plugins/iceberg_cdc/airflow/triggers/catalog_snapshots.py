"""The event trigger behind each table's AssetWatcher: fires when ``main`` of the source gets a new snapshot.

One trigger per configured table (its source table's Asset watches it), but
**one poll per catalog**: every trigger of a catalog returns the same
:meth:`shared_stream_key`, so Airflow's triggerer (3.3+) runs a single
:meth:`open_shared_stream` loop for all of them and hands each trigger the
same raw events -- the watched tables' metadata locations, fetched with one
catalog call per poll for SQL and Glue catalogs
(:class:`~iceberg_cdc.source.catalog_poll.CatalogPoller`).
Each trigger then looks at its own table (:meth:`filter_shared_stream`): when
the metadata location moved, it reads that one metadata file and fires only
if ``main`` points at a snapshot it has not reported -- so commits that only
touch properties or refs (the pipeline's own ``protect_pending`` tags) start
nothing.

Why not the Iceberg provider's ``IcebergTableSnapshotTrigger`` by default: it
needs the catalog as an Airflow connection (this pipeline's catalog is its
YAML config) and loads the whole table (catalog call + metadata read) per
table per poll, with no sharing. It is used instead with ``events.trigger:
provider`` (:func:`iceberg_cdc.airflow.events.source_asset`).

**Duplicates and replays are harmless by design.** The last reported
snapshot is kept in the asset's state store, so a triggerer restart does
not fire again for it -- unless a sink of the table has not processed it:
Airflow drops events for a paused DAG and runs no watcher for it, so the
trigger that restarts when the table is unpaused fires once more for the
current snapshot if a sink is behind it, and the table catches up without
waiting for the next commit or the clock. Where no state is kept (first
start, an older Airflow), the first poll fires once for the current snapshot. Any event only
starts a DAG run, and a run with nothing pending ends at once, committing
nothing.

Kwargs hold no secrets: the trigger reads the catalog's settings from the
pipeline's config file (``config_path``, as the DAG files do), in the triggerer.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Hashable
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from iceberg_cdc.airflow import compat

log = logging.getLogger("iceberg_cdc")

STATE_KEY = "cdc_last_snapshot"
REPORT_EVERY_SECONDS = 60.0  # how often the shared poll logs what it cost


class CatalogSnapshotTrigger(BaseEventTrigger):
    """Fire ``{"table", "snapshot_id", "metadata_location"}`` on each new snapshot of ``main`` of ``table``.

    :param config_path: the pipeline's YAML config (its ``catalog:`` is what is polled)
    :param table: the source table this trigger reports on (``namespace.table``)
    :param catalog_key: :func:`~iceberg_cdc.config.catalog_key` of the config's catalog
    :param watched_digest: :func:`watched_digest` of every source table the config watches (one poll
        serves them all; the poll reads the list itself from ``config_path``)
    :param poll_interval: seconds between polls
    :param watched: the list itself, as triggers stored before ``watched_digest`` carry it

    The list of tables is not in the kwargs: they are part of every DAG's
    schedule (one trigger per table), so a list of N tables made each DAG's
    parse, hash and stored form grow with N -- N^2 for the whole config.
    """

    def __init__(
        self,
        *,
        config_path: str,
        table: str,
        catalog_key: str,
        watched_digest: str | None = None,
        poll_interval: float = 10.0,
        watched: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.config_path = config_path
        self.table = table
        self.catalog_key = catalog_key
        self.watched = sorted(watched) if watched is not None else None
        self.watched_digest = watched_digest or (digest_of(self.watched) if self.watched is not None else "")
        self.poll_interval = float(poll_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        kwargs: dict[str, Any] = {
            "config_path": self.config_path,
            "table": self.table,
            "catalog_key": self.catalog_key,
            "watched_digest": self.watched_digest,
            "poll_interval": self.poll_interval,
        }
        if self.watched is not None:
            kwargs["watched"] = self.watched
        return f"{type(self).__module__}.{type(self).__qualname__}", kwargs

    def shared_stream_key(self) -> Hashable | None:
        """Equal for every table of one catalog in one config: the triggerer polls them once.

        The digest of the watched tables is part of it: a config that gains
        or loses a table starts a new poll, of the new list.
        """
        return (
            "iceberg_cdc.catalog_snapshots",
            self.catalog_key,
            self.config_path,
            self.watched_digest,
            self.poll_interval,
        )

    @classmethod
    async def open_shared_stream(cls, kwargs: dict[str, Any]) -> AsyncIterator[Any]:
        """Poll the catalog forever: one raw event per poll, ``{"locations": {table: location}}``."""
        poller = await asyncio.to_thread(
            _poller, kwargs["config_path"], kwargs.get("watched"), kwargs.get("watched_digest")
        )
        interval = float(kwargs["poll_interval"])
        polls, started = 0, time.monotonic()
        while True:
            try:
                locations = await asyncio.to_thread(poller.locations)
            except (
                Exception
            ) as exc:  # a catalog blip: the next poll tries again; the clock stays the fallback
                log.warning(
                    "catalog poll failed (%s: %s); polling again in %.0f s", type(exc).__name__, exc, interval
                )
                await asyncio.sleep(interval)
                continue
            polls += 1
            yield {"locations": locations, "polled_at": time.time(), "calls": poller.calls}
            elapsed = time.monotonic() - started
            if elapsed >= REPORT_EVERY_SECONDS:
                log.info(
                    "catalog poll %s (%s): %d calls in %.0f s for %d table(s): %.1f calls per minute per table",
                    kwargs["catalog_key"],
                    poller.kind,
                    poller.calls,
                    elapsed,
                    len(poller.tables),
                    poller.calls * 60 / elapsed / max(1, len(poller.tables)),
                )
                poller.calls, polls, started = 0, 0, time.monotonic()
            await asyncio.sleep(interval)

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        """This table's new snapshots in the shared stream: a location change, then ``main``'s snapshot."""
        store = await self._state_store()
        last_snapshot = await self._load(store)
        last_location: str | None = None
        file_io_for = None
        first_look = True
        async for raw in shared_stream:
            location = raw["locations"].get(self.table)
            if location is None or location == last_location:
                continue
            if file_io_for is None:
                file_io_for = await asyncio.to_thread(_file_io_for, self.config_path)
            try:
                snapshot_id = await asyncio.to_thread(_main_snapshot_id, file_io_for, location)
            except Exception as exc:  # unreadable right now: look again at the next poll
                log.warning(
                    "%s: metadata %s not readable (%s: %s)", self.table, location, type(exc).__name__, exc
                )
                continue
            last_location = location
            # Reported before this trigger (re)started -- but an event that reached a paused DAG
            # was dropped by Airflow, so the cursor alone would leave an unpaused table waiting
            # for the next commit or the clock. Fire once more if a sink is behind it.
            if (
                first_look
                and snapshot_id is not None
                and snapshot_id == last_snapshot
                and await asyncio.to_thread(_sinks_behind, self.config_path, self.table, snapshot_id)
            ):
                last_snapshot = None
            first_look = False
            if snapshot_id is None or snapshot_id == last_snapshot:
                continue
            previous, last_snapshot = last_snapshot, snapshot_id
            if store is not None:
                await asyncio.to_thread(store.set, STATE_KEY, str(snapshot_id))
            yield TriggerEvent(
                {
                    "table": self.table,
                    # 64-bit ids travel as strings (asset extras reach browsers)
                    "snapshot_id": str(snapshot_id),
                    "previous_snapshot_id": None if previous is None else str(previous),
                    "metadata_location": location,
                }
            )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Without a shared stream (an Airflow that does not share): this trigger's own poll loop."""
        if not compat.has_shared_trigger_streams():
            compat.note_degraded(
                "shared trigger streams",
                compat.SHARED_TRIGGER_STREAMS_SINCE,
                "each table's event trigger polls the catalog on its own (one poll per table, not per catalog)",
            )
        async for event in self.filter_shared_stream(type(self).open_shared_stream(self.serialize()[1])):
            yield event

    async def _state_store(self) -> Any:
        store = getattr(self, "asset_state_store", None)
        if store is None:
            if not compat.has_asset_state_store():
                compat.note_degraded(
                    "asset state store for triggers",
                    compat.ASSET_STATE_STORE_SINCE,
                    "the last reported snapshot is not kept, so a triggerer restart fires once more for the "
                    "current snapshot (that run finds nothing pending and ends at once)",
                )
            return None
        try:
            await asyncio.to_thread(store.get, STATE_KEY)
        except ValueError:  # watched by several assets: no single place for the cursor
            log.warning("%s: watched by several assets; a triggerer restart may fire once more", self.table)
            return None
        return store

    async def _load(self, store: Any) -> int | None:
        if store is None:
            return None
        value = await asyncio.to_thread(store.get, STATE_KEY)
        try:
            return int(value) if value is not None else None
        except (TypeError, ValueError):
            return None


def watched_tables(config: Any) -> list[str]:
    """Every source table a config watches, sorted: what one shared poll fetches."""
    return sorted({t.source for t in config.tables})


def digest_of(tables: list[str]) -> str:
    """A short digest of a sorted table list: equal lists share a poll, a changed list starts another."""
    return hashlib.sha256("\x00".join(tables).encode()).hexdigest()[:16]


def _poller(config_path: str, watched: list[str] | None, digest: str | None):
    from iceberg_cdc.config import load_config
    from iceberg_cdc.pipeline.runtime import load_catalog_from_config
    from iceberg_cdc.source.catalog_poll import CatalogPoller

    config = load_config(config_path)
    if watched is None:
        watched = watched_tables(config)
        if digest and digest_of(watched) != digest:
            log.warning(
                "%s changed since its DAGs were parsed: polling the %d tables it lists now; the DAG "
                "processor's next parse starts triggers for the new list",
                config_path,
                len(watched),
            )
    return CatalogPoller(load_catalog_from_config(config), list(watched))


_FILE_IOS: dict[tuple[str, float], Any] = {}
_FILE_IOS_LOCK = threading.Lock()


def _file_io_for(config_path: str):
    """The config's file IO, loaded once per config file version for every trigger of this triggerer.

    Each trigger asks for it at its first event; loading a config of N tables
    once per trigger was N^2 work in the triggerer (1,000 tables: minutes of
    CPU before the first event of any table got through).
    """
    from iceberg_cdc.config import load_config
    from iceberg_cdc.pipeline.runtime import runtime_from_config

    key = (config_path, os.stat(config_path).st_mtime)
    with _FILE_IOS_LOCK:
        if key not in _FILE_IOS:
            _FILE_IOS.clear()
            _FILE_IOS[key] = runtime_from_config(load_config(config_path)).file_io
        return _FILE_IOS[key]


def _sinks_behind(config_path: str, source: str, snapshot_id: int) -> bool:
    """Whether any sink of ``source`` has not processed ``snapshot_id`` (False when it cannot be told)."""
    from iceberg_cdc.config import load_config
    from iceberg_cdc.pipeline.runtime import load_catalog_from_config
    from iceberg_cdc.sink.table import read_watermark

    try:
        config = load_config(config_path)
        catalog = load_catalog_from_config(config)
        for table in config.tables:
            if table.source != source:
                continue
            if not catalog.table_exists(table.sink):
                return True
            mark = read_watermark(catalog.load_table(table.sink), source)
            if mark is None or mark.snapshot_id != snapshot_id:
                return True
    except Exception as exc:  # the clock and the next commit stay the fallback
        log.warning("%s: could not read its sinks' watermarks (%s: %s)", source, type(exc).__name__, exc)
    return False


def _main_snapshot_id(file_io_for, location: str) -> int | None:
    from iceberg_cdc.source.catalog_poll import main_snapshot_id

    return main_snapshot_id(file_io_for, location)

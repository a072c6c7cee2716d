"""The event trigger: one catalog call per poll for all tables, fires once per new snapshot of main, nothing else.

Driven in process against a real SQLite catalog and file warehouse (the
triggerer's own loop runs it end to end in tests/integration/test_event_runs.py).
"""

from __future__ import annotations

import asyncio

import pytest
import yaml

from cdc_devtools.orders import SCHEMA, rows
from iceberg_cdc.airflow.compat import AssetOrTimeSchedule
from iceberg_cdc.airflow.dag_factory import build_dags
from iceberg_cdc.airflow.triggers.catalog_snapshots import CatalogSnapshotTrigger, digest_of, watched_tables
from iceberg_cdc.config import parse_config
from iceberg_cdc.pipeline.runtime import load_catalog_from_config
from iceberg_cdc.sink.table import ensure_sink_table, watermark_properties
from iceberg_cdc.source.catalog_poll import CatalogPoller, catalog_key
from iceberg_cdc.source.protection import sync_tags
from iceberg_cdc.watermark import Watermark
from tests.support.airflow_versions import serialized_dag


@pytest.fixture
def setup(tmp_path):
    (tmp_path / "wh").mkdir()
    raw = {
        "catalog": {
            "name": "events",
            "type": "sql",
            "uri": f"sqlite:///{tmp_path / 'catalog.db'}",
            "warehouse": f"file://{tmp_path / 'wh'}",
        },
        "shuffle": {"uri": f"file://{tmp_path / 'shuffle'}"},
        "tables": [
            {"source": "shop.orders", "sink": "shop.orders_changes"},
            {"source": "shop.items", "sink": "shop.items_changes", "schedule": None},
        ],
        "events": {"poll_interval": "1s"},
    }
    path = tmp_path / "cdc.yaml"
    path.write_text(yaml.safe_dump(raw))
    config = parse_config(raw)
    catalog = load_catalog_from_config(config)
    catalog.create_namespace("shop")
    return config, str(path), catalog


class FakeStore:
    """The asset state store's get/set, as the triggerer hands it to a watcher's trigger."""

    def __init__(self) -> None:
        self.values: dict[str, object] = {}

    def get(self, key, default=None):
        return self.values.get(key, default)

    def set(self, key, value) -> None:
        self.values[key] = value


def _trigger(config, path, table, store=None) -> CatalogSnapshotTrigger:
    trigger = CatalogSnapshotTrigger(
        config_path=path,
        table=table,
        catalog_key=catalog_key(config.catalog),
        watched_digest=digest_of(watched_tables(config)),
        poll_interval=1,
    )
    trigger.asset_state_store = store
    return trigger


async def _events(trigger, raws):
    async def stream():
        for raw in raws:
            yield raw

    return [event.payload async for event in trigger.filter_shared_stream(stream())]


def test_one_sql_query_per_poll_covers_every_table(setup):
    _, _, catalog = setup
    orders = catalog.create_table("shop.orders", schema=SCHEMA)
    poller = CatalogPoller(catalog, ["shop.orders", "shop.items", "shop.missing"])
    assert poller.kind == "sql"
    found = poller.locations()
    assert found == {"shop.orders": orders.metadata_location, "shop.items": None, "shop.missing": None}
    assert poller.calls == 1
    catalog.create_table("shop.items", schema=SCHEMA)
    orders.append(rows(range(3)))
    again = poller.locations()
    assert again["shop.orders"] == catalog.load_table("shop.orders").metadata_location != found["shop.orders"]
    assert again["shop.items"] is not None and poller.calls == 2


def test_fires_once_per_new_main_snapshot_and_not_for_ref_only_commits(setup):
    config, path, catalog = setup
    orders = catalog.create_table("shop.orders", schema=SCHEMA)
    poller = CatalogPoller(catalog, ["shop.orders"])
    empty = poller.locations()  # a table without snapshots: nothing to report
    orders.append(rows(range(3)))
    first = poller.locations()
    same = poller.locations()
    sync_tags(orders, "shop.orders_changes", [orders.current_snapshot().snapshot_id])  # a tag: a new location
    tagged = poller.locations()
    assert tagged["shop.orders"] != first["shop.orders"]
    orders.append(rows(range(3, 6)))
    second = poller.locations()

    store = FakeStore()
    trigger = _trigger(config, path, "shop.orders", store)
    raws = [{"locations": x} for x in (empty, first, same, tagged, second, second)]
    events = asyncio.run(_events(trigger, raws))
    snapshots = [s.snapshot_id for s in catalog.load_table("shop.orders").snapshots()]
    assert [e["snapshot_id"] for e in events] == [str(s) for s in snapshots]
    assert events[1]["previous_snapshot_id"] == events[0]["snapshot_id"]
    assert store.values["cdc_last_snapshot"] == str(snapshots[-1])

    # After a (re)start the first poll sees the current table again. A sink behind it (here: none yet)
    # may have missed the event -- Airflow drops events for a paused DAG -- so it fires once more.
    restarted = _trigger(config, path, "shop.orders", store)
    assert [e["snapshot_id"] for e in asyncio.run(_events(restarted, raws[-2:]))] == [str(snapshots[-1])]
    # Once the sink has processed it, the stored cursor keeps a restart quiet.
    sink = ensure_sink_table(catalog, "shop.orders_changes", SCHEMA)
    mark = Watermark(str(orders.metadata.table_uuid), snapshots[-1], len(snapshots))
    with sink.transaction() as tx:
        tx.set_properties(watermark_properties("shop.orders", mark))
    restarted = _trigger(config, path, "shop.orders", store)
    assert asyncio.run(_events(restarted, raws[-2:])) == []
    # Behind again (the sink's watermark is older): the restarted trigger fires once, not per poll.
    with sink.transaction() as tx:
        tx.set_properties(watermark_properties("shop.orders", Watermark(mark.source_uuid, snapshots[0], 1)))
    restarted = _trigger(config, path, "shop.orders", store)
    assert [e["snapshot_id"] for e in asyncio.run(_events(restarted, raws[-2:] * 2))] == [str(snapshots[-1])]
    # Without a state store the first poll fires once for the current snapshot (a harmless idle run).
    fresh = _trigger(config, path, "shop.orders")
    assert [e["snapshot_id"] for e in asyncio.run(_events(fresh, raws[-2:]))] == [str(snapshots[-1])]


def test_every_table_of_a_catalog_shares_one_poll(setup):
    config, path, _ = setup
    keys = {_trigger(config, path, t.source).shared_stream_key() for t in config.tables}
    assert len(keys) == 1 and None not in keys
    other = parse_config({**config.model_dump(), "catalog": {**config.catalog.model_dump(), "name": "other"}})
    assert _trigger(other, path, "shop.orders").shared_stream_key() not in keys
    # A table more in the config: another poll, of the new list (the list itself is not in the kwargs)
    more = parse_config(
        {
            **config.model_dump(),
            "tables": [*config.model_dump()["tables"], {"source": "shop.x", "sink": "shop.x_changes"}],
        }
    )
    assert _trigger(more, path, "shop.orders").shared_stream_key() not in keys
    assert "watched" not in _trigger(config, path, "shop.orders").serialize()[1]


def test_a_trigger_stored_with_its_table_list_still_polls_that_list(setup):
    """Triggers serialized before the digest carry ``watched``: they keep polling exactly those tables."""
    config, path, _ = setup
    old = CatalogSnapshotTrigger(
        config_path=path,
        table="shop.orders",
        catalog_key=catalog_key(config.catalog),
        watched=["shop.orders"],
    )
    _, kwargs = old.serialize()
    assert kwargs["watched"] == ["shop.orders"] and kwargs["watched_digest"] == digest_of(["shop.orders"])

    async def one_poll():
        stream = CatalogSnapshotTrigger.open_shared_stream(kwargs)
        out = await anext(stream)
        await stream.aclose()
        return out

    assert set(asyncio.run(one_poll())["locations"]) == {"shop.orders"}


def test_the_shared_stream_polls_the_catalog(setup):
    config, path, catalog = setup
    catalog.create_table("shop.orders", schema=SCHEMA).append(rows(range(2)))
    _, kwargs = _trigger(config, path, "shop.orders").serialize()

    async def two_polls():
        stream = CatalogSnapshotTrigger.open_shared_stream(kwargs)
        out = [await anext(stream), await anext(stream)]
        await stream.aclose()
        return out

    first, second = asyncio.run(two_polls())
    assert first["locations"]["shop.orders"] == catalog.load_table("shop.orders").metadata_location
    assert second["calls"] == 2  # one catalog call per poll, for both tables


def test_dags_run_on_the_sources_events_or_the_clock(setup):
    config, path, _ = setup
    dags = build_dags(config, path)
    orders, items = dags["cdc__shop__orders"], dags["cdc__shop__items"]
    assert isinstance(orders.timetable, AssetOrTimeSchedule)
    (asset,) = (
        orders.timetable.asset_condition.objects
        if hasattr(orders.timetable.asset_condition, "objects")
        else (orders.timetable.asset_condition,)
    )
    assert asset.name == "cdc-source:shop.orders"
    (watcher,) = asset.watchers
    assert isinstance(watcher.trigger, CatalogSnapshotTrigger) and watcher.trigger.table == "shop.orders"
    assert not isinstance(items.timetable, AssetOrTimeSchedule)  # schedule: null -> the event alone
    for dag in dags.values():
        serialized_dag(dag)  # what the DAG processor stores: trigger kwargs included

    clock_only = build_dags(parse_config({**config.model_dump(), "events": {"enabled": False}}), path)
    assert clock_only["cdc__shop__orders"].schedule == "@hourly"
    provider = build_dags(parse_config({**config.model_dump(), "events": {"trigger": "provider"}}), path)
    timetable = provider["cdc__shop__orders"].timetable
    condition = timetable.asset_condition
    (asset,) = condition.objects if hasattr(condition, "objects") else (condition,)
    assert type(asset.watchers[0].trigger).__name__ == "IcebergTableSnapshotTrigger"

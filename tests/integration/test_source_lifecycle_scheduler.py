"""A paused table survives the nightly expiry, under the real scheduler, on the same sink.

Airflow's API server, scheduler, DAG processor and triggerer on 127.0.0.1
(:class:`~cdc_devtools.scheduler.LocalAirflow`, LocalExecutor), moto S3, a
SQLite catalog; the tiny snapshots run in the task processes
(``spark.in_process_below``). Two tables, processed, then paused; five commits
to each while paused; then ``expire_snapshots().older_than(now)`` on both,
as a nightly job would, and both unpaused:

* ``shop.orders`` has ``protect_pending: true``: the never-paused
  ``cdc_freshness`` DAG's protect task tagged its five snapshots within a
  minute of their commits, the expiry kept them, and each is committed on its
  own, replay exact; after catch-up only its base tag is left;
* ``shop.items`` has the defaults: its five snapshots expired (its base, the
  watermark's snapshot, held by the base tag), and the changelog goes on with
  one bridge commit; an Iceberg mirror follows it and verifies equal.

Both changelogs replay, from nothing, to their source's current rows.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
import yaml

from cdc_devtools.cow import cow_merge
from cdc_devtools.orders import BY_REGION, SCHEMA, rows
from cdc_devtools.replay import assert_changelog_replays, assert_replay
from cdc_devtools.scheduler import LocalAirflow
from iceberg_cdc.airflow.freshness_dag import FRESHNESS_DAG_ID
from iceberg_cdc.config import mirror_dag_id_for
from iceberg_cdc.sink.summary import CommitSummary
from iceberg_cdc.sink.table import read_watermark
from iceberg_cdc.source.protection import BASE_TAG_PREFIX, TAG_PREFIX, own_tags
from tests.support.airflow_pipeline import AirflowPipeline

pytestmark = [pytest.mark.s3, pytest.mark.e2e]

TIMEOUT = 420.0
ORDERS, ITEMS = "shop.orders", "shop.items"
DAGS = {ORDERS: "cdc__shop__orders", ITEMS: "cdc__shop__items"}
SINKS = {ORDERS: "shop.orders_changes", ITEMS: "shop.items_changes"}
MIRROR = "shop.items_mirror"
MIRROR_DAG = mirror_dag_id_for(ITEMS, MIRROR.replace(".", "__"))


@pytest.fixture(scope="module")
def pipeline(moto_server, tmp_path_factory) -> AirflowPipeline:
    pipeline = AirflowPipeline(
        tmp_path_factory.mktemp("lifecycle"),
        moto_server,
        SCHEMA,
        partition_spec=BY_REGION,
        spark={"in_process_below": "64MB"},
    )
    pipeline.catalog.create_table(ITEMS, schema=SCHEMA, partition_spec=BY_REGION)
    pipeline.config["tables"] = [
        {"source": ORDERS, "sink": SINKS[ORDERS], "schedule": "@yearly", "protect_pending": True},
        {
            "source": ITEMS,
            "sink": SINKS[ITEMS],
            "schedule": "@yearly",
            "mirrors": [{"type": "iceberg", "table": MIRROR, "verify": False}],
        },
    ]
    pipeline.config["events"] = {"poll_interval": "2s"}
    pipeline.config_path.write_text(yaml.safe_dump(pipeline.config))
    pipeline.env["CDC_TASK_RETRIES"] = "0"
    return pipeline


@pytest.fixture(scope="module")
def airflow(pipeline: AirflowPipeline, tmp_path_factory):
    with LocalAirflow(
        pipeline.env, tmp_path_factory.mktemp("airflow"), parallelism=2, triggerer=True
    ) as local:
        for dag in (*DAGS.values(), MIRROR_DAG, FRESHNESS_DAG_ID):
            local.wait_for_dag(dag)
        yield local


def table(pipeline: AirflowPipeline, name: str):
    return pipeline.catalog.load_table(name)


def caught_up(pipeline: AirflowPipeline, airflow: LocalAirflow, source: str) -> int:
    """Until the sink's watermark is the source's current snapshot and the DAG has no run left going."""
    target = table(pipeline, source).current_snapshot().snapshot_id
    deadline = time.monotonic() + TIMEOUT
    while True:
        airflow.check_running()
        sink = SINKS[source]
        mark = read_watermark(table(pipeline, sink), source) if pipeline.catalog.table_exists(sink) else None
        if mark is not None and mark.snapshot_id == target:
            break
        failed = [r for r in airflow.runs(DAGS[source]) if r["state"] == "failed"]
        assert not failed, f"failed runs of {source}: {failed}"
        assert time.monotonic() < deadline, f"{source} not caught up with {target} in {TIMEOUT:.0f} s"
        time.sleep(1)
    airflow.wait_until_idle(DAGS[source], timeout=TIMEOUT)
    return target


def commits(pipeline: AirflowPipeline, source: str) -> list[CommitSummary]:
    sink = table(pipeline, SINKS[source])
    found = [CommitSummary.from_summary(s.summary.additional_properties) for s in sink.snapshots()]
    return [c for c in found if c.source_snapshot_id is not None]


def five_commits(pipeline: AirflowPipeline, source: str) -> list[int]:
    made = []
    for step in range(5):
        t = table(pipeline, source)
        made.append(
            cow_merge(
                t,
                upserts=rows([step, 100 + step], "eu" if step % 2 else "us", f"v{step}"),
                delete_keys=[20 + step],
            )
        )
    return made


def test_a_paused_table_survives_the_nightly_expiry_on_the_same_sink(pipeline, airflow):
    for source in DAGS:
        table(pipeline, source).append(rows(range(0, 40), "us"))
    airflow.unpause(MIRROR_DAG)
    for dag in DAGS.values():
        airflow.unpause(dag)
    for source in DAGS:
        caught_up(pipeline, airflow, source)
    for dag in DAGS.values():
        airflow.set_paused(dag, True)

    paused = {source: five_commits(pipeline, source) for source in DAGS}
    # The cdc_freshness DAG (never paused, every minute) tags what is pending of the protected table.
    deadline = time.monotonic() + 180
    while set(paused[ORDERS]) - set(pending_tags(pipeline).values()):
        assert time.monotonic() < deadline, (
            f"the pending snapshots were not tagged: {own_tags(table(pipeline, ORDERS), SINKS[ORDERS])}"
        )
        time.sleep(2)
    for source in DAGS:
        table(pipeline, source).maintenance.expire_snapshots().older_than(
            datetime.now(UTC) + timedelta(seconds=1)
        ).commit()
    assert all(table(pipeline, ORDERS).metadata.snapshot_by_id(s) for s in paused[ORDERS]), "tags kept them"
    assert not any(table(pipeline, ITEMS).metadata.snapshot_by_id(s) for s in paused[ITEMS][:-1]), "expired"

    # Unpausing is all it takes: Airflow dropped the events of the commits made while the DAGs were
    # paused, and the clock is yearly here; the watcher that restarts with the DAG fires once more
    # because the sink is behind the source (triggers/catalog_snapshots.py).
    for dag in DAGS.values():
        airflow.unpause(dag)
    for source in DAGS:
        caught_up(pipeline, airflow, source)

    # Protected: each snapshot on its own, exactly; only the base tag left.
    orders = table(pipeline, ORDERS)
    committed = [c.source_snapshot_id for c in commits(pipeline, ORDERS)]
    assert [s for s in committed if s in paused[ORDERS]] == paused[ORDERS]
    for snapshot_id in paused[ORDERS]:
        assert_replay(orders, table(pipeline, SINKS[ORDERS]), snapshot_id, ["id"])
    assert not pending_tags(pipeline) and list(own_tags(orders, SINKS[ORDERS])) == [
        f"{BASE_TAG_PREFIX}{SINKS[ORDERS]}-{paused[ORDERS][-1]}"
    ]
    # Unprotected: one bridge commit from the watermark's snapshot to the current one.
    items = commits(pipeline, ITEMS)
    [bridge] = [c for c in items if c.bridge is not None]
    assert bridge.source_snapshot_id == paused[ITEMS][-1] and bridge.bridge.reason == "expired"
    assert bridge.bridge.from_snapshot_id == items[0].source_snapshot_id, "from the processed snapshot"
    assert_replay(
        table(pipeline, ITEMS), table(pipeline, SINKS[ITEMS]), paused[ITEMS][-1], ["id"],
        base_snapshot_id=bridge.bridge.from_snapshot_id,
    )  # fmt: skip
    for source in DAGS:
        assert assert_changelog_replays(table(pipeline, source), table(pipeline, SINKS[source])) >= 2

    # The mirror follows the bridge like any changelog snapshot.
    airflow.wait_until_idle(MIRROR_DAG, timeout=TIMEOUT)
    from iceberg_cdc.mirror.verify.cli import main as verify

    assert verify(["--config", str(pipeline.config_path), "--table", ITEMS, "--no-repair"]) == 0


def pending_tags(pipeline: AirflowPipeline) -> dict[str, int]:
    return {
        name: sid
        for name, sid in own_tags(table(pipeline, ORDERS), SINKS[ORDERS]).items()
        if name.startswith(TAG_PREFIX)
    }

"""The retention guard end to end, in process: pyiceberg's own expiry against a pipeline with a backlog.

With ``protect_pending`` on, ``table.maintenance.expire_snapshots().older_than(<now>)``
-- which removes every snapshot that heads no ref -- leaves the watermark's
and every pending snapshot in place, and the pipeline then catches up with
every snapshot replaying exactly. With it off (and without the base tag), the
same expiry takes even the watermark's snapshot: detect warned beforehand (the
run's story says which snapshot may go and how to avoid it), and the changelog
goes on with one bridge from its own replay. Tags follow the
watermark, an idle run writes nothing to the source, and tables that leave
the config (or turn protection off) lose their tags.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from cdc_devtools.inline_pipeline import SINK, SOURCE, InlinePipeline
from cdc_devtools.inline_run import run_snapshot
from cdc_devtools.orders import SCHEMA, rows
from cdc_devtools.replay import assert_changelog_replays, assert_replay
from iceberg_cdc.config import parse_config
from iceberg_cdc.run.story import story
from iceberg_cdc.source.protection import base_tag_name, own_tags, recorded, tag_name
from iceberg_cdc.source.retention import MAX_SNAPSHOT_AGE_PROPERTY


def _expire_everything_unprotected(pipeline: InlinePipeline) -> set[int]:
    """pyiceberg's own expiry, as a maintenance job would run it; returns the snapshot ids it removed."""
    table = pipeline.source
    before = {s.snapshot_id for s in table.snapshots()}
    table.maintenance.expire_snapshots().older_than(datetime.now(UTC) + timedelta(seconds=1)).commit()
    return before - {s.snapshot_id for s in pipeline.source.snapshots()}


def _backlog(pipeline: InlinePipeline) -> list[int]:
    """s1 processed; s2..s5 written; s2 processed: the watermark at s2, s3..s5 pending."""
    source = pipeline.create_source(SCHEMA)
    source.append(rows(range(0, 10)))
    pipeline.catch_up()
    for start in (10, 20, 30):
        source.append(rows(range(start, start + 10)))
    source.delete("id < 5")  # a snapshot with deletes: goes through the shuffle
    pipeline.run()
    return [s.snapshot_id for s in pipeline.source.snapshots()]


def test_protection_keeps_every_needed_snapshot_through_pyicebergs_expiry(tmp_path):
    pipeline = InlinePipeline(tmp_path, table={"protect_pending": True})
    ids = _backlog(pipeline)
    first, mark, *pending = ids
    assert pipeline.watermark().snapshot_id == mark
    # the last run's watermark step moved the tags past what it committed: mark and everything after it
    assert set(own_tags(pipeline.source, SINK).values()) == set(ids[1:])

    removed = _expire_everything_unprotected(pipeline)
    assert removed == {first}, f"expiry removed snapshots the sink needs: {removed - {first}}"

    runs = pipeline.catch_up()
    assert [r.snapshot_id for r in runs] == pending
    for snapshot_id in pending:
        assert_replay(pipeline.source, pipeline.sink, snapshot_id, ["id"])
    # the watermark steps move the tags as they commit: detect finds nothing to move
    assert (
        runs[0].detected.protection["removed"] == [] and first not in own_tags(pipeline.source, SINK).values()
    )
    assert runs[0].detected.retention_warning is None

    # Caught up: only the watermark's snapshot (the head) stays tagged; the rest may now expire.
    idle = run_snapshot(pipeline.config, SOURCE)
    assert idle.action == "caught_up"
    assert set(own_tags(pipeline.source, SINK).values()) == {ids[-1]}
    assert _expire_everything_unprotected(pipeline) == set(ids[1:-1])  # first went at the first expiry


def test_an_idle_run_writes_nothing_to_the_source(tmp_path):
    pipeline = InlinePipeline(tmp_path, table={"protect_pending": True})
    pipeline.create_source(SCHEMA).append(rows(range(3)))
    pipeline.catch_up()
    run_snapshot(pipeline.config, SOURCE)  # moves the tags to the caught-up state
    location = pipeline.source.metadata_location
    idle = run_snapshot(pipeline.config, SOURCE)
    assert idle.action == "caught_up" and idle.detected.protection["committed"] is False
    assert pipeline.source.metadata_location == location


def test_without_protection_detect_warns_first_and_after_expiry_bridges_from_the_changelog(tmp_path):
    pipeline = InlinePipeline(tmp_path, table={"retention_warning": "1h", "protect_base": False})
    source = pipeline.create_source(SCHEMA, properties={MAX_SNAPSHOT_AGE_PROPERTY: str(30 * 60 * 1000)})
    source.append(rows(range(0, 10)))
    pipeline.catch_up()
    mark = pipeline.watermark().snapshot_id
    for start in (10, 20):
        source.append(rows(range(start, start + 10)))

    # The next run (it processes one snapshot) says the watermark's snapshot may go within the hour.
    warned = pipeline.run()
    warning = warned.detected.retention_warning
    assert f"the watermark's snapshot {mark} may be expired in" in warning
    assert "protect_pending: true" in warning
    assert "WARNING: the watermark's snapshot" in story(warned.detected, warned.committed)
    left = warned.detected.retention["seconds_left"]
    assert 0 < left <= 30 * 60
    assert not own_tags(pipeline.source, SINK)

    assert _expire_everything_unprotected(pipeline)
    # Nothing held the watermark's snapshot: the changelog's own replay is the bridge's base.
    bridged = pipeline.run()
    assert bridged.detected.bridge["base"] == "changelog replay"
    assert bridged.snapshot_id == pipeline.source.current_snapshot().snapshot_id
    assert assert_changelog_replays(pipeline.source, pipeline.sink) == 3


def test_tags_go_when_protection_is_turned_off_or_the_table_leaves_the_config(tmp_path):
    pipeline = InlinePipeline(tmp_path, table={"protect_pending": True})
    source = pipeline.create_source(SCHEMA)
    source.append(rows(range(3)))
    source.append(rows(range(3, 6)))
    pipeline.run()
    assert own_tags(pipeline.source, SINK)
    store = pipeline.config  # the registry lives in the shuffle store
    from iceberg_cdc.pipeline.runtime import runtime_from_config

    registry = runtime_from_config(store).store()
    assert [(p.source, p.sink) for p in recorded(registry)] == [(SOURCE, SINK)]

    # Another table of the same config sweeps the tags of a table that left it.
    other = pipeline.catalog.create_table("shop.other", schema=SCHEMA)
    other.append(rows(range(2)))
    raw = {**pipeline.raw, "tables": [{"source": "shop.other", "sink": "shop.other_changes"}]}
    run_snapshot(parse_config(raw), "shop.other")
    assert not own_tags(pipeline.source, SINK)
    assert [(p.source, p.sink) for p in recorded(registry)] == [
        ("shop.other", "shop.other_changes")
    ]  # its base

    # protect_pending turned off: the table's own next run keeps only the base (protect_base, the default).
    pipeline.run()
    assert own_tags(pipeline.source, SINK)
    base_only = {**pipeline.raw, "tables": [{"source": SOURCE, "sink": SINK, "protect_pending": False}]}
    run_snapshot(parse_config(base_only), SOURCE)
    assert list(own_tags(pipeline.source, SINK)) == [base_tag_name(SINK, pipeline.watermark().snapshot_id)]
    # Both off: its next run removes every tag, and the pipeline no longer writes the source.
    off = {**base_only, "tables": [{**base_only["tables"][0], "protect_base": False}]}
    run_snapshot(parse_config(off), SOURCE)
    assert not own_tags(pipeline.source, SINK)
    assert tag_name(SINK, 1) == f"cdc-pending-{SINK}-1" and base_tag_name(SINK, 1) == f"cdc-base-{SINK}-1"


def test_the_release_command_removes_one_tables_tags_and_its_record(tmp_path):
    import yaml

    from iceberg_cdc.pipeline.runtime import runtime_from_config
    from iceberg_cdc.run.protection_cli import main

    pipeline = InlinePipeline(tmp_path, table={"protect_pending": True})
    source = pipeline.create_source(SCHEMA)
    source.append(rows(range(3)))
    source.append(rows(range(3, 6)))
    pipeline.run()
    assert own_tags(pipeline.source, SINK)
    path = tmp_path / "cdc.yaml"
    path.write_text(yaml.safe_dump(pipeline.raw))
    assert main(["release", "--config", str(path), "--source", SOURCE, "--sink", SINK]) == 0
    assert not own_tags(pipeline.source, SINK)
    assert recorded(runtime_from_config(pipeline.config).store()) == []


def test_snapshots_committed_while_paused_are_protected_from_first_sight(tmp_path):
    """The every-minute check tags what is pending with no run active; catch-up leaves only the base tag."""
    from cdc_devtools.replay import assert_changelog_replays
    from iceberg_cdc.airflow.freshness_dag import build_freshness_dag
    from iceberg_cdc.run import steps
    from iceberg_cdc.run.retention_guard import protect

    pipeline = InlinePipeline(tmp_path, table={"protect_pending": True})
    source = pipeline.create_source(SCHEMA)
    source.append(rows(range(0, 10)))
    pipeline.catch_up()
    base = pipeline.watermark().snapshot_id
    assert list(own_tags(pipeline.source, SINK)) == [base_tag_name(SINK, base)], "caught up: the base only"
    paused = []
    for start in (10, 20, 30):  # the table's DAG is paused: no run sees these
        pipeline.source.append(rows(range(start, start + 5)))
        paused.append(pipeline.source.current_snapshot().snapshot_id)
    dag = build_freshness_dag(pipeline.config)
    assert dag is not None and "protect__cdc__shop__orders" in dag.task_ids
    change = protect(steps.Context.of(pipeline.config, SOURCE))
    assert {int(s) for s in change["added"]} == set(paused)  # and the next one a base tag too

    assert _expire_everything_unprotected(pipeline) == set(), "every pending snapshot survived the expiry"
    runs = [pipeline.run() for _ in paused]  # no idle run after them: the committing runs clean up
    assert [r.snapshot_id for r in runs] == paused and not any(r.detected.bridge for r in runs)
    for snapshot_id in paused:
        assert_replay(pipeline.source, pipeline.sink, snapshot_id, ["id"])
    assert assert_changelog_replays(pipeline.source, pipeline.sink) == 4
    assert list(own_tags(pipeline.source, SINK)) == [base_tag_name(SINK, paused[-1])], "no pending tag left"
    assert pipeline.run().action == "caught_up"

"""Gaps in the source's history are bridged on the same sink: expiry while nothing ran, rollbacks.

A real SQLite catalog and file warehouse, the DAG's steps and the Spark
tasks' functions in process (:mod:`cdc_devtools.inline_pipeline`). Each test
makes a gap after the sink's watermark, catches up, and checks the bridge's
own replay (``state(base) - removed + added == state(target)``), the whole
changelog's replay against the source's current rows, the commit's
``cdc.bridge.*`` marks, and that per-snapshot commits resume after it; an
Iceberg mirror applies each bridge like any changelog snapshot and verifies
equal to the source.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.schema import Schema

from cdc_devtools.cow import cow_merge
from cdc_devtools.inline_mirror import run_mirror
from cdc_devtools.inline_pipeline import SOURCE, InlinePipeline
from cdc_devtools.orders import BY_REGION, SCHEMA, rows
from cdc_devtools.replay import assert_changelog_replays, assert_replay, changes_of
from iceberg_cdc.errors import SourceHistoryError
from iceberg_cdc.mirror.steps import mirror_lease
from iceberg_cdc.mirror.verify.check import verify_mirror
from iceberg_cdc.run import bridge as bridge_planning
from iceberg_cdc.run.context import Context
from iceberg_cdc.run.story import story
from iceberg_cdc.sink.summary import CommitSummary
from iceberg_cdc.source.protection import own_tags

SINK = "shop.orders_changes"


def expire_all(table) -> None:
    """What a nightly ``expire_snapshots`` that ran late does: everything no ref holds goes."""
    table.maintenance.expire_snapshots().older_than(datetime.now(UTC) + timedelta(seconds=1)).commit()


def bridge_commit(pipeline: InlinePipeline, snapshot_id: int) -> CommitSummary:
    sink = pipeline.sink
    for snapshot in sink.snapshots():
        record = CommitSummary.from_summary(snapshot.summary.additional_properties)
        if record.source_snapshot_id == snapshot_id and record.bridge is not None:
            return record
    raise AssertionError(f"no bridge commit for {snapshot_id}")


MIRROR = {"type": "iceberg", "table": "shop.orders_mirror", "name": "ice", "verify": False}


def assert_mirror_follows(pipeline: InlinePipeline) -> None:
    """The Iceberg mirror applies the changelog, bridges too, and verifies equal to the source."""
    run_mirror(pipeline.config, SOURCE, MIRROR["name"])
    ctx = Context.of(pipeline.config, SOURCE)
    mirror = ctx.table.mirror(MIRROR["name"])
    with mirror_lease(ctx, mirror).hold("t", 60) as held:
        result = verify_mirror(ctx, mirror, repair=False, run_id="t", epoch=held.epoch)
    assert result.status == "equal", result


@pytest.fixture
def pipeline(tmp_path) -> InlinePipeline:
    pipeline = InlinePipeline(tmp_path, table={"mirrors": [MIRROR]})
    pipeline.create_source(SCHEMA, partition_spec=BY_REGION).append(
        pa.concat_tables([rows(range(0, 30), "us"), rows(range(30, 50), "eu")])
    )
    assert [r.action for r in pipeline.catch_up()] == ["insert"]
    assert_mirror_follows(pipeline)
    return pipeline


def test_snapshots_expired_while_nothing_ran_are_bridged_on_the_same_sink(pipeline):
    source = pipeline.source
    base = pipeline.watermark()
    assert set(own_tags(source, SINK).values()) == {base.snapshot_id}, "the base is held by a tag"
    cow_merge(source, upserts=rows(range(0, 5), "eu", "moved"), delete_keys=[40])  # updates, moves, a delete
    cow_merge(source, upserts=rows([100, 101], "us"), delete_keys=[])
    last = cow_merge(source, upserts=rows([1], "eu", "again"), delete_keys=[45])
    expire_all(source)
    source = pipeline.source
    assert source.metadata.snapshot_by_id(base.snapshot_id) is not None, "the base tag kept it"

    runs = pipeline.catch_up()
    assert [r.action for r in runs] == ["shuffle"], "one bridge commit, then caught up"
    bridge = runs[0]
    assert bridge.snapshot_id == last and bridge.detected.bridge["reason"] == "expired"
    assert bridge.detected.bridge["from"] == str(base.snapshot_id)
    assert bridge.committed["bridge"] == {
        "reason": "expired",
        "from": str(base.snapshot_id),
        "to": str(last),
        "common_ancestor": None,
        "base": "snapshot",
    }
    assert story(bridge.detected, bridge.committed).startswith(
        f"snapshot {last} (bridge from {base.snapshot_id} over expired snapshots, #2)"
    )
    counts = assert_replay(source, pipeline.sink, last, ["id"], base_snapshot_id=base.snapshot_id)
    assert counts == {"UPDATE_BEFORE": 5, "UPDATE_AFTER": 5, "DELETE": 2, "INSERT": 2}
    record = bridge_commit(pipeline, last)
    assert record.bridge.reason == "expired" and record.bridge.from_snapshot_id == base.snapshot_id
    assert record.change_ordinal == base.ordinal + 1
    assert pipeline.watermark().snapshot_id == last
    # The CDC view shows the commit as a bridge, in its page and its JSON.
    from iceberg_cdc.ui.page import PageModel, render_page
    from iceberg_cdc.ui.status import collect_status

    [status] = collect_status(pipeline.config)
    shown = status.to_dict()["recent"][0]
    assert shown["operation"] == "bridge" and shown["bridge"]["from"] == str(base.snapshot_id)
    page = render_page(PageModel(generated_at=datetime.now(UTC), statuses=[status]))
    assert f"bridge from {base.snapshot_id} over expired snapshots" in page and 'data-field="bridge"' in page
    assert set(own_tags(pipeline.source, SINK).values()) == {last}, "the base moved on; the old one is free"

    # Per-snapshot commits resume after the bridge.
    after = cow_merge(pipeline.source, upserts=rows([2], "us", "later"), delete_keys=[])
    runs = pipeline.catch_up()
    assert [r.snapshot_id for r in runs] == [after] and not runs[0].detected.bridge
    assert assert_replay(pipeline.source, pipeline.sink, after, ["id"]) == {
        "UPDATE_BEFORE": 1,
        "UPDATE_AFTER": 1,
    }
    assert assert_changelog_replays(pipeline.source, pipeline.sink) == 3
    assert set(own_tags(pipeline.source, SINK).values()) == {after}, "one base tag left when caught up"
    assert_mirror_follows(pipeline)


def test_a_rollback_after_processing_is_bridged_back_to_the_current_line(pipeline):
    first = pipeline.watermark().snapshot_id
    rolled = cow_merge(pipeline.source, upserts=rows(range(0, 3), "us", "rolled-back"), delete_keys=[31])
    assert [r.snapshot_id for r in pipeline.catch_up()] == [rolled]
    pipeline.source.manage_snapshots().rollback_to_snapshot(first).commit()
    new = cow_merge(pipeline.source, upserts=rows([7], "eu", "new"), delete_keys=[])

    runs = pipeline.catch_up()
    assert [r.snapshot_id for r in runs] == [new]
    bridge = runs[0].detected.bridge
    assert bridge["reason"] == "rolled back" and bridge["from"] == str(rolled)
    assert bridge["common_ancestor"] == str(first)
    # From the rolled-back state to the new one: the rolled-back changes undone, the new one applied.
    counts = assert_replay(pipeline.source, pipeline.sink, new, ["id"], base_snapshot_id=rolled)
    assert counts == {"UPDATE_BEFORE": 4, "UPDATE_AFTER": 4, "INSERT": 1}
    assert assert_changelog_replays(pipeline.source, pipeline.sink) == 3
    assert bridge_commit(pipeline, new).bridge.common_ancestor == first
    assert_mirror_follows(pipeline)


def test_a_rollback_with_nothing_after_it_waits_for_mains_next_snapshot(pipeline):
    first = pipeline.watermark().snapshot_id
    undone = cow_merge(pipeline.source, upserts=rows([3], "us", "undone"), delete_keys=[])
    pipeline.catch_up()
    pipeline.source.manage_snapshots().rollback_to_snapshot(first).commit()
    waiting = pipeline.run()
    assert waiting.action == "caught_up" and pipeline.watermark().snapshot_id == undone
    assert any("waits for main's next snapshot" in w for w in waiting.detected.warnings)
    assert "waits for main's next snapshot" in story(waiting.detected)

    new = cow_merge(pipeline.source, upserts=rows([4], "us", "newer"), delete_keys=[])
    assert [r.snapshot_id for r in pipeline.catch_up()] == [new]
    counts = assert_replay(pipeline.source, pipeline.sink, new, ["id"], base_snapshot_id=undone)
    assert counts == {"UPDATE_BEFORE": 2, "UPDATE_AFTER": 2}  # 3 back to its old row, 4 updated
    assert assert_changelog_replays(pipeline.source, pipeline.sink) == 3


def test_on_history_gap_fail_names_the_gap_and_commits_nothing(tmp_path):
    pipeline = InlinePipeline(tmp_path, table={"on_history_gap": "fail"})
    pipeline.create_source(SCHEMA, partition_spec=BY_REGION).append(rows(range(10), "us"))
    pipeline.catch_up()
    base = pipeline.watermark()
    cow_merge(pipeline.source, upserts=rows([1], "us", "x"), delete_keys=[])
    last = cow_merge(pipeline.source, upserts=rows([2], "us", "y"), delete_keys=[])
    expire_all(pipeline.source)
    with pytest.raises(SourceHistoryError) as failed:
        pipeline.run()
    message = str(failed.value)
    assert f"between the sink's last processed snapshot {base.snapshot_id} and snapshot {last}" in message
    assert "on_history_gap: bridge" in message
    assert pipeline.watermark() == base


def test_a_bridge_above_bridge_max_rows_stops_with_its_size(tmp_path):
    pipeline = InlinePipeline(tmp_path, table={"bridge_max_rows": 5})
    pipeline.create_source(SCHEMA, partition_spec=BY_REGION).append(rows(range(10), "us"))
    pipeline.catch_up()
    base = pipeline.watermark()
    cow_merge(pipeline.source, upserts=rows([1], "us", "x"), delete_keys=[])
    cow_merge(pipeline.source, upserts=rows([2], "us", "y"), delete_keys=[])
    expire_all(pipeline.source)
    with pytest.raises(
        SourceHistoryError, match=r"would read 20 rows, above tables\[\]\.bridge_max_rows \(5\)"
    ):
        pipeline.run()
    assert pipeline.watermark() == base


def test_without_protect_base_on_history_gap_fail_says_how_to_avoid_it(tmp_path):
    pipeline = InlinePipeline(tmp_path, table={"protect_base": False, "on_history_gap": "fail"})
    pipeline.create_source(SCHEMA, partition_spec=BY_REGION).append(rows(range(10), "us"))
    pipeline.catch_up()
    assert not own_tags(pipeline.source, SINK), "the pipeline never writes the source"
    cow_merge(pipeline.source, upserts=rows([1], "us", "x"), delete_keys=[])
    cow_merge(pipeline.source, upserts=rows([2], "us", "y"), delete_keys=[])
    expire_all(pipeline.source)
    with pytest.raises(SourceHistoryError, match="protect_base on"):
        pipeline.run()


def staged_left(pipeline: InlinePipeline) -> list[str]:
    root = Path(pipeline.sink.location().removeprefix("file://")) / "data" / "_staged"
    return sorted(p.name for p in root.rglob("bridge-base-*.parquet")) if root.exists() else []


def change_counts(pipeline: InlinePipeline, snapshot_id: int) -> Counter:
    """The commit's change types (its base state is gone from the source: the whole replay judges it)."""
    return Counter(changes_of(pipeline.sink, snapshot_id).column("_change_type").to_pylist())


def test_when_the_base_snapshot_expired_too_the_bridge_starts_from_the_changelogs_replay(
    tmp_path, monkeypatch, caplog
):
    """A sink configured before the base tag: its watermark's snapshot expired with the rest."""
    monkeypatch.setattr(bridge_planning, "BASE_FILE_ROWS", 16)  # 49 live rows: 4 staged files, 4 inputs
    pipeline = InlinePipeline(tmp_path, table={"protect_base": False, "mirrors": [MIRROR]})
    source = pipeline.create_source(SCHEMA, partition_spec=BY_REGION)
    source.append(pa.concat_tables([rows(range(0, 30), "us"), rows(range(30, 50), "eu")]))
    cow_merge(source, upserts=rows([3, 31], "eu", "seen"), delete_keys=[7])  # in the changelog
    pipeline.catch_up()
    assert_mirror_follows(pipeline)
    base = pipeline.watermark()
    cow_merge(source, upserts=rows(range(0, 5), "eu", "moved"), delete_keys=[40])
    cow_merge(source, upserts=rows([100, 3], "us", "back"), delete_keys=[31])
    last = cow_merge(source, upserts=rows([1], "eu", "again"), delete_keys=[45])
    expire_all(source)
    assert source.metadata.snapshot_by_id(base.snapshot_id) is None, "nothing holds the base"

    runs = pipeline.catch_up()
    assert [r.snapshot_id for r in runs] == [last] and runs[0].detected.bridge["base"] == "changelog replay"
    record = bridge_commit(pipeline, last)
    assert record.bridge.base == "changelog replay" and record.bridge.from_snapshot_id == base.snapshot_id
    assert "from the changelog's replay" in story(runs[0].detected)
    assert "staged as 4 file(s)" in caplog.text, "each 16 rows of the base are one write task's input"
    counts = change_counts(pipeline, last)
    # 0-4 moved (3 again), 1 again, 100 in, 31, 40, 45 gone: the net change, carryover cancelled.
    assert counts == {"UPDATE_BEFORE": 5, "UPDATE_AFTER": 5, "DELETE": 3, "INSERT": 1}
    assert assert_changelog_replays(pipeline.source, pipeline.sink) == 3
    assert staged_left(pipeline) == [], "the staged base is deleted with the run's uncommitted files"
    after = cow_merge(pipeline.source, upserts=rows([2], "us", "later"), delete_keys=[])
    assert [r.snapshot_id for r in pipeline.catch_up()] == [after], "per-snapshot commits resume"
    assert assert_changelog_replays(pipeline.source, pipeline.sink) == 4
    assert_mirror_follows(pipeline)


def test_a_snapshot_whose_parent_expired_is_bridged_from_the_watermark(pipeline):
    """One snapshot in the middle of what is pending expired (by id): its child has no parent."""
    base = pipeline.watermark()
    first = cow_merge(pipeline.source, upserts=rows([1, 2], "eu", "m1"), delete_keys=[33])
    middle = cow_merge(pipeline.source, upserts=rows([2], "us", "m2"), delete_keys=[34])
    child = cow_merge(pipeline.source, upserts=rows([300], "us"), delete_keys=[])
    last = cow_merge(pipeline.source, upserts=rows([1], "us", "m4"), delete_keys=[])
    pipeline.source.maintenance.expire_snapshots().by_id(middle).commit()
    assert pipeline.source.metadata.snapshot_by_id(middle) is None

    runs = pipeline.catch_up()
    # first is off the line now (the walk from main stops at child): one bridge to child, then last.
    assert [r.snapshot_id for r in runs] == [child, last] and runs[0].detected.bridge["reason"] == "expired"
    assert runs[0].detected.bridge["from"] == str(base.snapshot_id) and not runs[1].detected.bridge
    counts = assert_replay(pipeline.source, pipeline.sink, child, ["id"], base_snapshot_id=base.snapshot_id)
    assert counts == {"UPDATE_BEFORE": 2, "UPDATE_AFTER": 2, "DELETE": 2, "INSERT": 1}
    assert first not in {r.snapshot_id for r in runs}
    assert assert_replay(pipeline.source, pipeline.sink, last, ["id"]) == {
        "UPDATE_BEFORE": 1,
        "UPDATE_AFTER": 1,
    }
    assert assert_changelog_replays(pipeline.source, pipeline.sink) == 3
    assert_mirror_follows(pipeline)


def test_a_keyless_table_is_replayed_by_multiplicity(tmp_path):
    """Without identifier columns a duplicated row is two rows of the state, and stays two."""
    keyless = Schema(*SCHEMA.fields)
    pipeline = InlinePipeline(tmp_path, table={"protect_base": False})
    source = pipeline.create_source(keyless, partition_spec=BY_REGION)
    source.append(pa.concat_tables([rows([1, 1, 2, 3], "us"), rows([4], "eu")]))
    pipeline.catch_up()
    base = pipeline.watermark()
    source.overwrite(pa.concat_tables([rows([1, 1, 1, 2], "us"), rows([4, 5], "eu")]))
    source.append(rows([6], "us"))
    last = source.current_snapshot().snapshot_id
    expire_all(source)
    assert source.metadata.snapshot_by_id(base.snapshot_id) is None
    runs = pipeline.catch_up()
    assert runs[0].detected.bridge["base"] == "changelog replay"
    counts = change_counts(pipeline, last)
    assert counts == {"INSERT": 3, "DELETE": 1}  # one more (1), 5 and 6 in; 3 gone
    assert assert_changelog_replays(pipeline.source, pipeline.sink) == 2


def test_write_audit_publish_by_fast_forward_is_processed_snapshot_by_snapshot(pipeline):
    head = pipeline.source.current_snapshot().snapshot_id
    pipeline.source.manage_snapshots().create_branch(head, "audit").commit()
    pipeline.source.append(rows([200, 201], "us"), branch="audit")
    pipeline.source.append(rows([202], "eu"), branch="audit")
    audited = pipeline.source.refs()["audit"].snapshot_id
    assert pipeline.catch_up() == [], "a branch is not main: nothing to capture before it is published"
    pipeline.source.manage_snapshots().set_current_snapshot(audited).commit()  # fast-forward main
    runs = pipeline.catch_up()
    assert [r.action for r in runs] == ["insert", "insert"] and not any(r.detected.bridge for r in runs)
    assert assert_changelog_replays(pipeline.source, pipeline.sink) == 3


def test_a_branch_published_over_main_is_bridged_from_mains_processed_state(pipeline):
    head = pipeline.source.current_snapshot().snapshot_id
    pipeline.source.manage_snapshots().create_branch(head, "audit").commit()
    pipeline.source.append(rows([300], "us"), branch="audit")
    pipeline.source.append(rows([301], "eu"), branch="audit")
    audited = pipeline.source.refs()["audit"].snapshot_id
    on_main = cow_merge(pipeline.source, upserts=rows([5], "us", "main-only"), delete_keys=[6])
    assert [r.snapshot_id for r in pipeline.catch_up()] == [on_main]
    # Publishing the audited branch by replacing main drops main's own commit from the line.
    pipeline.source.manage_snapshots().set_current_snapshot(audited).commit()
    runs = pipeline.catch_up()
    assert len(runs) == 2 and runs[0].detected.bridge["reason"] == "rolled back"
    assert runs[0].detected.bridge["common_ancestor"] == str(head) and not runs[1].detected.bridge
    first_audit = runs[0].snapshot_id
    counts = assert_replay(pipeline.source, pipeline.sink, first_audit, ["id"], base_snapshot_id=on_main)
    assert counts == {"UPDATE_BEFORE": 1, "UPDATE_AFTER": 1, "INSERT": 2}  # 5 back, 6 back, 300 in
    assert assert_changelog_replays(pipeline.source, pipeline.sink) == 4
    assert_mirror_follows(pipeline)


def test_a_merge_on_read_history_expired_while_nothing_ran_is_bridged(tmp_path):
    from cdc_devtools.mor import mor_merge

    pipeline = InlinePipeline(tmp_path, table={"identifier_columns": ["id"]})
    source = pipeline.create_source(SCHEMA, partition_spec=BY_REGION, properties={"format-version": "2"})
    source.append(pa.concat_tables([rows(range(0, 20), "us"), rows(range(20, 30), "eu")]))
    pipeline.catch_up()
    base = pipeline.watermark()
    mor_merge(source, upserts=rows([1, 2], "us", "mor"), delete_keys=[3, 25])  # position deletes
    mor_merge(pipeline.source, upserts=rows([2], "eu", "moved"), delete_keys=[], deletes="equality")
    last = mor_merge(pipeline.source, upserts=rows([40], "us"), delete_keys=[4])
    expire_all(pipeline.source)
    runs = pipeline.catch_up()
    assert [r.snapshot_id for r in runs] == [last] and runs[0].detected.bridge["reason"] == "expired"
    counts = assert_replay(pipeline.source, pipeline.sink, last, ["id"], base_snapshot_id=base.snapshot_id)
    assert counts == {"UPDATE_BEFORE": 2, "UPDATE_AFTER": 2, "DELETE": 3, "INSERT": 1}
    assert assert_changelog_replays(pipeline.source, pipeline.sink) == 2

"""The next snapshot after the watermark, on real tables: rollbacks, expiry, recreation, start positions."""

from __future__ import annotations

import json

import pytest

from iceberg_cdc.errors import SourceHistoryError
from iceberg_cdc.source.changes import initial_load_changes, snapshot_changes
from iceberg_cdc.source.history import (
    PendingSnapshot,
    Watermark,
    current_ancestry,
    next_snapshot,
    pending_count,
    table_uuid,
)
from iceberg_cdc.source.reprocess import validate_manual_snapshot, validate_reprocess_range
from tests.support.iceberg_tables import create_table, current_id, live_files, orders, sql_catalog


@pytest.fixture
def catalog(tmp_path):
    return sql_catalog(tmp_path)


def appended(table, count: int) -> list[int]:
    ids = []
    for i in range(count):
        table.append(orders([i]))
        ids.append(current_id(table))
    return ids


def drain(table, watermark: Watermark | None, start="earliest") -> list[PendingSnapshot]:
    """Process every pending snapshot as the pipeline would, advancing the watermark."""
    done = []
    while (pending := next_snapshot(table, watermark, start)) is not None:
        done.append(pending)
        watermark = Watermark(table_uuid(table), pending.snapshot_id, pending.ordinal)
    return done


def test_table_without_snapshots_has_nothing_pending(catalog):
    table = create_table(catalog, "t")
    assert current_ancestry(table) == []
    assert next_snapshot(table, None, "earliest") is None
    assert next_snapshot(table, None, "latest") is None


def test_earliest_walks_the_whole_ancestry_in_order(catalog):
    table = create_table(catalog, "t")
    ids = appended(table, 4)
    assert [s.snapshot_id for s in current_ancestry(table)] == ids

    first = next_snapshot(table, None, "earliest")
    assert first == PendingSnapshot(snapshot_id=ids[0], ordinal=1, is_initial_load=False, remaining=3)
    assert snapshot_changes(table, first.snapshot_id).parent_id is None

    done = drain(table, None)
    assert [p.snapshot_id for p in done] == ids
    assert [p.ordinal for p in done] == [1, 2, 3, 4]
    assert [p.remaining for p in done] == [3, 2, 1, 0]
    assert not any(p.is_initial_load for p in done)
    caught_up = Watermark(table_uuid(table), ids[-1], 4)
    assert next_snapshot(table, caught_up, "earliest") is None


def test_latest_starts_with_an_initial_load_then_continues(catalog):
    table = create_table(catalog, "t")
    appended(table, 3)
    pending = next_snapshot(table, None, "latest")
    assert pending == PendingSnapshot(current_id(table), ordinal=3, is_initial_load=True, remaining=0)
    load = initial_load_changes(table, pending.snapshot_id)
    assert {r.path for r in load.added} == {f.file_path for f in live_files(table)}

    table.append(orders([99]))
    watermark = Watermark(table_uuid(table), pending.snapshot_id, pending.ordinal)
    following = next_snapshot(table, watermark, "latest")
    assert following == PendingSnapshot(current_id(table), ordinal=4, is_initial_load=False, remaining=0)


def test_recreated_table_is_a_clear_error(catalog):
    table = create_table(catalog, "t")
    appended(table, 2)
    watermark = Watermark(table_uuid(table), current_id(table), 2)
    catalog.drop_table("db.t")
    table = create_table(catalog, "t")
    appended(table, 1)
    with pytest.raises(SourceHistoryError) as raised:
        next_snapshot(table, watermark, "earliest")
    message = str(raised.value)
    assert "db.t" in message and "recreated" in message
    assert watermark.source_uuid in message and table_uuid(table) in message
    assert str(watermark.snapshot_id) in message and "new sink" in message


def test_rolled_back_snapshots_are_never_processed(catalog):
    table = create_table(catalog, "t")
    a, b, _ = appended(table, 3)
    table.manage_snapshots().rollback_to_snapshot(b).commit()
    table.append(orders([7]))
    d = current_id(table)
    assert [s.snapshot_id for s in current_ancestry(table)] == [a, b, d]
    assert [p.snapshot_id for p in drain(table, None)] == [a, b, d]
    after_b = next_snapshot(table, Watermark(table_uuid(table), b, 2), "earliest")
    assert after_b.snapshot_id == d and after_b.ordinal == 3


def test_watermark_on_a_rolled_back_snapshot_is_a_clear_error(catalog):
    table = create_table(catalog, "t")
    _, b, c = appended(table, 3)
    table.manage_snapshots().rollback_to_snapshot(b).commit()
    table.append(orders([7]))
    with pytest.raises(SourceHistoryError) as raised:
        next_snapshot(table, Watermark(table_uuid(table), c, 3), "earliest")
    message = str(raised.value)
    assert str(c) in message and "db.t" in message and "rolled back" in message
    assert str(current_id(table)) in message
    assert f"common ancestor {b}" in message


def test_expired_watermark_snapshot_is_a_clear_error(catalog):
    table = create_table(catalog, "t")
    a, b, _ = appended(table, 3)
    table.maintenance.expire_snapshots().by_id(a).commit()
    with pytest.raises(SourceHistoryError) as raised:
        next_snapshot(table, Watermark(table_uuid(table), a, 1), "earliest")
    message = str(raised.value)
    assert "expired" in message and str(a) in message and str(b) in message and "db.t" in message


def test_ordinals_keep_increasing_when_old_snapshots_expire(catalog):
    table = create_table(catalog, "t")
    a, b, c = appended(table, 3)
    table.maintenance.expire_snapshots().by_id(a).commit()
    # b is now first in the ancestry, but the sink already gave it ordinal 2
    pending = next_snapshot(table, Watermark(table_uuid(table), b, 2), "earliest")
    assert pending.snapshot_id == c and pending.ordinal == 3


def test_earliest_with_an_expired_first_parent_loads_the_oldest_state(catalog):
    table = create_table(catalog, "t")
    a, b, _ = appended(table, 3)
    table.maintenance.expire_snapshots().by_id(a).commit()
    first = next_snapshot(table, None, "earliest")
    assert first.snapshot_id == b and first.is_initial_load and first.ordinal == 1


def test_manual_snapshot_must_be_in_the_current_ancestry(catalog):
    table = create_table(catalog, "t")
    a, b, c = appended(table, 3)
    assert validate_manual_snapshot(table, b, Watermark(table_uuid(table), a, 1)) == PendingSnapshot(
        b, 2, False, 1
    )
    table.manage_snapshots().rollback_to_snapshot(b).commit()
    with pytest.raises(SourceHistoryError, match="rolled back") as raised:
        validate_manual_snapshot(table, c)
    assert str(c) in str(raised.value)
    with pytest.raises(SourceHistoryError, match="does not exist"):
        validate_manual_snapshot(table, 12345)


def test_an_id_a_browser_rounded_is_named_as_such_with_the_snapshot_meant(catalog):
    """An unquoted 19-digit id in the Trigger form's JSON editor arrives as a double: its last digits are gone."""
    table = create_table(catalog, "t")
    a, b = appended(table, 2)
    rounded = int(float(b)) if int(float(b)) != b else b + 700  # what JSON.parse makes of the digits
    with pytest.raises(SourceHistoryError, match="does not exist") as raised:
        validate_manual_snapshot(table, rounded, Watermark(table_uuid(table), b, 2))
    assert f"The id looks rounded: snapshot {b} differs from it by only {abs(b - rounded)}" in str(
        raised.value
    )
    assert str(raised.value).endswith(
        f'Quote the id, as a string of digits: {{"snapshot_id": "{b}"}} if {b} is the one you meant.'
    )
    with pytest.raises(SourceHistoryError, match=f'"through_snapshot_id": "{b}"'):
        validate_reprocess_range(table, a, rounded, Watermark(table_uuid(table), b, 2))
    # far from every snapshot: no such hint
    with pytest.raises(SourceHistoryError) as raised:
        validate_manual_snapshot(table, b + 5000, Watermark(table_uuid(table), b, 2))
    assert "rounded" not in str(raised.value)


def test_manual_snapshot_on_a_fresh_sink_is_only_the_next_pending_one(catalog):
    """With no watermark, only the snapshot the next run would pick: anything later skips history."""
    table = create_table(catalog, "t")
    a, b, c = appended(table, 3)
    assert validate_manual_snapshot(table, a) == next_snapshot(table, None, "earliest")
    for later in (b, c):
        with pytest.raises(SourceHistoryError, match=rf"must process snapshot {a}.*never reach the sink"):
            validate_manual_snapshot(table, later)
    # start: latest loads the current state: the current snapshot, as an initial load
    assert validate_manual_snapshot(table, c, None, "latest") == PendingSnapshot(c, 3, True, 0)
    with pytest.raises(SourceHistoryError, match=rf"must process snapshot {c}"):
        validate_manual_snapshot(table, a, None, "latest")


def test_manual_reprocess_of_an_initial_load_loads_the_full_state(catalog):
    table = create_table(catalog, "t")
    _, b, c = appended(table, 3)
    watermark = Watermark(table_uuid(table), c, 3)
    assert validate_manual_snapshot(table, c, watermark).is_initial_load is False
    assert validate_manual_snapshot(table, c, watermark, loaded_in_full=True).is_initial_load is True
    # remaining counts from the watermark, not from the reprocessed snapshot
    assert validate_manual_snapshot(table, b, watermark).remaining == 0
    assert pending_count(table, watermark) == 0
    assert pending_count(table, Watermark(table_uuid(table), b, 2)) == 1


def test_manual_snapshot_ordinal_follows_the_watermark(catalog):
    table = create_table(catalog, "t")
    a, b, c = appended(table, 3)
    table.maintenance.expire_snapshots().by_id(a).commit()
    watermark = Watermark(table_uuid(table), c, 3)
    assert validate_manual_snapshot(table, b, watermark).ordinal == 2
    assert validate_manual_snapshot(table, c, watermark).ordinal == 3


def test_reprocess_range_lists_the_snapshots_from_first_through_last(catalog):
    table = create_table(catalog, "t")
    a, b, c, _ = appended(table, 4)
    mark = Watermark(table_uuid(table), c, 3)
    assert validate_reprocess_range(table, a, c, mark) == [a, b, c]
    assert validate_reprocess_range(table, b, b, mark) == [b]


def test_reprocess_range_refusals_name_the_fix(catalog):
    table = create_table(catalog, "t")
    a, b, c, d = appended(table, 4)
    mark = Watermark(table_uuid(table), c, 3)

    def refused(first, through, watermark=mark) -> str:
        with pytest.raises(SourceHistoryError) as raised:
            validate_reprocess_range(table, first, through, watermark)
        return str(raised.value)

    message = refused(a, b, None)
    assert "no watermark" in message and "without snapshot_id" in message
    message = refused(c, a)
    assert "comes before" in message and f'{{"snapshot_id": {a}, "through_snapshot_id": {c}}}' in message
    message = refused(b, d)
    assert "not processed yet" in message and f"up to {c}" in message
    message = refused(a, 12345)
    assert "12345" in message and "does not exist" in message

    table.maintenance.expire_snapshots().by_id(a).commit()
    message = refused(a, b, Watermark(table_uuid(table), c, 3))
    assert (
        f"snapshot_id {a}" in message
        and "expired" in message
        and f"oldest one still available is {b}" in message
    )


def test_watermark_json_round_trip():
    watermark = Watermark("3f1e", 2**62, 17)
    assert Watermark.from_dict(json.loads(json.dumps(watermark.to_dict()))) == watermark

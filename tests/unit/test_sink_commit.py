"""Committing changes to the sink: atomic with the watermark, exactly once, retried on conflicts."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.expressions import EqualTo
from pyiceberg.serializers import FromInputFile

from iceberg_cdc.errors import CdcError, SinkSchemaError, SourceHistoryError
from iceberg_cdc.sink import commit as commit_module
from iceberg_cdc.sink.commit import advance_watermark, commit_changes
from iceberg_cdc.sink.schema import COMMIT_SNAPSHOT_ID, to_sink_arrow
from iceberg_cdc.sink.staging import staged_file_path, write_staged_file
from iceberg_cdc.sink.table import (
    CHANGE_ORDINAL_KEY,
    REPLACE_KEY,
    SOURCE_SNAPSHOT_ID_KEY,
    SOURCE_TABLE_KEY,
    SOURCE_UUID_KEY,
    ensure_sink_table,
    find_commit,
    read_watermark,
    summary_properties,
    watermark_property_names,
)
from iceberg_cdc.watermark import Watermark
from tests.support.sink_tables import (
    SINK,
    SOURCE,
    SOURCE_UUID,
    change_rows,
    commit_timestamp_ms,
    make_catalog,
    sink_rows,
    source_schema,
    stage,
    stage_and_commit,
)


@pytest.fixture
def catalog(tmp_path):
    return make_catalog(tmp_path)


@pytest.fixture
def sink(catalog):
    return ensure_sink_table(catalog, SINK, source_schema())


@pytest.fixture(autouse=True)
def _no_backoff(monkeypatch):
    monkeypatch.setattr(commit_module, "_backoff", lambda attempt: None)


def _commit(table, paths, snapshot_id, ordinal, **kwargs):
    return commit_changes(
        table,
        staged_paths=paths,
        source_identifier=SOURCE,
        source_uuid=SOURCE_UUID,
        snapshot_id=snapshot_id,
        ordinal=ordinal,
        **kwargs,
    )


def _expected(ids, snapshot_id, ordinal, schema):
    rows = to_sink_arrow(
        change_rows(ids), schema, ordinal, snapshot_id, commit_timestamp_ms(snapshot_id)
    ).to_pylist()
    return sorted(rows, key=lambda r: (r[COMMIT_SNAPSHOT_ID], r["id"], r["_change_type"]))


def _pyiceberg_read_quirk(rows):
    """pyiceberg 0.12's reader turns a null list<struct> into [] (the files hold null)."""
    return [{**r, "items": [] if r["items"] is None else r["items"]} for r in rows]


# ----------------------------------------------------------------------------- commit and read back


def test_committed_rows_read_back_equal_to_what_was_staged(sink):
    ids = list(range(40))
    result = stage_and_commit(sink, 1001, 1, ids)
    assert result.committed and result.reason == "committed"
    assert result.data_files == 2 and result.records == 40
    assert sink.current_snapshot().snapshot_id == result.sink_snapshot_id

    expected = _expected(ids, 1001, 1, sink.schema())
    assert sink_rows(sink) == _pyiceberg_read_quirk(expected)
    # the committed files themselves hold exactly the staged rows (nulls included)
    files = [task.file.file_path for task in sink.scan().plan_files()]
    raw = pa.concat_tables([pq.read_table(sink.io.new_input(p).open()) for p in files]).to_pylist()
    assert sorted(raw, key=lambda r: (r["id"], r["_change_type"])) == expected


def test_data_file_statistics_prune_other_snapshots(sink):
    stage_and_commit(sink, 1001, 1, list(range(10)))
    stage_and_commit(sink, 1002, 2, list(range(10, 20)))
    for task in sink.scan().plan_files():
        data_file = task.file
        assert data_file.record_count > 0 and data_file.file_size_in_bytes > 0
        field_id = sink.schema().find_field(COMMIT_SNAPSHOT_ID).field_id
        assert data_file.lower_bounds[field_id] == data_file.upper_bounds[field_id]
        assert data_file.null_value_counts[field_id] == 0
    one = list(sink.scan(row_filter=EqualTo(COMMIT_SNAPSHOT_ID, 1002)).plan_files())
    assert len(one) == 2
    assert all(t.file.file_path.split("/")[-2] == "snapshot=1002" for t in one)
    assert list(sink.scan(row_filter=EqualTo(COMMIT_SNAPSHOT_ID, 5)).plan_files()) == []


def test_commit_carries_the_marker_in_the_snapshot_summary(sink):
    result = stage_and_commit(sink, 1001, 7, [1, 2])
    summary = summary_properties(sink.snapshot_by_id(result.sink_snapshot_id))
    assert summary[SOURCE_TABLE_KEY] == SOURCE
    assert summary[SOURCE_SNAPSHOT_ID_KEY] == "1001"
    assert summary[SOURCE_UUID_KEY] == SOURCE_UUID
    assert summary[CHANGE_ORDINAL_KEY] == "7"
    assert summary["added-records"] == "2"


def test_watermark_moves_in_the_same_metadata_version_as_the_data(sink, catalog):
    before = sink.metadata_location
    log_length = len(sink.metadata.metadata_log)
    metadata_dir = sink.location().removeprefix("file://") + "/metadata"
    json_before = {f for f in os.listdir(metadata_dir) if f.endswith(".metadata.json")}
    result = stage_and_commit(sink, 1001, 1, [1, 2, 3])

    json_after = {f for f in os.listdir(metadata_dir) if f.endswith(".metadata.json")}
    assert len(json_after - json_before) == 1  # exactly one new metadata version
    assert len(sink.metadata.metadata_log) == log_length + 1
    assert sink.metadata.metadata_log[-1].metadata_file == before

    new = FromInputFile.table_metadata(sink.io.new_input(catalog.load_table(SINK).metadata_location))
    old = FromInputFile.table_metadata(sink.io.new_input(before))
    uuid_key, snapshot_key, ordinal_key = watermark_property_names(SOURCE)
    assert new.current_snapshot_id == result.sink_snapshot_id
    assert new.properties[snapshot_key] == "1001"
    assert new.properties[ordinal_key] == "1"
    assert new.properties[uuid_key] == SOURCE_UUID
    assert old.current_snapshot_id is None and snapshot_key not in old.properties
    assert read_watermark(sink, SOURCE) == Watermark(SOURCE_UUID, 1001, 1)


# ----------------------------------------------------------------------------- exactly once


def test_second_commit_with_the_same_marker_changes_nothing(sink):
    first = stage_and_commit(sink, 1001, 1, list(range(10)))
    snapshots = len(sink.metadata.snapshots)
    location = sink.metadata_location
    rows = sink_rows(sink)

    again = stage_and_commit(sink, 1001, 1, list(range(10)), prefix="run2")  # a rerun of the DAG
    assert not again.committed
    assert again.reason == f"already committed in sink snapshot {first.sink_snapshot_id}"
    assert again.sink_snapshot_id == first.sink_snapshot_id
    assert len(sink.metadata.snapshots) == snapshots
    assert sink.metadata_location == location
    assert sink_rows(sink) == rows


def test_snapshot_behind_the_watermark_is_not_committed(sink):
    stage_and_commit(sink, 1002, 2, [1])
    advance_watermark(sink, SOURCE, SOURCE_UUID, 1005, 5)
    late = stage_and_commit(sink, 1004, 4, [2, 3])
    assert not late.committed and "already at ordinal 5" in late.reason
    assert len(sink_rows(sink)) == 1


def test_find_commit_searches_newest_first_and_stops_at_lower_ordinals(sink):
    first = stage_and_commit(sink, 1001, 1, [1])
    second = stage_and_commit(sink, 1002, 2, [2])
    assert find_commit(sink, SOURCE, 1001).snapshot_id == first.sink_snapshot_id
    assert find_commit(sink, SOURCE, 1002, ordinal=2).snapshot_id == second.sink_snapshot_id
    assert find_commit(sink, SOURCE, 1001, ordinal=1).snapshot_id == first.sink_snapshot_id
    assert find_commit(sink, SOURCE, 999) is None
    assert find_commit(sink, "other.table", 1001) is None
    assert find_commit(sink, SOURCE, 1001, source_uuid="another-uuid") is None
    # a commit of ordinal 2 above means nothing with ordinal 3 can be further down: stop there
    assert find_commit(sink, SOURCE, 1001, ordinal=3) is None


def test_zero_staged_files_still_advance_the_watermark(sink):
    stage_and_commit(sink, 1001, 1, [1, 2])
    snapshots = len(sink.metadata.snapshots)
    result = _commit(sink, [], 1002, 2)
    assert not result.committed and "only the watermark moved" in result.reason
    assert result.sink_snapshot_id is None
    assert read_watermark(sink, SOURCE) == Watermark(SOURCE_UUID, 1002, 2)
    assert len(sink.metadata.snapshots) == snapshots  # no empty data snapshot
    # a staged file with no rows counts as nothing, too
    empty = stage(sink, 1003, 3, [change_rows([])])
    result = _commit(sink, empty, 1003, 3)
    assert not result.committed and result.data_files == 0
    assert len(sink.metadata.snapshots) == snapshots
    assert read_watermark(sink, SOURCE).snapshot_id == 1003
    # and doing it again is a no-op
    assert "already at ordinal 3" in _commit(sink, empty, 1003, 3).reason


# ----------------------------------------------------------------------------- watermark


def test_advance_watermark_never_goes_backwards(sink):
    assert read_watermark(sink, SOURCE) is None
    assert advance_watermark(sink, SOURCE, SOURCE_UUID, 1005, 5) == Watermark(SOURCE_UUID, 1005, 5)
    location = sink.metadata_location
    assert advance_watermark(sink, SOURCE, SOURCE_UUID, 1003, 3) == Watermark(SOURCE_UUID, 1005, 5)
    assert advance_watermark(sink, SOURCE, SOURCE_UUID, 1005, 5) == Watermark(SOURCE_UUID, 1005, 5)
    assert sink.metadata_location == location  # nothing committed
    assert advance_watermark(sink, SOURCE, SOURCE_UUID, 1006, 6).ordinal == 6
    assert sink.current_snapshot() is None  # property updates only
    # watermarks are per source table
    advance_watermark(sink, "shop.other", "u2", 77, 1)
    assert read_watermark(sink, "shop.other") == Watermark("u2", 77, 1)
    assert read_watermark(sink, SOURCE).ordinal == 6


def test_watermark_of_a_recreated_source_table_is_refused(sink):
    advance_watermark(sink, SOURCE, SOURCE_UUID, 1005, 5)
    with pytest.raises(SourceHistoryError, match="dropped and recreated"):
        advance_watermark(sink, SOURCE, "new-uuid", 1, 1)
    with pytest.raises(SourceHistoryError, match="dropped and recreated"):
        commit_changes(
            sink, staged_paths=[], source_identifier=SOURCE, source_uuid="new-uuid", snapshot_id=1, ordinal=1
        )


def test_hand_edited_watermark_is_an_error(sink):
    uuid_key, snapshot_key, ordinal_key = watermark_property_names(SOURCE)
    with sink.transaction() as tx:
        tx.set_properties({uuid_key: SOURCE_UUID, snapshot_key: "12"})
    with pytest.raises(CdcError, match="incomplete"):
        read_watermark(sink, SOURCE)
    with sink.transaction() as tx:
        tx.set_properties({ordinal_key: "x"})
    with pytest.raises(CdcError, match="not numeric"):
        read_watermark(sink, SOURCE)


# ----------------------------------------------------------------------------- reprocess


def test_replace_existing_swaps_exactly_that_snapshots_rows(sink):
    stage_and_commit(sink, 1001, 1, list(range(0, 8)))
    stage_and_commit(sink, 1002, 2, list(range(10, 18)))
    other = sink_rows(sink, 1002)
    snapshots = len(sink.metadata.snapshots)
    versions = len(sink.metadata.metadata_log)

    result = stage_and_commit(sink, 1001, 1, [100, 101, 102], prefix="reprocess1", replace_existing=True)
    assert result.committed and result.reason.startswith("replaced")
    assert [r["id"] for r in sink_rows(sink, 1001)] == [100, 101, 102]
    assert sink_rows(sink, 1002) == other
    assert read_watermark(sink, SOURCE) == Watermark(SOURCE_UUID, 1002, 2)  # not moved backwards
    assert len(sink.metadata.snapshots) == snapshots + 2  # delete + append ...
    assert len(sink.metadata.metadata_log) == versions + 1  # ... in one metadata version
    summary = summary_properties(sink.current_snapshot())
    assert summary[REPLACE_KEY] == "true" and summary[SOURCE_SNAPSHOT_ID_KEY] == "1001"

    # the same reprocess again (a retry after a lost answer) changes nothing
    paths = [t.file.file_path for t in sink.scan(row_filter=EqualTo(COMMIT_SNAPSHOT_ID, 1001)).plan_files()]
    location = sink.metadata_location
    again = _commit(sink, paths, 1001, 1, replace_existing=True)
    assert not again.committed and again.reason.startswith("already replaced")
    assert sink.metadata_location == location
    # a later ordinary commit still finds its way (the replace commit does not end searches)
    assert find_commit(sink, SOURCE, 1002, ordinal=2) is not None


def test_replace_refuses_staged_names_of_committed_files(sink):
    stage_and_commit(sink, 1001, 1, list(range(0, 8)))
    live = [t.file.file_path for t in sink.scan().plan_files()]
    with pytest.raises(CdcError, match="names no earlier run used"):
        _commit(sink, live[:1], 1001, 1, replace_existing=True)


def test_replace_rewrites_files_that_mix_snapshots(sink):
    stage_and_commit(sink, 1001, 1, list(range(0, 6)))
    stage_and_commit(sink, 1002, 2, list(range(10, 16)))
    # a compaction outside the pipeline merges both snapshots into one file
    everything = sink.scan().to_arrow()
    sink.overwrite(everything)
    assert len(list(sink.scan().plan_files())) == 1
    other = sink_rows(sink, 1002)

    stage_and_commit(sink, 1001, 1, [200], prefix="reprocess1", replace_existing=True)
    assert [r["id"] for r in sink_rows(sink, 1001)] == [200]
    assert sink_rows(sink, 1002) == other


def test_replace_with_no_rows_left_deletes_the_snapshots_rows(sink):
    stage_and_commit(sink, 1001, 1, list(range(0, 4)))
    stage_and_commit(sink, 1002, 2, list(range(10, 14)))
    result = _commit(sink, [], 1001, 1, replace_existing=True)
    assert result.committed
    assert sink_rows(sink, 1001) == []
    assert len(sink_rows(sink, 1002)) == 4


# ----------------------------------------------------------------------------- concurrency


def test_concurrent_commit_of_the_same_snapshot_is_not_duplicated(catalog, sink):
    stale = catalog.load_table(SINK)
    paths = stage(sink, 1001, 1, [change_rows(range(6))])
    first = _commit(sink, paths, 1001, 1)
    assert first.committed

    # the stale table object sees no marker; its commit loses the race, it reloads and finds it
    second = _commit(stale, paths, 1001, 1)
    assert not second.committed and second.attempts == 2
    assert second.sink_snapshot_id == first.sink_snapshot_id
    fresh = catalog.load_table(SINK)
    assert len(fresh.metadata.snapshots) == 1
    assert len(sink_rows(fresh)) == 6


def test_concurrent_commit_of_another_snapshot_is_retried(catalog, sink):
    stale = catalog.load_table(SINK)
    stage_and_commit(sink, 1001, 1, list(range(4)))
    paths = stage(stale, 1002, 2, [change_rows(range(10, 13))])
    result = _commit(stale, paths, 1002, 2)
    assert result.committed and result.attempts == 2
    fresh = catalog.load_table(SINK)
    assert len(fresh.metadata.snapshots) == 2
    assert sorted({r[COMMIT_SNAPSHOT_ID] for r in sink_rows(fresh)}) == [1001, 1002]
    assert read_watermark(fresh, SOURCE) == Watermark(SOURCE_UUID, 1002, 2)
    assert stale.metadata_location == fresh.metadata_location  # the caller's object is current


def test_stale_watermark_update_does_not_move_it_backwards(catalog, sink):
    stale = catalog.load_table(SINK)
    stage_and_commit(sink, 1003, 3, [1])
    # the stale object believes there is no watermark; its property commit asserts the
    # branch head, fails, reloads and then sees the newer watermark
    assert advance_watermark(stale, SOURCE, SOURCE_UUID, 1002, 2) == Watermark(SOURCE_UUID, 1003, 3)
    assert read_watermark(catalog.load_table(SINK), SOURCE).ordinal == 3


def test_commit_gives_up_after_max_attempts(catalog, sink, monkeypatch):
    from pyiceberg.exceptions import CommitFailedException

    calls = []

    def always_conflict(*args, **kwargs):
        calls.append(1)
        raise CommitFailedException("simulated conflict")

    monkeypatch.setattr(commit_module, "_commit_once", always_conflict)
    with pytest.raises(CommitFailedException):
        _commit(sink, [], 1001, 1, max_attempts=3)
    assert len(calls) == 3


# ----------------------------------------------------------------------------- staged files that do not fit


def test_staged_file_without_field_ids_is_refused(sink):
    path = staged_file_path(sink.location(), 1001, "plain")
    plain = to_sink_arrow(change_rows([1]), sink.schema(), 1, 1001, commit_timestamp_ms(1001))
    stripped = pa.Table.from_arrays(plain.columns, names=plain.column_names)  # no field metadata
    write_staged_file(sink.io, path, stripped.cast(pa.schema([f.remove_metadata() for f in plain.schema])))
    with pytest.raises(SinkSchemaError, match="without Iceberg field ids"):
        _commit(sink, [path], 1001, 1)
    assert sink.current_snapshot() is None


def test_staged_file_for_another_schema_is_refused(catalog, sink):
    path = staged_file_path(sink.location(), 1001, "old")
    write_staged_file(
        sink.io, path, to_sink_arrow(change_rows([1]), sink.schema(), 1, 1001, commit_timestamp_ms(1001))
    )
    with sink.update_schema() as update:  # the sink changes between staging and commit
        update.update_column("qty", field_type=sink.schema().find_field("id").field_type)
    with pytest.raises(SinkSchemaError, match=r"column 'qty' is int in the file, long in the sink"):
        _commit(sink, [path], 1001, 1)

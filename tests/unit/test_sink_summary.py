"""The commit summary: one record writes and reads every ``cdc.*`` key of a sink snapshot."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from iceberg_cdc.pipeline.groups import skew_summary
from iceberg_cdc.sink.commit import commit_changes
from iceberg_cdc.sink.summary import CommitSummary, Skew, figure_key
from iceberg_cdc.sink.table import ensure_sink_table, find_commit, summary_properties
from tests.support.sink_tables import (
    SINK,
    SOURCE,
    SOURCE_UUID,
    change_rows,
    make_catalog,
    source_schema,
    stage,
)

# A summary as sinks written so far hold it (the wire form every reader must keep reading).
WRITTEN = {
    "cdc.source-table": "shop.orders",
    "cdc.source-snapshot-id": "8744736658442914487",
    "cdc.source-uuid": "7d3e2b8e-0000-4000-8000-000000000001",
    "cdc.change-ordinal": "7",
    "cdc.operation": "overwrite",
    "cdc.initial-load": "false",
    "cdc.input-rows": "1200",
    "cdc.deletes": "100",
    "cdc.inserts": "300",
    "cdc.updates": "1000",
    "cdc.carryover-rows": "37800",
    "cdc.rows-read": "40300",
    "cdc.shuffle-bytes": "813056",
    "cdc.arrow-bytes": "2000000",
    "cdc.seconds.detect": "0.41",
    "cdc.seconds.write": "4.3",
    "cdc.seconds.read": "3.4",
    "cdc.skewed": "2",
    "cdc.skew.max-ratio": "41.3",
    "cdc.skew.max-bytes": "12582912",
    "cdc.skew.median-bytes": "304640",
    "cdc.skew.partitions": "17,3",
    "cdc.rows.input": "40300",
    "cdc.rows.masked": "0",
    "cdc.rows.shuffled": "40300",
    "cdc.rows.read": "40300",
    "cdc.rows.carryover": "37800",
    "cdc.rows.changes": "2500",
}


def test_a_written_summary_reads_into_the_record_and_back_unchanged():
    record = CommitSummary.from_summary({**WRITTEN, "added-records": "2500", "total-records": "9000"})
    assert record.source_table == "shop.orders" and record.source_snapshot_id == 8744736658442914487
    assert (record.source_uuid, record.change_ordinal) == ("7d3e2b8e-0000-4000-8000-000000000001", 7)
    assert (record.operation, record.initial_load, record.replace) == ("overwrite", False, False)
    assert (record.inserts, record.deletes, record.updates) == (300, 100, 1000)
    assert (record.carryover_rows, record.shuffle_bytes) == (37800, 813056)
    assert record.figures["rows_read"] == 40300 and record.figures["input_rows"] == 1200
    assert record.seconds == {"detect": 0.41, "write": 4.3, "read": 3.4}
    assert record.rows == {
        "input": 40300,
        "masked": 0,
        "shuffled": 40300,
        "read": 40300,
        "carryover": 37800,
        "changes": 2500,
    }
    assert record.skew == Skew(2, (17, 3), 41.3, 12582912, 304640)
    assert record.to_summary() == WRITTEN  # pyiceberg's own keys are not the record's


def test_reprocess_keys():
    append = CommitSummary(source_table=SOURCE, source_snapshot_id=5, replace=True).to_summary()
    assert append["cdc.replace"] == "true"
    removed = CommitSummary(source_table=SOURCE, replaced_snapshot_id=5).to_summary()
    assert removed == {"cdc.source-table": SOURCE, "cdc.replaced-snapshot-id": "5"}
    assert CommitSummary.from_summary(removed).source_snapshot_id is None  # no marker: not a commit of 5


def test_missing_and_unreadable_values_are_unknown_never_zero():
    record = CommitSummary.from_summary(
        {
            "cdc.source-snapshot-id": "12",
            "cdc.inserts": "many",
            "cdc.seconds.write": "slow",
            "cdc.rows.read": "",
            "cdc.skewed": "x",
            "cdc.deletes": "4.0",
        }
    )
    assert record.source_snapshot_id == 12 and record.inserts is None and record.deletes == 4
    assert record.seconds == {} and record.rows == {} and record.skew is None
    assert record.initial_load is None and record.operation is None
    assert CommitSummary.from_summary({}) == CommitSummary()


def test_skew_recorded_before_sizes_were_kept_and_in_its_older_list_form():
    assert Skew.from_summary({"cdc.skewed": "30", "cdc.skew.partitions": "[1, 2]"}) == Skew(30, (1, 2))
    assert Skew.from_summary({"cdc.skewed": "0"}) == Skew(0)
    assert Skew.from_summary({"cdc.inserts": "3"}) is None


@pytest.mark.parametrize("name", ["operation", "skewed", "source_table", "change_ordinal", "Bad", "a.b", ""])
def test_figures_that_would_collide_with_another_key_are_refused(name):
    with pytest.raises(ValueError, match="cannot be a commit figure"):
        figure_key(name)
    with pytest.raises(ValueError):
        CommitSummary(figures={name: 1}).to_summary()


_names = st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True).filter(
    lambda n: (
        n not in {"operation", "skewed", "replace", "source_table", "source_snapshot_id"}
        and n not in {"source_uuid", "change_ordinal", "initial_load", "replaced_snapshot_id"}
    )
)
_counts = st.integers(min_value=0, max_value=2**62)
_skews = st.builds(
    Skew,
    count=st.integers(0, 10_000),
    partitions=st.lists(st.integers(0, 2**31 - 2), max_size=20).map(tuple),
    max_ratio=st.none() | st.floats(0, 1e6).map(lambda r: round(r, 1)),
    max_bytes=st.none() | _counts,
    median_bytes=st.none() | _counts,
)
_records = st.builds(
    CommitSummary,
    source_table=st.none() | st.from_regex(r"[a-z]+\.[a-z_]+", fullmatch=True),
    source_snapshot_id=st.none() | st.integers(-(2**63), 2**63 - 1),
    source_uuid=st.none() | st.uuids().map(str),
    change_ordinal=st.none() | st.integers(0, 2**40),
    operation=st.none() | st.sampled_from(["append", "overwrite", "delete", "replace"]),
    initial_load=st.none() | st.booleans(),
    replace=st.booleans(),
    replaced_snapshot_id=st.none() | st.integers(0, 2**63 - 1),
    figures=st.dictionaries(_names, _counts, max_size=8),
    seconds=st.dictionaries(
        st.sampled_from(["detect", "write", "coalesce", "read", "commit"]), st.floats(0, 1e5)
    ),
    rows=st.dictionaries(
        st.sampled_from(["input", "masked", "shuffled", "read", "carryover", "changes"]), _counts
    ),
    skew=st.none() | _skews,
)


@given(_records)
def test_every_record_reads_back_as_written(record):
    summary = record.to_summary()
    assert all(key.startswith("cdc.") and isinstance(value, str) for key, value in summary.items())
    assert CommitSummary.from_summary(summary) == record


def test_skew_from_coalesce_records():
    coalesce = {
        "phase": "coalesce",
        "skew": [
            {"partition": 3, "size": 9 * 2**20, "median": 304640},
            {"partition": 17, "size": 12 * 2**20, "median": 304640},
        ],
    }
    skew = skew_summary([{"phase": "write"}, coalesce])
    assert skew == Skew(2, (17, 3), 41.3, 12 * 2**20, 304640)
    assert skew.to_summary()["cdc.skew.max-ratio"] == "41.3"
    assert skew_summary([{"phase": "write"}]) is None  # no shuffle, no coalesce
    assert skew_summary([{"phase": "coalesce", "skew": []}]) == Skew(0)
    assert skew_summary([{"phase": "coalesce", "skewed": [5, 9]}]) == Skew(2, (5, 9))


def test_a_commit_writes_the_record_with_its_marker(tmp_path):
    sink = ensure_sink_table(make_catalog(tmp_path), SINK, source_schema())
    paths = stage(sink, 1001, 3, [change_rows(range(4))])
    figures = CommitSummary(operation="overwrite", initial_load=False, figures={"inserts": 4}, skew=Skew(0))
    commit_changes(
        sink,
        staged_paths=paths,
        source_identifier=SOURCE,
        source_uuid=SOURCE_UUID,
        snapshot_id=1001,
        ordinal=3,
        summary=figures,
    )
    written = CommitSummary.from_summary(summary_properties(find_commit(sink, SOURCE, 1001)))
    assert written == CommitSummary(
        source_table=SOURCE,
        source_snapshot_id=1001,
        source_uuid=SOURCE_UUID,
        change_ordinal=3,
        operation="overwrite",
        initial_load=False,
        figures={"inserts": 4},
        skew=Skew(0),
    )

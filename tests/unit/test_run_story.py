"""The one-line story of a run, as the operator reads it."""

from __future__ import annotations

from iceberg_cdc.orchestration.run_story import chained_run_id, story

DETECTED = {"action": "shuffle", "snapshot_id": 42, "operation": "overwrite", "ordinal": 7}


def test_a_shuffled_snapshot_says_what_changed_and_where_time_went():
    committed = {
        "committed": True,
        "inserts": 300,
        "deletes": 100,
        "updates": 1000,
        "carryover_rows": 37800,
        "shuffle_bytes": 813_056,
        "seconds": {"write": 4.31, "read": 3.38, "detect": 0.5},
    }
    assert story(DETECTED, committed) == (
        "snapshot 42 (overwrite, #7): +300 -100 ±1,000 updates, carryover 37,800, 794.0 KB shuffled, "
        "write 4.3 s / read 3.4 s"
    )


def test_other_outcomes_are_named():
    assert story({"action": "caught_up"}) == "caught up"
    skip = {**DETECTED, "action": "skip", "reason": "replace", "operation": "replace"}
    assert story(skip) == "snapshot 42 (replace, #7): skipped (replace: no logical change)"
    load = {**DETECTED, "action": "insert", "initial_load": True, "manual": True}
    assert story(load, {"committed": True, "inserts": 5}).startswith(
        "snapshot 42 (initial load, #7, reprocess): +5 -0"
    )
    cancelled = {"committed": False, "reason": "no changes (they all cancelled out)", "inserts": 0}
    assert story(DETECTED, cancelled).endswith("(no changes (they all cancelled out))")


def test_chained_runs_name_their_snapshot():
    assert chained_run_id(123, "20250101T000000") == "chained__s123__20250101T000000"
    assert chained_run_id(None, "x") == "chained__next__x"
    assert chained_run_id(5, "x", "reprocess") == "reprocess__s5__x"

"""The one-line story of a run, as the operator reads it."""

from __future__ import annotations

from iceberg_cdc.run.story import (
    AFTER_CLEAR,
    NOTE_LIMIT,
    FailedTask,
    chained_note,
    chained_run_id,
    merged_note,
    run_note,
    story,
)

# detect's XCom, as the steps and the run-notes listener receive it
RUN = {"source": "shop.orders", "sink": "shop.orders_changes", "run_id": "r1", "epoch": 1, "lease_ttl": 60}
DETECTED = {**RUN, "action": "shuffle", "snapshot_id": "42", "operation": "overwrite", "ordinal": 7}


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
        "snapshot 42 (overwrite, #7): +300 -100 ±1,000 updates, carryover 37,800, 794.0 KiB shuffled, "
        "write 4.3 s / read 3.4 s"
    )


def test_carryover_cancelled_before_the_shuffle_is_named():
    committed = {
        "committed": True,
        "updates": 1000,
        "carryover_rows": 37800,
        "cancelled_rows": 37000,
        "shuffle_bytes": 64 * 1024,
    }
    assert story(DETECTED, committed) == (
        "snapshot 42 (overwrite, #7): +0 -0 ±1,000 updates, carryover 37,800 (37,000 cancelled before the "
        "shuffle), 64.0 KiB shuffled"
    )


def test_skew_is_named_in_the_story():
    committed = {
        "committed": True,
        "inserts": 1,
        "shuffle_bytes": 2048,
        "skewed_partitions": 2,
        "skew_max_ratio": 41.3,
    }
    assert story(DETECTED, committed) == (
        "snapshot 42 (overwrite, #7): +1 -0 ±0 updates, 2.0 KiB shuffled, 2 skewed partitions, largest 41x the median"
    )


def test_other_outcomes_are_named():
    assert story({**RUN, "action": "caught_up"}) == "caught up"
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


# ---------------------------------------------------------------- the run's note


COMMITTED = {
    "committed": True,
    "inserts": 300,
    "deletes": 100,
    "updates": 1000,
    "story": "snapshot 42 (overwrite, #7): +300 -100 ±1,000 updates",
}


def test_a_successful_run_notes_its_story_and_what_is_pending():
    assert run_note("success", detected=DETECTED, committed=COMMITTED) == COMMITTED["story"]
    with_more = run_note("success", detected=DETECTED, committed=COMMITTED, mark={"remaining": 3})
    assert with_more == COMMITTED["story"] + "; 3 more pending"
    # No story in commit's XCom (an older commit task): built from detect's and commit's XComs.
    plain = {k: v for k, v in COMMITTED.items() if k != "story"}
    assert run_note("success", detected=DETECTED, committed=plain).startswith(
        "snapshot 42 (overwrite, #7): +300"
    )


def test_caught_up_and_skipped_runs():
    caught_up = {**RUN, "action": "caught_up", "remaining": 0}
    commit = {"committed": False, "reason": "caught up", "story": "caught up"}
    assert run_note("success", detected=caught_up, committed=commit, mark={"remaining": 0}) == "caught up"
    assert run_note("success", detected=caught_up) == "caught up"
    skip = {**DETECTED, "action": "skip", "reason": "replace", "operation": "replace"}
    assert run_note("success", detected=skip, committed={"committed": False}) == (
        "snapshot 42 (replace, #7): skipped (replace: no logical change)"
    )
    assert run_note("success") == "succeeded"
    assert run_note("success", reason="Dag Run's state was manually set to `success`.").startswith(
        "succeeded ("
    )


def test_a_failed_run_names_the_first_failed_task_and_its_error():
    failed = [
        FailedTask("shuffle_read", 1, "AmbiguousUpdateError: key (7,) has 2 DELETE rows"),
        FailedTask("watermark", -1, None),
    ]
    assert run_note("failed", detected=DETECTED, failed=failed) == (
        "snapshot 42 (overwrite, #7): failed at shuffle_read[1]: AmbiguousUpdateError: key (7,) has 2 DELETE "
        "rows (also failed: watermark)"
    )
    # detect failed: no snapshot yet; a busy table is a failure naming the holder, never a silent skip
    lease = [FailedTask("detect", -1, "LeaseHeldError: shop.orders is held by run scheduled__x (epoch 4)")]
    assert run_note("failed", failed=lease) == (
        "failed at detect: LeaseHeldError: shop.orders is held by run scheduled__x (epoch 4)"
    )
    # the failed task recorded no error (killed, found dead by the scheduler)
    assert run_note("failed", detected=DETECTED, failed=[FailedTask("commit")]) == (
        "snapshot 42 (overwrite, #7): commit failed (see its log)"
    )
    # a later task's error explains when the first to fail recorded none
    mixed = [FailedTask("shuffle_write", 0), FailedTask("barrier", -1, "CorruptShuffleError: bad block")]
    assert run_note("failed", failed=mixed) == (
        "failed at barrier: CorruptShuffleError: bad block (also failed: shuffle_write[0])"
    )
    # a person marked the run failed in Airflow's UI: said plainly (test_ui_blocking has the stopped tasks)
    assert run_note("failed", reason="Dag Run's state was manually set to `failed`.") == (
        "marked failed by a person"
    )


# Shaped like an AWS access key id, built at run time so no file holds one.
FAKE_KEY_ID = "AKIA" + "ABCDEFGHIJKLMNOP"


def test_notes_carry_no_secrets_and_fit_airflows_column():
    leaky = [
        FailedTask(
            "detect",
            -1,
            "StorageError: s3://key:hunter2@bucket refused; s3.secret-access-key=abcd1234 "
            f'password: "p4ss word" sc://h:15002/;token=tok123;x {FAKE_KEY_ID}',
        )
    ]
    note = run_note("failed", failed=leaky)
    for secret in ("hunter2", "abcd1234", "p4ss word", "tok123", FAKE_KEY_ID):
        assert secret not in note, note
    assert "s3.secret-access-key=***" in note and "://key:***@bucket" in note
    long = run_note("failed", failed=[FailedTask("detect", -1, "x" * 3000 + " FIX: set the thing")])
    # Cut in the middle: the start and the fix at the end stay.
    assert (
        len(long) == NOTE_LIMIT
        and long.startswith("failed at detect: xxx")
        and long.endswith("set the thing")
    )


def test_the_failure_callback_records_a_scrubbed_error_line(monkeypatch):
    from iceberg_cdc.airflow import policy as task_policy

    class Ti:
        def __init__(self):
            self.pushed = {}

        def xcom_push(self, key, value):
            self.pushed[key] = value

    monkeypatch.setattr(task_policy, "known_secrets", lambda: {"catalog-secret-value"})
    ti = Ti()
    error = RuntimeError("cannot reach catalog with catalog-secret-value\ntraceback follows")
    task_policy.record_error({"exception": error, "ti": ti})
    assert ti.pushed == {task_policy.ERROR_XCOM_KEY: "RuntimeError: cannot reach catalog with ***"}
    quiet = Ti()
    task_policy.record_error({"exception": None, "ti": quiet})  # found dead: nothing to tell
    assert quiet.pushed == {}

    class Broken(Ti):
        def xcom_push(self, key, value):
            raise ConnectionError("API server gone")

    task_policy.record_error({"exception": error, "ti": Broken()})  # logged, never raised


# ---------------------------------------------------------------- history that stays true


def test_a_cleared_run_keeps_its_first_story_and_appends_the_new_one():
    committed = "snapshot 42 (overwrite, #7): +300 -100 ±1,000 updates"
    # The run was cleared and ran again: detect found nothing left, the note must not forget the commit.
    again = merged_note(committed, "caught up")
    assert again == committed + AFTER_CLEAR + "caught up"
    # Cleared twice: each outcome appended, the first story intact.
    twice = merged_note(again, "snapshot 42 (overwrite, #7): already committed")
    assert twice.startswith(committed + AFTER_CLEAR + "caught up" + AFTER_CLEAR)
    # The same outcome again (the listener called twice) changes nothing.
    assert merged_note(twice, "snapshot 42 (overwrite, #7): already committed") == twice
    # A provisional note from the predecessor that queued the run is replaced, not kept.
    assert merged_note("chained: 3 snapshot(s) pending", committed) == committed
    assert (
        merged_note(
            "queued: reprocess of snapshot 5 through 9 (2 left in the range, this one included)", committed
        )
        == committed
    )
    assert merged_note(None, committed) == committed
    # Many clears: the note fits Airflow's column, keeping the first story and the latest outcome.
    note = committed
    for attempt in range(60):
        note = merged_note(note, f"failed at commit: LeaseLostError: attempt {attempt}")
    assert len(note) <= NOTE_LIMIT
    assert note.startswith(committed) and note.endswith("attempt 59")


def test_range_reprocess_notes_name_the_range_and_what_remains():
    ranged = {**DETECTED, "manual": True, "through_snapshot_id": 99, "range_left": 2}
    assert story(ranged, {"committed": True, "inserts": 1}).startswith(
        "snapshot 42 (overwrite, #7, reprocess of 42 through 99, 2 more after this one): +1"
    )
    last = {**ranged, "snapshot_id": 99, "range_left": 0}
    assert "reprocess of 99 through 99, the last one" in story(last, {"committed": True})
    # The watermark's pending count is not the range's: no "0 more pending" in a range's note.
    note = run_note("success", detected=ranged, committed={"committed": True}, mark={"remaining": 0})
    assert "2 more after this one" in note and "pending" not in note
    # The note a chained run of the range starts with names the range and what is left of it.
    mark = {"remaining": 0, "next_conf": {"snapshot_id": "57", "through_snapshot_id": "99"}, "range_left": 2}
    assert (
        chained_note(mark)
        == "queued: reprocess of snapshot 57 through 99 (2 left in the range, this one included)"
    )
    assert chained_note({"remaining": 3, "next_conf": {}}) == "chained: 3 snapshot(s) pending"


def test_detect_warnings_reach_the_story():
    warned = {**DETECTED, "warnings": ["sink shop.changes has 1 snapshot(s) the pipeline did not write"]}
    assert story(warned, {"committed": True, "inserts": 1}).endswith(
        "; ⚠ sink shop.changes has 1 snapshot(s) the pipeline did not write"
    )
    caught_up = {**DETECTED, "action": "caught_up", "snapshot_id": None}
    caught_up["warnings"] = ["sink x has 2 snapshot(s) the pipeline did not write"]
    assert story(caught_up) == "caught up; ⚠ sink x has 2 snapshot(s) the pipeline did not write"


def test_the_failure_callback_knows_the_secrets_an_airflow_connection_supplies(tmp_path, monkeypatch):
    """Without Airflow's private masker: the connections the config names are read through the hook."""
    import json

    import yaml

    from iceberg_cdc.airflow import policy

    config = {
        "catalog": {
            "name": "c",
            "type": "sql",
            "uri": "sqlite:////never/opened.db",
            "airflow_conn_id": "aws_x",
        },
        "shuffle": {"uri": "s3://b/p"},
        "tables": [{"source": "a.b", "sink": "a.c"}],
    }
    (tmp_path / "cdc.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.setenv("CDC_CONFIG", str(tmp_path / "cdc.yaml"))
    password = "conn-secret-" + "pw-4711"
    monkeypatch.setenv(
        "AIRFLOW_CONN_AWS_X", json.dumps({"conn_type": "aws", "login": "u", "password": password})
    )
    assert password in policy.known_secrets()

    class Ti:
        def __init__(self):
            self.pushed = {}

        def xcom_push(self, key, value):
            self.pushed[key] = value

    ti = Ti()
    policy.record_error({"exception": RuntimeError(f"S3 refused {password}"), "ti": ti})
    assert password not in ti.pushed[policy.ERROR_XCOM_KEY] and "***" in ti.pushed[policy.ERROR_XCOM_KEY]

"""A mirror DAG run's note: what the apply did, what the verification found, or where it failed."""

from __future__ import annotations

from iceberg_cdc.run.story import FailedTask, mirror_note

DETECTED = {"action": "apply", "snapshots": 2, "through": {"source_snapshot_id": "42"}}


def test_an_apply_and_its_verification():
    note = mirror_note(
        "success",
        detected=DETECTED,
        applied={"upserted": 1200, "deleted": 3},
        verified={"line": "pg: 10 rows at source snapshot 42, 16 buckets: equal to the source"},
    )
    assert note == (
        "applied 2 changelog snapshot(s) to source snapshot 42: 1,200 upserted, 3 deleted; "
        "verify: pg: 10 rows at source snapshot 42, 16 buckets: equal to the source"
    )


def test_caught_up_and_a_verification_not_due():
    assert (
        mirror_note("success", detected={"action": "caught_up"}, verified={"verified": False}) == "caught up"
    )


def test_a_failed_verification_names_the_task_and_its_error():
    note = mirror_note(
        "failed",
        detected={"action": "caught_up"},
        failed=[FailedTask("verify", -1, "MirrorDriftError: pg: 1 keys differ (1 changed): changed id=7")],
    )
    assert (
        note == "caught up; failed at verify: MirrorDriftError: pg: 1 keys differ (1 changed): changed id=7"
    )

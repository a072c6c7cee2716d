"""What a run may do by how it was started, and how detect waits for a busy table (no Airflow)."""

from __future__ import annotations

import enum

import pytest

from iceberg_cdc.errors import ConfigError
from iceberg_cdc.run.kinds import backfill_refusal, is_backfill, should_chain, trigger_next_choice
from iceberg_cdc.run.lease import RESCHEDULE_SECONDS, lease_wait_step


class RunType(enum.Enum):
    BACKFILL_JOB = "backfill"
    MANUAL = "manual"


def test_backfill_is_recognised_from_the_enum_or_its_value():
    assert is_backfill(RunType.BACKFILL_JOB) and is_backfill("backfill")
    assert not is_backfill(RunType.MANUAL) and not is_backfill(None) and not is_backfill("scheduled")


def test_a_backfill_refuses_reprocess_params_and_says_what_to_do_instead():
    assert backfill_refusal({}) is None
    assert backfill_refusal({"snapshot_id": None, "trigger_next": True}) is None
    message = backfill_refusal({"snapshot_id": 42})
    assert "snapshot_id=42 is not allowed in a backfill" in message and '{"snapshot_id": <id>}' in message
    message = backfill_refusal({"snapshot_id": 1, "through_snapshot_id": 3})
    assert "through_snapshot_id=3" in message and "through_snapshot_id" in message


@pytest.mark.parametrize(
    ("mark", "params", "backfill", "chains"),
    [
        ({"remaining": 2, "next_conf": {}}, {}, False, True),  # scheduled or chained: goes on
        ({"remaining": 0, "next_conf": {}}, {}, False, False),  # caught up
        ({"remaining": 2, "next_conf": {}}, {"trigger_next": False}, False, False),
        ({"remaining": 2, "next_conf": {}}, {}, True, False),  # backfill never chains
        ({"remaining": 2, "next_conf": {}}, {"trigger_next": True}, True, False),
        ({"remaining": 2, "next_conf": {}}, {"snapshot_id": 7}, False, False),  # one reprocess
        ({"remaining": 2, "next_conf": {}}, {"snapshot_id": 7, "trigger_next": True}, False, True),
        # a range reprocess chains within its range, even with nothing pending
        ({"remaining": 0, "next_conf": {"snapshot_id": 8}}, {"snapshot_id": 7}, False, True),
        ({"remaining": 0, "next_conf": {"snapshot_id": 8}}, {"trigger_next": False}, False, False),
        ({"remaining": 0, "next_conf": {"snapshot_id": 8}}, {"snapshot_id": 7}, True, False),
        # the range's last run: no next_conf, and it does not go on to pending snapshots
        ({"remaining": 3, "next_conf": {}}, {"snapshot_id": 9, "through_snapshot_id": 9}, False, False),
    ],
)
def test_when_a_run_chains(mark, params, backfill, chains):
    assert should_chain(mark, params, backfill=backfill) is chains


def step(
    now,
    *,
    waiting_since=0.0,
    holder_since=None,
    try_started=0.0,
    reschedule=True,
    in_process=5.0,
    expired=False,
):
    return lease_wait_step(
        now=now,
        waiting_since=waiting_since,
        holder_since=holder_since,
        holder_expired=expired,
        window=600.0,
        try_started=try_started,
        reschedule=reschedule,
        in_process_seconds=in_process,
    )


def test_under_a_scheduler_a_waiting_detect_polls_briefly_then_gives_its_slot_back():
    assert step(1.0) == ("sleep", 1.0)
    assert step(6.0) == ("reschedule", RESCHEDULE_SECONDS)
    assert step(0.0, in_process=0.0)[0] == "reschedule"  # a backfill's runs queue at once
    assert step(595.0, try_started=590.0, in_process=0.0) == ("reschedule", 5.0)


def test_without_a_scheduler_it_sleeps_in_process():
    assert step(100.0, reschedule=False) == ("sleep", 15.0)
    assert step(599.0, reschedule=False) == ("sleep", 1.0)


def test_the_wait_is_bounded_per_holder():
    assert step(600.0) == ("fail", 0.0)  # one holder for the whole window
    assert step(600.0, holder_since=-50.0) == ("fail", 0.0)  # it held the table before we came
    # the table changed hands (a queue moving on): the clock starts again
    assert step(900.0, holder_since=400.0, try_started=890.0)[0] == "reschedule"
    assert step(1000.0, holder_since=400.0) == ("fail", 0.0)


def test_a_waiter_does_not_give_up_on_a_holder_whose_lease_expired():
    """A dead holder's lease expired: the takeover is at most one TTL away, so the waiter stays."""
    assert step(600.0) == ("fail", 0.0)
    assert step(600.0, expired=True) == ("reschedule", 1.0)
    assert step(700.0, holder_since=-50.0, expired=True)[0] == "reschedule"


@pytest.mark.parametrize(
    ("given", "choice"),
    [(None, None), ("auto", None), ("", None), ("yes", True), ("no", False), (True, True), (False, False)],
)
def test_trigger_next_as_the_form_and_api_callers_give_it(given, choice):
    assert trigger_next_choice(given) is choice


def test_a_bad_trigger_next_is_a_config_error():
    with pytest.raises(ConfigError, match="auto, yes or no"):
        trigger_next_choice("maybe")


def test_airflow_tells_a_dead_task_from_a_run_between_tasks():
    """A task Airflow shows running while its lease expired stopped renewing: 'working' (taken at expiry)."""
    from iceberg_cdc.airflow.policy import airflow_holder_state
    from iceberg_cdc.coordination.lease import LeaseInfo

    class Ti:
        def __init__(self, run_state, task_states):
            self.run_state, self.task_states = run_state, task_states

        def get_dagrun_state(self, dag_id, run_id):
            return self.run_state

        def get_task_states(self, dag_id, run_ids):
            return {run_ids[0]: self.task_states}

    holder = LeaseInfo(
        table="t", owner="r1", acquired_at=None, expires_at=None, host="h", pid=1, token="x", version="",
        uri="u", dag_id="cdc__t",
    )  # fmt: skip
    assert (
        airflow_holder_state(Ti("running", {"commit": "running", "detect": "success"}))(holder) == "working"
    )
    assert airflow_holder_state(Ti("running", {"commit": "queued", "detect": "success"}))(holder) == "running"
    assert airflow_holder_state(Ti("success", {}))(holder) == "finished"
    assert airflow_holder_state(Ti("running", None))(holder) == "running"

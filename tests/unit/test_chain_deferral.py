"""One chain per table: which run processes the next pending snapshot (pure rules, no Airflow).

The end-to-end proof under the real scheduler is tests/integration/test_chained_run_ids.py.
"""

from __future__ import annotations

from types import SimpleNamespace

from iceberg_cdc.airflow.policy import airflow_live_chain
from iceberg_cdc.run.detect import chain_deferral
from iceberg_cdc.run.state import Detected
from iceberg_cdc.run.story import chained_run_id, chained_snapshot, story

BIG = 3250886387068531029  # 19 digits: parsed exactly, never through a float


def test_a_chained_run_id_names_its_snapshot_and_is_read_back_exactly():
    run_id = chained_run_id(BIG, "20260101T000000_000001")
    assert chained_snapshot(run_id) == BIG
    assert chained_snapshot("chained__next__20260101T000000_000001") is None
    assert chained_snapshot("reprocess__s12__x") is None
    assert chained_snapshot("scheduled__2026-01-01T00:00:00+00:00") is None
    assert chained_snapshot(None) is None


def test_a_chained_run_processes_the_snapshot_its_id_names_or_none():
    assert chain_deferral(BIG, BIG, lambda: "chained__s1__x") is None  # never defers to another chain
    superseded = chain_deferral(1081844140337369850, BIG, None)
    assert superseded is not None and superseded.startswith("superseded:")
    assert str(BIG) in superseded and "1081844140337369850" in superseded


def test_another_run_leaves_the_snapshot_to_a_live_chain_and_takes_it_when_there_is_none():
    assert chain_deferral(7, None, lambda: "chained__s7__x") == (
        "left to the chain: run chained__s7__x processes snapshot 7 and those after it"
    )
    assert chain_deferral(7, None, lambda: None) is None
    assert chain_deferral(7, None, None) is None


class FakeTaskInstance:
    """The Task SDK's answer shape: ``{run_id: {task_id: state}}`` for the detect task of every run."""

    def __init__(self, states: dict[str, dict[str, str | None]]) -> None:
        self.states = states
        self.asked: list[dict] = []

    def get_task_states(self, **kwargs):
        self.asked.append(kwargs)
        return self.states


def test_a_live_chain_is_a_chained_run_whose_detect_has_not_finished():
    ti = FakeTaskInstance(
        {
            "chained__s1__a": {"detect": "success"},  # took its snapshot already
            "chained__s2__b": {"detect": "failed"},
            "scheduled__2026": {"detect": None},  # not a chain
            "chained__s3__me": {"detect": "running"},  # the asking run itself
        }
    )
    live = airflow_live_chain(ti, "cdc__shop__orders", "chained__s3__me")
    assert live is not None and live() is None
    assert ti.asked == [{"dag_id": "cdc__shop__orders", "task_ids": ["detect"]}]
    for waiting in (None, "scheduled", "queued", "up_for_reschedule", "running"):
        ti.states["chained__s4__c"] = {"detect": waiting}
        assert live() == "chained__s4__c", waiting
    assert airflow_live_chain(SimpleNamespace(), "d", "r") is None  # no Task SDK behind it: nothing to ask


def test_a_run_that_left_its_snapshot_to_the_chain_does_not_say_caught_up():
    reason = chain_deferral(7, None, lambda: "chained__s7__x")
    detected = Detected(
        action="caught_up",
        source="shop.orders",
        sink="shop.orders_changes",
        run_id="r",
        epoch=1,
        lease_ttl=60.0,
        reason=reason,
    )
    assert story(detected) == f"nothing processed ({reason})"

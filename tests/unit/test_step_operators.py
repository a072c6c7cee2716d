"""The run's step operators around their (stubbed) steps: what commit emits and reports, what the others hand on.

The steps themselves are tested against real tables elsewhere; here only
what the operators add: commit's conditional asset event, its XCom and its
OpenLineage datasets, write_jobs' hand-on of one of detect's lists.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk import Asset, AssetAlias

from iceberg_cdc.airflow.operators import steps as step_operators
from iceberg_cdc.airflow.operators.steps import CommitOperator, JobListOperator

DETECTED = {
    "source": "shop.orders",
    "sink": "shop.orders_changes",
    "snapshot_id": 7160431405937117436,
    "ordinal": 3,
    "operation": "overwrite",
    "source_location": "s3://w/shop/orders",
    "sink_location": "s3://w/shop/orders_changes",
}


class _Events(dict):
    """Airflow's ``outlet_events``: an accessor per outlet, whose ``add`` records an asset event."""

    def __missing__(self, key: Any) -> Any:
        added: list[tuple[Any, dict]] = []
        accessor = SimpleNamespace(added=added, add=lambda asset, extra: added.append((asset, extra)))
        self[key] = accessor
        return accessor


@pytest.fixture
def commit(monkeypatch) -> CommitOperator:
    import iceberg_cdc.run.lease
    import iceberg_cdc.run.steps
    import iceberg_cdc.run.story

    monkeypatch.setattr(iceberg_cdc.run.lease, "kept_alive", lambda ctx, detected: contextlib.nullcontext())
    monkeypatch.setattr(iceberg_cdc.run.story, "story", lambda detected, committed: "the story")
    monkeypatch.setattr(CommitOperator, "run_context", lambda self: "ctx")
    monkeypatch.setattr(step_operators, "emit_safely", lambda *args: None)
    monkeypatch.setattr(
        step_operators, "changelog_datasets", lambda detected, committed: (detected, committed)
    )
    alias, asset = AssetAlias(name="cdc:shop.orders_changes:commits"), Asset(name="cdc:shop.orders_changes")
    return CommitOperator(task_id="commit", source="shop.orders", alias=alias, asset=asset)


def _run(operator: CommitOperator, monkeypatch, committed: dict[str, Any]) -> tuple[dict, _Events]:
    import iceberg_cdc.run.steps

    monkeypatch.setattr(iceberg_cdc.run.steps, "commit", lambda ctx, detected: dict(committed))
    events = _Events()
    ti = SimpleNamespace(xcom_pull=lambda task_ids: DETECTED if task_ids == "detect" else None)
    return operator.execute({"ti": ti, "outlet_events": events}), events


def test_commit_emits_the_sink_event_only_when_rows_were_committed(commit, monkeypatch):
    result, events = _run(
        commit, monkeypatch, {"committed": True, "snapshot_id": 7160431405937117436, "inserts": 4}
    )
    [(asset, extra)] = events[commit.alias].added
    assert asset is commit.asset and commit.outlets == [commit.alias]
    assert (
        extra["snapshot_id"] == "7160431405937117436"
        and extra["inserts"] == 4
        and extra["story"] == "the story"
    )
    assert result["snapshot_id"] == "7160431405937117436"  # as text: browsers round 19-digit numbers

    idle, events = _run(commit, monkeypatch, {"committed": False, "reason": "caught up"})
    assert events[commit.alias].added == [] and idle["story"] == "the story"


def test_commit_reports_what_it_read_and_wrote_to_openlineage(commit, monkeypatch):
    assert commit.lineage_datasets(None) == ([], [])  # before it ran: nothing
    result, _ = _run(commit, monkeypatch, {"committed": True, "snapshot_id": 1})
    assert commit.lineage_datasets(None) == (DETECTED, result)
    _run(commit, monkeypatch, {"committed": False})
    monkeypatch.setattr(commit, "_lineage_detected", {**DETECTED, "snapshot_id": None})
    assert commit.lineage_datasets(None) == ([], [])  # caught up: the run read nothing


def test_a_job_list_is_one_of_detects_lists_and_detect_is_its_upstream():
    from airflow.sdk import DAG

    with DAG("d", schedule=None):
        detect = JobListOperator(task_id="detect", detected={}, key="unused")
        write = JobListOperator(task_id="write_jobs", detected=detect.output, key="write_args")
        insert = JobListOperator(task_id="insert_jobs", detected=detect.output, key="insert_args")
    assert write.upstream_task_ids == insert.upstream_task_ids == {"detect"}
    for operator in (write, insert):  # as Airflow renders the XComArg
        operator.detected = {"write_args": [["w1"], ["w2"]], "insert_args": []}
    assert write.execute({}) == [["w1"], ["w2"]] and insert.execute({}) == []

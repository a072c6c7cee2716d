"""Detect's record: typed in the steps, JSON in XCom, snapshot ids exact both ways."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from iceberg_cdc.errors import ConfigError
from iceberg_cdc.run.state import Detected, snapshot_id_or_none

RUN = {"source": "shop.orders", "sink": "shop.orders_changes", "run_id": "r1", "epoch": 3, "lease_ttl": 60.0}


@given(st.integers(min_value=1, max_value=2**63 - 1), st.integers(min_value=1, max_value=2**63 - 1))
def test_xcom_form_round_trips_63_bit_ids_exactly_through_json(snapshot_id, last):
    detected = Detected(
        action="shuffle",
        snapshot_id=snapshot_id,
        through_snapshot_id=last,
        next_in_range=last,
        ordinal=7,
        identifier_columns=("id",),
        write_args=(("--phase", "write", "--plan", "k", "--group", "0", "--label", "write 1/1"),),
        write_task_ids=("t1",),
        **RUN,
    )
    xcom = json.loads(json.dumps(detected.to_xcom()))
    # Where a browser sees the XCom, ids are strings: a JSON number above 2^53 would be rounded.
    assert xcom["snapshot_id"] == str(snapshot_id) and xcom["through_snapshot_id"] == str(last)
    assert Detected.of(xcom) == detected


def test_of_accepts_the_record_and_ignores_unknown_keys():
    detected = Detected(action="caught_up", **RUN)
    assert Detected.of(detected) is detected
    assert Detected.of({**detected.to_xcom(), "added_by_a_newer_version": 1}) == detected


def test_bad_values_are_refused_by_name():
    with pytest.raises(ValueError, match="unknown action 'maybe'"):
        Detected(action="maybe", **RUN)  # type: ignore[arg-type]
    # The pipeline's own error, naming the value and the fix (a user typed it).
    with pytest.raises(ConfigError, match="'12ab' is not a snapshot id"):
        snapshot_id_or_none("12ab")
    with pytest.raises(ConfigError, match="is a boolean"):
        snapshot_id_or_none(True)
    with pytest.raises(ConfigError, match="floating-point"):
        snapshot_id_or_none(5.200992516889735e18)
    assert snapshot_id_or_none(" 5200992516889735211 ") == 5200992516889735211
    assert snapshot_id_or_none("") is None and snapshot_id_or_none(None) is None

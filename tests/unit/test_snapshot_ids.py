"""Snapshot ids travel as strings of digits and are read back exactly, or refused naming the fix."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from iceberg_cdc.errors import ConfigError
from iceberg_cdc.snapshot_ids import PATTERN, as_text, parse

LONG = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@given(LONG)
def test_every_64_bit_id_reads_back_exactly_from_its_text_and_as_an_integer(snapshot_id):
    text = as_text(snapshot_id)
    assert text is not None and parse(text) == snapshot_id == parse(snapshot_id)
    assert parse(f"  {text} ") == snapshot_id


def test_no_id_is_none():
    assert parse(None) is None and parse("") is None and parse("   ") is None and as_text(None) is None


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (5200992516889735211.0, "floating-point"),  # what a browser makes of the id: rounded
        (float(2**53), "floating-point"),
        (True, "boolean"),
        (2**63, "64-bit"),
        (-(2**63) - 1, "64-bit"),
        ("9223372036854775808", "64-bit"),
        ("12a", "digits only"),
        ([1], "digits only"),
    ],
)
def test_what_is_not_an_exact_id_is_refused_naming_the_field_and_the_fix(value, why):
    with pytest.raises(ConfigError, match=why) as refused:
        parse(value, "since_snapshot_id")
    assert str(refused.value).startswith("since_snapshot_id=")
    assert "Give the id as a string of digits" in str(refused.value)


def test_small_whole_floats_are_exact_and_accepted():
    assert parse(42.0) == 42 and parse(float(2**53 - 1)) == 2**53 - 1


def test_the_params_pattern_accepts_what_parse_reads():
    import re

    assert re.match(PATTERN, "5200992516889735211") and not re.match(PATTERN, "5.2e18")

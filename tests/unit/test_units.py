"""Byte sizes: one convention (binary units written KiB/MiB/GiB/TiB) for every figure shown or parsed."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from iceberg_cdc.units import (
    UNITS,
    GiB,
    KiB,
    MiB,
    TiB,
    format_bytes,
    format_duration,
    format_size,
    parse_size,
)


@pytest.mark.parametrize(
    ("size", "shown"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (794 * KiB, "794.0 KiB"),
        (64 * MiB, "64.0 MiB"),
        (int(2.25 * GiB), "2.2 GiB"),  # one decimal, rounded half to even as Python formats
        (3 * TiB, "3.0 TiB"),
        (5000 * TiB, "5000.0 TiB"),  # no unit above TiB
    ],
)
def test_sizes_for_people(size, shown):
    assert format_bytes(size) == shown


def test_every_unit_is_binary_and_written_with_i():
    assert [name for name, _ in UNITS] == ["B", "KiB", "MiB", "GiB", "TiB"]
    assert [factor for _, factor in UNITS] == [1024**n for n in range(5)]


@pytest.mark.parametrize("text", ["64MB", "64MiB", "64 mb", "64m", "64 MIB", "65536k", "0.0625GiB"])
def test_the_config_reads_spark_style_sizes_as_binary(text):
    assert parse_size(text) == 64 * MiB


@pytest.mark.parametrize("bad", ["", "MB", "-1MB", "1.5 PB", "lots", True, 0, -5])
def test_sizes_that_are_not_sizes_are_refused(bad):
    with pytest.raises(ValueError):
        parse_size(bad)


def test_the_refusal_names_the_value_and_the_convention():
    with pytest.raises(ValueError, match=r"'lots' is not a size; write e\.g\. 64MiB"):
        parse_size("lots")


@pytest.mark.parametrize(
    ("size", "written"), [(64 * MiB, "64MiB"), (1536 * KiB, "1536KiB"), (GiB, "1GiB"), (1000, "1000B")]
)
def test_exact_sizes_are_written_in_the_largest_unit_that_divides_them(size, written):
    assert format_size(size) == written


@given(st.integers(min_value=1, max_value=2**62))
def test_exact_sizes_read_back_as_written(size):
    assert parse_size(format_size(size)) == size


@given(st.integers(min_value=0, max_value=2**50))
@example(11520)  # 11.25 KiB, a tie: shown 11.2, exactly half a shown decimal away
def test_shown_sizes_are_within_rounding_of_the_value(size):
    number, unit = format_bytes(size).split(" ")
    factor = dict(UNITS)[unit]
    # Half of the last shown decimal, and the float product's own error (11.2 * 1024 is 11468.799...).
    assert abs(float(number) * factor - size) <= 0.05 * factor * (1 + 1e-9)
    assert unit == "TiB" or float(number) < 1024.05


def test_format_duration_shows_the_two_largest_units():
    assert format_duration(0) == "0 s"
    assert format_duration(-5) == "0 s"
    assert format_duration(59.9) == "59 s"
    assert format_duration(61) == "1 min 1 s"
    assert format_duration(3 * 86400 + 4 * 3600 + 5) == "3 d 4 h"
    assert format_duration(2 * 3600 + 5 * 60) == "2 h 5 min"
    assert format_duration(2 * 3600 + 5) == "2 h 5 s"

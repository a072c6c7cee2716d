"""Coalescer: Spark's packing, small-range merging, skew reporting."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iceberg_cdc.shuffle.coalesce import coalesce, total_partition_sizes

MiB = 1024 * 1024


def spans(plan):
    return [(r.start, r.end) for r in plan.ranges]


def test_spark_documented_example():
    # ShufflePartitionsUtil's doc: two shuffles, target 128 MiB.
    sizes = total_partition_sizes([[100, 20, 100, 10, 30], [10, 10, 70, 5, 5]]) * MiB
    plan = coalesce(sizes, 128 * MiB, min_size=0)
    assert spans(plan) == [(0, 1), (1, 2), (2, 3), (3, 5)]
    assert [r.size for r in plan.ranges] == [110 * MiB, 30 * MiB, 170 * MiB, 50 * MiB]


def test_empty_partitions_are_skipped_and_trimmed():
    plan = coalesce([0, 5, 0, 0, 5, 0, 0], 100, min_size=0)
    assert spans(plan) == [(1, 5)]
    assert plan.ranges[0].size == 10


def test_all_empty_gives_no_ranges():
    assert coalesce([0] * 64, 100).ranges == []


def test_large_partition_stays_alone_and_is_reported_as_skew():
    sizes = [10] * 10 + [10_000] + [10] * 10
    plan = coalesce(sizes, 100, min_size=0, skew_factor=5, skew_min_bytes=0)
    assert (10, 11) in spans(plan)
    assert [s.partition for s in plan.skewed] == [10]
    assert plan.skewed[0].median == 10


def test_small_tail_merges_into_smaller_neighbour():
    # Greedy gives [0,1) 90, [1,2) 90, [2,3) 5; the 5-byte tail joins its only neighbour.
    plan = coalesce([90, 90, 5], 100, min_size=20)
    assert spans(plan) == [(0, 1), (1, 3)]


def test_small_middle_merges_into_the_smaller_side():
    plan = coalesce([95, 3, 99], 100, min_size=20)
    assert spans(plan) == [(0, 2), (2, 3)]


def test_bad_arguments():
    with pytest.raises(ValueError, match="positive"):
        coalesce([1], 0)
    with pytest.raises(ValueError, match="half the target"):
        coalesce([1], 100, min_size=60)
    with pytest.raises(ValueError, match="negative"):
        coalesce([-1], 100)


sizes_strategy = st.lists(
    st.one_of(st.just(0), st.integers(1, 50), st.integers(1, 5000)), min_size=1, max_size=300
)


@settings(max_examples=300, deadline=None)
@given(sizes=sizes_strategy, target=st.integers(1, 3000), min_fraction=st.floats(0, 0.5))
def test_coalesce_properties(sizes, target, min_fraction):
    min_size = int(target * min_fraction)
    plan = coalesce(sizes, target, min_size)
    sizes = np.asarray(sizes)
    covered = np.zeros(len(sizes), dtype=int)
    previous_end = 0
    for r in plan.ranges:
        assert previous_end <= r.start < r.end <= len(sizes)  # sorted, disjoint, non-empty span
        previous_end = r.end
        covered[r.start : r.end] += 1
        assert r.size == sizes[r.start : r.end].sum() > 0
        assert sizes[r.start] > 0 and sizes[r.end - 1] > 0  # trimmed to non-empty ends
        largest = sizes[r.start : r.end].max()
        assert r.size <= max(target, largest) + 2 * min_size
        if len(plan.ranges) > 1:
            assert r.size >= min_size
    # every non-empty partition is in exactly one range
    assert (covered[sizes > 0] == 1).all()
    assert plan.total_size == sizes.sum()


@settings(max_examples=100, deadline=None)
@given(sizes=sizes_strategy, target=st.integers(1, 3000))
def test_without_min_size_only_single_partitions_exceed_target(sizes, target):
    for r in coalesce(sizes, target, 0).ranges:
        if r.size > target:
            assert np.count_nonzero(np.asarray(sizes[r.start : r.end])) == 1

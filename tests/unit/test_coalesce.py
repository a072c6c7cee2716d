"""Coalescer: Spark's packing, small-range merging, skew reporting."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iceberg_cdc.shuffle.coalesce import coalesce, packing_target, total_partition_sizes

MiB = 1024 * 1024


def spans(plan):
    return [(r.start, r.end) for r in plan.ranges]


def test_spark_documented_example():
    # ShufflePartitionsUtil's doc: two shuffles, target 128 MiB.
    sizes = total_partition_sizes([[100, 20, 100, 10, 30], [10, 10, 70, 5, 5]], 5) * MiB
    plan = coalesce(sizes, 128 * MiB, min_size=0)
    assert spans(plan) == [(0, 1), (1, 2), (2, 3), (3, 5)]
    assert [r.size for r in plan.ranges] == [110 * MiB, 30 * MiB, 170 * MiB, 50 * MiB]


def test_partition_sizes_sum_over_outputs_of_one_partition_count():
    assert total_partition_sizes([], 3).tolist() == [0, 0, 0]  # a snapshot with no map output
    with pytest.raises(ValueError, match="3 partition sizes per map output"):
        total_partition_sizes([[1, 2, 3], [1, 2]], 3)
    with pytest.raises(ValueError, match="3 partition sizes per map output"):
        total_partition_sizes([[1, 2, 3, 4]], 3)


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


def test_a_shuffle_under_min_ranges_targets_is_spread_over_min_ranges():
    # 80 MiB in 64 partitions at a 64 MiB target: one full range and a 16 MiB one, so one read
    # task would do four fifths of the work; with two cores to read it, two ranges of 40 MiB.
    sizes = [int(1.25 * MiB)] * 64
    assert spans(coalesce(sizes, 64 * MiB)) == [(0, 51), (51, 64)]
    assert spans(coalesce(sizes, 64 * MiB, min_ranges=2)) == [(0, 32), (32, 64)]
    assert spans(coalesce(sizes, 64 * MiB, min_ranges=4)) == [(0, 16), (16, 32), (32, 48), (48, 64)]


def test_spreading_never_packs_below_min_size():
    # 20 MiB over 8 cores: the target stops at min_size (12.8 MiB), so two ranges, not eight.
    sizes = [int(1.25 * MiB)] * 16
    plan = coalesce(sizes, 64 * MiB, min_ranges=8)
    assert len(plan.ranges) == 2
    assert packing_target(20 * MiB, 64 * MiB, int(12.8 * MiB), 8) == (int(12.8 * MiB), int(6.4 * MiB))
    # a shuffle of at least min_ranges targets is packed to the target as before
    assert packing_target(300 * MiB, 64 * MiB, 12 * MiB, 2) == (64 * MiB, 12 * MiB)


def test_bad_arguments():
    with pytest.raises(ValueError, match="positive"):
        coalesce([1], 0)
    with pytest.raises(ValueError, match="half the target"):
        coalesce([1], 100, min_size=60)
    with pytest.raises(ValueError, match="negative"):
        coalesce([-1], 100)
    with pytest.raises(ValueError, match="min_ranges"):
        coalesce([1], 100, min_ranges=0)


sizes_strategy = st.lists(
    st.one_of(st.just(0), st.integers(1, 50), st.integers(1, 5000)), min_size=1, max_size=300
)


@settings(max_examples=300, deadline=None)
@given(
    sizes=sizes_strategy,
    target=st.integers(1, 3000),
    min_fraction=st.floats(0, 0.5),
    min_ranges=st.one_of(st.just(1), st.integers(1, 8)),
)
def test_coalesce_properties(sizes, target, min_fraction, min_ranges):
    min_size = int(target * min_fraction)
    plan = coalesce(sizes, target, min_size, min_ranges=min_ranges)
    spread = min(target, -(-sum(sizes) // min_ranges))  # the share of one of min_ranges readers
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
        assert r.size <= max(spread, min_size, largest) + 2 * min_size
        if len(plan.ranges) > 1:
            assert r.size >= (min_size if min_ranges == 1 else min_size // 2)
    # every non-empty partition is in exactly one range
    assert (covered[sizes > 0] == 1).all()
    assert plan.total_size == sizes.sum()


@settings(max_examples=100, deadline=None)
@given(sizes=sizes_strategy, target=st.integers(1, 3000))
def test_without_min_size_only_single_partitions_exceed_target(sizes, target):
    for r in coalesce(sizes, target, 0).ranges:
        if r.size > target:
            assert np.count_nonzero(np.asarray(sizes[r.start : r.end])) == 1


# -- the linear-time small-range merge gives the ranges the quadratic one gave -------------------


def _greedy_before(sizes: np.ndarray, target: int) -> list[list[int]]:
    """The packing as it was before the heap-based merge (a scan per partition)."""
    groups: list[list[int]] = []
    current: list[int] | None = None
    for partition in np.flatnonzero(sizes):
        size = int(sizes[partition])
        if current is not None and current[2] + size <= target:
            current[1] = int(partition) + 1
            current[2] += size
        else:
            current = [int(partition), int(partition) + 1, size]
            groups.append(current)
    return groups


def _merge_small_before(groups: list[list[int]], min_size: int) -> list[list[int]]:
    """The small-range merge as it was: a scan of every group for each merge (O(G^2))."""
    while len(groups) > 1:
        sizes = [g[2] for g in groups]
        smallest = min(range(len(groups)), key=lambda i: (sizes[i], i))
        if sizes[smallest] >= min_size:
            break
        if smallest == 0:
            other = 1
        elif smallest == len(groups) - 1:
            other = smallest - 1
        else:
            other = smallest - 1 if sizes[smallest - 1] <= sizes[smallest + 1] else smallest + 1
        low, high = sorted((smallest, other))
        groups[low] = [groups[low][0], groups[high][1], groups[low][2] + groups[high][2]]
        del groups[high]
    return groups


many_small = st.lists(
    st.one_of(st.just(0), st.integers(1, 20), st.integers(1, 400)), min_size=1, max_size=600
)


@settings(max_examples=400, deadline=None)
@given(
    sizes=st.one_of(sizes_strategy, many_small),
    target=st.integers(1, 3000),
    min_fraction=st.floats(0, 0.5),
)
def test_heap_merge_gives_the_ranges_the_quadratic_merge_gave(sizes, target, min_fraction):
    min_size = int(target * min_fraction)
    before = _merge_small_before(_greedy_before(np.asarray(sizes, dtype=np.int64), target), min_size)
    plan = coalesce(sizes, target, min_size)
    assert [(r.start, r.end, r.size) for r in plan.ranges] == [tuple(g) for g in before]


def test_thousands_of_small_ranges_merge_as_before():
    # The shape that made the scan quadratic: small partitions that cannot join a large
    # neighbour, so half the ranges are below the minimum (P = 16 k of them took 11.5 s).
    rng = np.random.default_rng(5)
    sizes = np.where(
        np.arange(3000) % 2 == 0, rng.integers(1, 10, size=3000), rng.integers(92, 100, size=3000)
    )
    sizes[rng.integers(0, 3000, size=300)] = 0
    before = _merge_small_before(_greedy_before(sizes, 100), 40)
    plan = coalesce(sizes, 100, 40)
    assert len(plan.ranges) < 2000  # most small ranges were merged
    assert [(r.start, r.end, r.size) for r in plan.ranges] == [tuple(g) for g in before]

"""Nearest-rank percentiles, the one definition every benchmark figure (p50, p95) uses."""

from __future__ import annotations


def nearest_rank(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile (p50 of 10 values: the 5th smallest); no interpolation, always a measured value."""
    if not values:
        raise ValueError("a percentile of no values: measure at least one")
    ordered = sorted(values)
    rank = max(1, -(-int(fraction * 100) * len(ordered) // 100))
    return ordered[rank - 1]

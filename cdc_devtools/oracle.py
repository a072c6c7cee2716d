"""A slow, obviously-correct changelog oracle in plain Python, for tests only.

It implements the semantics of the design notes row by row with Counters, so
the vectorized merge can be checked against it on random inputs.
"""

from __future__ import annotations

import math
import struct
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any


def freeze(value: Any) -> Any:
    """A hashable form of a Python value from ``to_pylist``, equal exactly when Spark's values are.

    Floats compare by their bits (so ``-0.0`` differs from ``0.0``), except
    that every NaN is one value whatever its payload or sign (Java's
    ``Double.equals``; design notes, semantics rule 7).
    """
    if isinstance(value, float):
        return ("f", "NaN") if math.isnan(value) else ("f", struct.pack(">d", value))
    if isinstance(value, dict):
        return ("d", tuple((k, freeze(v)) for k, v in value.items()))
    if isinstance(value, list):
        # maps come back as lists of (key, value) tuples; lists as lists
        return ("l", tuple(freeze(v) for v in value))
    if isinstance(value, tuple):
        return ("t", tuple(freeze(v) for v in value))
    return value


def row_key(row: dict, names: Sequence[str]) -> tuple:
    return tuple(freeze(row[name]) for name in names)


class Ambiguous(Exception):
    pass


def expected_changes(
    deleted: Iterable[dict], inserted: Iterable[dict], names: Sequence[str], ids: Sequence[str] | None
) -> Counter:
    """Multiset of (frozen row, change type) the merge must produce."""
    removed = Counter(row_key(r, names) for r in deleted)
    added = Counter(row_key(r, names) for r in inserted)
    left_removed = removed - added
    left_added = added - removed
    out: Counter = Counter()
    if not ids:
        for row, n in left_removed.items():
            out[(row, "DELETE")] += n
        for row, n in left_added.items():
            out[(row, "INSERT")] += n
        return out
    positions = [names.index(i) for i in ids]
    by_key: dict[tuple, list[list[tuple]]] = defaultdict(lambda: [[], []])
    for row, n in left_removed.items():
        by_key[tuple(row[p] for p in positions)][0].extend([row] * n)
    for row, n in left_added.items():
        by_key[tuple(row[p] for p in positions)][1].extend([row] * n)
    for key, (dels, adds) in by_key.items():
        if len(dels) > 1 or len(adds) > 1:
            raise Ambiguous(key)
        if dels and adds:
            out[(dels[0], "UPDATE_BEFORE")] += 1
            out[(adds[0], "UPDATE_AFTER")] += 1
        elif dels:
            out[(dels[0], "DELETE")] += 1
        else:
            out[(adds[0], "INSERT")] += 1
    return out


def actual_changes(rows: Iterable[dict], names: Sequence[str]) -> Counter:
    return Counter((row_key(r, names), r["_change_type"]) for r in rows)

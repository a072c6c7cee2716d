"""Byte sizes and durations, each in one convention.

Sizes: binary units, written ``KiB``, ``MiB``, ``GiB``, ``TiB``.

Run notes, the CDC view, logs, Spark job labels and config messages all show
sizes through this module, so a figure reads the same wherever it appears (a
``64MiB`` target in the config is ``64.0 MiB`` in a note, never ``67.1 MB``).
The config accepts the unit letters Spark accepts -- ``64MB``, ``64MiB``,
``64m``, ``64 mb`` are all 64 x 2^20 bytes, as ``spark.sql.adaptive`` reads
them -- and writes back the unambiguous ``64MiB``.

Durations: the config reads ``500ms``, ``30s``, ``15min``/``15m``, ``24h``,
``3d`` or a number of seconds; people are shown the two largest units
(``3 d 4 h``, ``2 h 5 min``, ``40 s``) -- in notes, lease messages, the
freshness alert and the CDC view alike.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40

# Every unit, smallest first: the one table formatting and parsing share.
UNITS: tuple[tuple[str, int], ...] = (("B", 1), ("KiB", KiB), ("MiB", MiB), ("GiB", GiB), ("TiB", TiB))
_BY_LETTER = {name[0].lower(): factor for name, factor in UNITS}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|d)?\s*$", re.IGNORECASE)
_DURATION_UNITS = {"ms": 0.001, "s": 1, "": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
# Shown largest first: the two largest that apply.
_SHOWN_DURATION_UNITS: tuple[tuple[str, int], ...] = (("d", 86400), ("h", 3600), ("min", 60), ("s", 1))
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)\s*$", re.IGNORECASE)


def format_bytes(size: float) -> str:
    """A size for people: ``512 B``, ``1.5 KiB``, ``64.0 MiB``, ``2.3 TiB`` (one decimal above bytes)."""
    value = float(size)
    for name, factor in UNITS:
        if abs(value) < factor * KiB or name == UNITS[-1][0]:
            return f"{value:.0f} B" if factor == 1 else f"{value / factor:.1f} {name}"
    raise AssertionError("unreachable")


def format_size(size: int) -> str:
    """An exact size as :func:`parse_size` reads it: ``67108864`` -> ``64MiB``, ``1000`` -> ``1000B``.

    The largest unit that divides the size, so nothing is rounded.
    """
    for name, factor in reversed(UNITS[1:]):
        if size >= factor and size % factor == 0:
            return f"{size // factor}{name}"
    return f"{size}B"


def parse_size(value: Any) -> int:
    """Bytes from ``64MiB`` / ``64MB`` / ``512 KiB`` / ``1.5g`` / an int; units are binary, as in Spark.

    Raises ``ValueError`` naming the value for anything else, zero and negative sizes included.
    """
    if isinstance(value, bool):
        raise ValueError("expected a size such as 64MiB")
    if isinstance(value, int):
        size = value
    else:
        match = _SIZE.match(str(value))
        if not match:
            raise ValueError(f"{value!r} is not a size; write e.g. 64MiB, 512KiB or 1GiB")
        # Decimal, not float: a size of 2^53 bytes or more must read back exactly.
        size = int(Decimal(match.group(1)) * _BY_LETTER.get(match.group(2)[:1].lower(), 1))
    if size <= 0:
        raise ValueError(f"size must be positive, got {value!r}")
    return size


def parse_duration(value: Any) -> float:
    """Seconds from ``24h`` / ``90min`` / ``3d`` / ``500ms`` / a number of seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 24h")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(f"{value!r} is not a duration; write e.g. 30s, 15min, 24h or 3d")
        seconds = float(match.group(1)) * _DURATION_UNITS[(match.group(2) or "").lower()]
    if seconds <= 0:
        raise ValueError(f"duration must be positive, got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """``3 d 4 h``, ``2 h 5 min``, ``40 s``: the two largest units, whole, never negative."""
    seconds = max(0, int(seconds))
    parts: list[str] = []
    for unit, size in _SHOWN_DURATION_UNITS:
        if seconds >= size or (unit == "s" and not parts):
            parts.append(f"{seconds // size} {unit}")
            seconds %= size
        if len(parts) == 2:
            break
    return " ".join(parts)

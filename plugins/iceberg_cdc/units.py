"""Byte sizes, in one convention: binary units, written ``KiB``, ``MiB``, ``GiB``, ``TiB``.

Run notes, the CDC view, logs, Spark job labels and config messages all show
sizes through this module, so a figure reads the same wherever it appears (a
``64MiB`` target in the config is ``64.0 MiB`` in a note, never ``67.1 MB``).
The config accepts the unit letters Spark accepts -- ``64MB``, ``64MiB``,
``64m``, ``64 mb`` are all 64 x 2^20 bytes, as ``spark.sql.adaptive`` reads
them -- and writes back the unambiguous ``64MiB``.
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

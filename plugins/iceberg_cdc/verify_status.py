"""What a mirror's verification found, and the one rule of when that counts as equal.

Its values are the strings the verification's XCom, its stored record and
the CLI's report carry (a ``StrEnum``: JSON holds the same strings as
before). Every consumer -- the verify step and CLI (``MirrorDriftError``),
the ``verify.equal`` metric, the lineage assertion ``equal_to_source`` --
asks :func:`is_equal`, so none of them can disagree on a status. A
top-level module: the ``run`` metrics and the ``mirror`` check both use it,
and neither package may import the other's.
"""

from __future__ import annotations

import enum


class VerifyStatus(enum.StrEnum):
    EQUAL = "equal"  # the mirror held exactly its source's rows
    DRIFT = "drift"  # keys differ and were left (no repair, or the repair did not take)
    REPAIRED = "repaired"  # keys differed and the repair rewrote every one of them
    NOT_APPLIED = "not_applied"  # no apply yet: the mirror holds nothing to differ from its source

    @property
    def is_equal(self) -> bool:
        """Whether no drift is left: the verification passes (no alert, no ``MirrorDriftError``)."""
        return self in _EQUAL


_EQUAL = frozenset({VerifyStatus.EQUAL, VerifyStatus.REPAIRED, VerifyStatus.NOT_APPLIED})


def is_equal(status: str | None) -> bool:
    """:attr:`VerifyStatus.is_equal` of a status read back from JSON; an unknown one is not equal."""
    try:
        return VerifyStatus(status).is_equal
    except ValueError:
        return False


__all__ = ["VerifyStatus", "is_equal"]

"""The kinds of change a change feed row carries, and the column that carries them.

One definition for the merge that produces the column and the sink schema
that stores and checks it. The names are the ones Iceberg Spark's changelog
view writes (``_change_type``: ``INSERT``, ``DELETE``, ``UPDATE_BEFORE``,
``UPDATE_AFTER``), so a reader of the sink sees the same vocabulary.
"""

from __future__ import annotations

import enum

CHANGE_TYPE_COLUMN = "_change_type"


class ChangeType(enum.IntEnum):
    """A change row's kind; the value is the merge's internal code (DELETEs sort first)."""

    DELETE = 0
    INSERT = 1
    UPDATE_BEFORE = 2
    UPDATE_AFTER = 3


# Every change type's name, in the order the docs and messages list them.
CHANGE_TYPES: tuple[str, ...] = (
    ChangeType.INSERT.name,
    ChangeType.DELETE.name,
    ChangeType.UPDATE_BEFORE.name,
    ChangeType.UPDATE_AFTER.name,
)

"""What the Iceberg mirror target tells about itself: its watermark and its last apply.

The read side of the target (the CDC view, freshness checks, verification); the
write side is :mod:`.steps`, which exports these too, as the target's interface.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyiceberg.exceptions import NoSuchTableError

from iceberg_cdc.mirror.iceberg.table import last_apply as table_last_apply
from iceberg_cdc.mirror.iceberg.table import read_mirror_watermark


def _mirror_table(ctx: Any, mirror: Any) -> Any:
    """The mirror's Iceberg table, or None before its first apply created it."""
    name = mirror.get("table") if isinstance(mirror, Mapping) else mirror.table
    try:
        return ctx.catalog().load_table(str(name))
    except NoSuchTableError:
        return None


def watermark(ctx: Any, mirror: Any) -> Any:
    """The mirror's watermark: the last changelog snapshot applied (None: the mirror is new or empty).

    A ``ChangelogMark`` of the mirror core when it is installed, else this
    target's own :class:`~.inputs.Through` (same fields).
    """
    table = _mirror_table(ctx, mirror)
    mark = None if table is None else read_mirror_watermark(table)
    if mark is None:
        return None
    try:
        from iceberg_cdc.mirror.net_changes import ChangelogMark
    except ImportError:
        return mark
    return ChangelogMark(mark.changelog_snapshot_id, mark.source_snapshot_id, mark.ordinal)


def last_apply(ctx: Any, mirror: Any) -> dict | None:
    """The mirror's last apply as its snapshot summary recorded it (:func:`.table.last_apply`; None: none yet)."""
    table = _mirror_table(ctx, mirror)
    return None if table is None else table_last_apply(table)


__all__ = ["last_apply", "watermark"]

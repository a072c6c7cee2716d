"""Where a mirror's rows go: the PostgreSQL target here, the Iceberg target as a plug-in.

The Iceberg target lives in ``iceberg_cdc.mirror.iceberg`` (its own package,
see :mod:`iceberg_cdc.mirror`); until it is installed, a mirror of ``type:
iceberg`` fails its run with :class:`~iceberg_cdc.errors.MirrorUnavailableError`
naming the fix, and its DAG keeps its shape.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from iceberg_cdc.config import MirrorConfig
from iceberg_cdc.errors import MirrorUnavailableError
from iceberg_cdc.mirror.net_changes import ChangelogMark
from iceberg_cdc.mirror.postgres.connection import dsn_for
from iceberg_cdc.mirror.postgres.target import PostgresTarget

ICEBERG_STEPS = "iceberg_cdc.mirror.iceberg.steps"


def iceberg_available() -> bool:
    """Whether the Iceberg mirror target is installed."""
    try:
        importlib.import_module(ICEBERG_STEPS)
    except ModuleNotFoundError:
        return False
    return True


def iceberg_steps(mirror: MirrorConfig) -> ModuleType:
    """The Iceberg target's steps (``plan``, ``commit``), or MirrorUnavailableError."""
    try:
        return importlib.import_module(ICEBERG_STEPS)
    except ModuleNotFoundError as exc:
        if exc.name is not None and not ICEBERG_STEPS.startswith(exc.name):
            raise  # the module exists but one of its imports is missing: show that
        raise MirrorUnavailableError(
            f"{mirror.describe()}: the Iceberg mirror target is not available in this installation "
            f"({ICEBERG_STEPS} is missing). Use type: postgres for now, or remove the mirror from "
            "tables[].mirrors; nothing was written."
        ) from None


def postgres_target(ctx: Any, mirror: MirrorConfig) -> PostgresTarget:
    """The PostgreSQL target of ``mirror`` (``ctx``: the table's run context)."""
    return PostgresTarget(dsn_for(mirror), mirror.table, changelog=ctx.table.sink, source=ctx.table.source)


def read_mirror_mark(ctx: Any, mirror: MirrorConfig) -> ChangelogMark | None:
    """The mirror's watermark as its target stores it (None: never applied)."""
    if mirror.type == "postgres":
        return postgres_target(ctx, mirror).read_mark()
    steps = iceberg_steps(mirror)
    if not hasattr(steps, "watermark"):
        raise MirrorUnavailableError(
            f"{mirror.describe()}: the Iceberg mirror target does not report its watermark "
            f"({ICEBERG_STEPS}.watermark(ctx, mirror) is missing)"
        )
    return steps.watermark(ctx, mirror)

"""Rewrite a mirror's drifted keys from the source, at the watermark it keeps.

The repair is net changes like any apply's -- upserts (the source's rows of
the changed and missing keys), deletes (the foreign keys) -- applied by the
target's own path, so it is as atomic as an apply: PostgreSQL in one
transaction that first checks the mirror is still at the verified watermark
(``PostgresTarget.apply(repair=True)``); an Iceberg mirror through its plan,
join units (run in this process: a repair touches few keys) and one commit
under the commit-in-flight protocol, known afterwards by its repair id in the
snapshot summary (``cdc.mirror.repair``), never committed twice.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.types import NestedField

from iceberg_cdc.config import MirrorConfig
from iceberg_cdc.mirror.net_changes import ChangelogMark, NetChanges
from iceberg_cdc.mirror.staging import MirrorPaths, stage_net_changes
from iceberg_cdc.mirror.steps import plan_fields
from iceberg_cdc.mirror.targets import iceberg_steps, postgres_target
from iceberg_cdc.mirror.verify.drift import Drift
from iceberg_cdc.mirror.verify.sides import Columns
from iceberg_cdc.pipeline.paths import attempt_name
from iceberg_cdc.pyiceberg_internals.arrow_schema import to_arrow_type
from iceberg_cdc.run.context import Context

log = logging.getLogger("iceberg_cdc.mirror")


def _upserts(fields: list[NestedField], rows: pa.Table) -> pa.Table:
    """The source's rows in the mirror's columns; a column the source no longer has is null (history)."""
    arrays = []
    for f in fields:
        if f.name in rows.column_names:
            arrays.append(rows.column(f.name))
        else:
            arrays.append(pa.nulls(rows.num_rows, to_arrow_type(f.field_type)))
    return pa.Table.from_arrays(arrays, names=[f.name for f in fields])


def _deletes(columns: Columns, rows: pa.Table) -> pa.Table:
    """Foreign keys as the mirror gave them, cast back to the key's own Arrow type where they were read as text."""
    out = {}
    for name in columns.key:
        column = rows.column(name)
        target = to_arrow_type(columns.types[name])
        if column.type != target and not isinstance(target, pa.BaseExtensionType):
            with contextlib.suppress(pa.ArrowInvalid, pa.ArrowNotImplementedError):
                column = pc.cast(column, target)
        out[name] = column
    return pa.table(out)


def repair_keys(
    ctx: Context,
    mirror: MirrorConfig,
    fields: list[NestedField],
    columns: Columns,
    mark: ChangelogMark,
    drift: Drift,
    source_rows: pa.Table,
    mirror_rows: pa.Table,
    run_id: str,
    epoch: int,
    *,
    hook: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Apply the repair of ``drift`` to the mirror (see the module doc); returns the target's figures."""
    take = np.concatenate([drift.changed_source, drift.missing]).astype(np.int64)
    upserts = _upserts(fields, source_rows.take(pa.array(take)))
    deletes = _deletes(columns, mirror_rows.take(pa.array(drift.foreign.astype(np.int64))))
    net = NetChanges(upserts, deletes, tuple(columns.key), mark)
    if hook:
        hook("repair_planned")
    if mirror.type == "postgres":
        result = postgres_target(ctx, mirror).apply(
            net, base=mark, fields=fields, epoch=epoch, run_id=run_id, hook=hook, repair=True
        )
        figures = result.to_dict()
    else:
        figures = _repair_iceberg(ctx, mirror, fields, net, run_id, epoch, hook)
    log.info(
        "%s: repaired %d keys (%d rewritten from the source, %d foreign deleted)",
        mirror.describe(),
        drift.keys,
        upserts.num_rows,
        deletes.num_rows,
    )
    return figures


def _repair_iceberg(
    ctx: Context,
    mirror: MirrorConfig,
    fields: list[NestedField],
    net: NetChanges,
    run_id: str,
    epoch: int,
    hook: Callable[[str], None] | None,
) -> dict[str, Any]:
    steps = iceberg_steps(mirror)
    # Under the run's attempt, so a sweep of a dead attempt removes it too, beside (not over) its apply.
    paths = MirrorPaths(ctx.table.source, mirror.mirror_name, f"{attempt_name(epoch)}/verify")
    changelog = ctx.catalog().load_table(ctx.table.sink)
    stage_net_changes(
        ctx.runtime.store(),
        paths,
        net,
        plan_fields={
            **plan_fields(ctx, mirror, changelog, fields, run_id=run_id, epoch=epoch),
            "base": net.through.to_dict(),
            "snapshots": 0,
            "repair": f"{run_id}/epoch-{epoch}",
        },
    )
    staged = {"action": "apply", "plan": paths.plan}
    planned = steps.plan(ctx, mirror, staged)
    try:
        steps.run_units_inline(ctx.runtime, planned)
        if hook:
            hook("repair_joined")
        committed = steps.commit(ctx, mirror, planned)
    finally:
        kept = steps.cleanup(ctx, mirror, planned) if planned.get("action") == "apply" else {}
        if not kept.get("kept") and not ctx.config.shuffle.retain_files:
            ctx.runtime.store().delete_prefix(paths.prefix)
    return committed

"""What each task of a mirror DAG run does, as plain functions (no Airflow).

    detect -> plan_apply -> mirror_join[] (Spark; Iceberg target only) -> apply
    cleanup: teardown (releases the lease, deletes the run's staged objects)

* **detect** takes the mirror's own lease (a lease name of its own beside the
  table's, :func:`mirror_lease`), sweeps what earlier attempts left, and
  compares the mirror's watermark with the changelog's state.
* **plan_apply** reads every pending changelog snapshot at once, computes the
  net changes per key (:mod:`.changelog`, :mod:`.net_changes`), stages them as
  Parquet under the run's epoch (:mod:`.staging`) and, for an Iceberg mirror,
  hands them to the Iceberg target's ``plan`` (its Spark join tasks' arguments
  come back as ``join_args``; a PostgreSQL mirror has none).
* **apply** proves the lease once more and applies: PostgreSQL in one
  transaction with the watermark (:mod:`.postgres.target`); Iceberg through
  the target's ``commit``. Each is exactly once by the watermark it moves.
* **cleanup** releases the lease (only this run's epoch) and deletes the run's
  namespace.

Every step returns a small JSON-able dict (the task's XCom).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from pyiceberg.exceptions import NoSuchTableError

from iceberg_cdc.config import MirrorConfig
from iceberg_cdc.coordination.lease import HolderState, LeaseInfo, TableLease
from iceberg_cdc.coordination.store_probe import probe_once
from iceberg_cdc.errors import CdcError
from iceberg_cdc.mirror.changelog import Pending, pending, read_net_changes
from iceberg_cdc.mirror.columns import mirror_fields, mirror_key
from iceberg_cdc.mirror.net_changes import ChangelogMark
from iceberg_cdc.mirror.postgres.target import Hook
from iceberg_cdc.mirror.postgres.types import pg_type
from iceberg_cdc.mirror.staging import (
    MirrorPaths,
    MirrorPlan,
    attempts_of,
    load_net_changes,
    stage_net_changes,
)
from iceberg_cdc.mirror.targets import iceberg_steps, postgres_target, read_mirror_mark
from iceberg_cdc.run.context import Context
from iceberg_cdc.run.lease import lease_ttl_seconds
from iceberg_cdc.source.tables import load_source_table

log = logging.getLogger("iceberg_cdc")


def mirror_lease(ctx: Context, mirror: MirrorConfig) -> TableLease:
    """The mirror's lease: its own name, so mirror runs never wait for the changelog's runs (or each other's)."""
    return TableLease(ctx.runtime.store(), f"_mirrors/{ctx.table.source}/{mirror.mirror_name}")


def _confirm(ctx: Context, mirror: MirrorConfig, detected: dict[str, Any]) -> LeaseInfo:
    return mirror_lease(ctx, mirror).renew(
        detected["run_id"], int(detected["epoch"]), float(detected["lease_ttl"])
    )


def detect(
    ctx: Context,
    mirror: MirrorConfig,
    run_id: str,
    *,
    dag_id: str = "",
    try_number: int | None = None,
    holder_state: Callable[[LeaseInfo], HolderState] | None = None,
) -> dict[str, Any]:
    """Take the mirror's lease, sweep leftovers, and say whether anything is pending."""
    lease = mirror_lease(ctx, mirror)
    probe_once(lease.store)
    held = lease.acquire(
        run_id, lease_ttl_seconds(ctx.table), dag_id=dag_id, try_number=try_number, holder_state=holder_state
    )
    try:
        return _detect(ctx, mirror, run_id, held)
    except BaseException:
        try:
            lease.release(run_id, held.epoch)
        except Exception:
            log.exception("run %r could not release the lease of %s", run_id, mirror.describe())
        raise


def _detect(ctx: Context, mirror: MirrorConfig, run_id: str, held: LeaseInfo) -> dict[str, Any]:
    paths = MirrorPaths.of(ctx.table.source, mirror.mirror_name, held.epoch)
    swept = sweep_leftovers(ctx, mirror, paths.attempt)
    base = {
        "source": ctx.table.source,
        "mirror": mirror.mirror_name,
        "mirror_type": mirror.type,
        "mirror_table": mirror.table,
        "run_id": run_id,
        "epoch": held.epoch,
        "lease_ttl": lease_ttl_seconds(ctx.table),
        "swept": swept,
    }
    catalog = ctx.catalog()
    try:
        changelog = catalog.load_table(ctx.table.sink)
    except NoSuchTableError:
        log.info(
            "%s: the changelog %s does not exist yet: nothing to mirror", mirror.describe(), ctx.table.sink
        )
        return {**base, "action": "caught_up", "reason": "no changelog yet"}
    mark = read_mirror_mark(ctx, mirror)
    pend = pending(changelog, ctx.table.source, mark, mirror.mirror_name)
    if pend is None or pend.caught_up:
        log.info("%s is caught up (at %s)", mirror.describe(), mark)
        return {**base, "action": "caught_up", "mark": mark.to_dict() if mark else None}
    log.info(
        "%s: %d changelog snapshot(s) pending after %s, through source snapshot %s%s; lease epoch %d",
        mirror.describe(),
        pend.snapshots,
        mark.source_snapshot_id if mark else "the start",
        pend.through.source_snapshot_id,
        f"; reprocessed since: {pend.reprocessed}" if pend.reprocessed else "",
        held.epoch,
    )
    return {
        **base,
        "action": "apply",
        **_pending_dict(pend),
        "plan": paths.plan,
        # What the apply's lineage names as its input (no catalog call is made there).
        "changelog": ctx.table.sink,
        "changelog_location": changelog.location(),
    }


def _pending_dict(pend: Pending) -> dict[str, Any]:
    return {
        "base": pend.base.to_dict() if pend.base else None,
        "through": pend.through.to_dict(),
        "snapshots": pend.snapshots,
        "reprocessed": [str(s) for s in pend.reprocessed],
    }


def sweep_leftovers(ctx: Context, mirror: MirrorConfig, keep_attempt: str) -> int:
    """Delete the namespaces earlier attempts of this mirror left (called holding the lease)."""
    if ctx.config.shuffle.retain_files:
        return 0
    store = ctx.runtime.store()
    removed = 0
    for attempt in attempts_of(store, ctx.table.source, mirror.mirror_name) - {keep_attempt}:
        paths = MirrorPaths(ctx.table.source, mirror.mirror_name, attempt)
        if mirror.type == "iceberg":
            # Its staged data files are in the mirror's location, named by its plan: sweep them first.
            # The apply's join namespace, and the one a verification's repair used (mirror.verify.repair).
            kept = False
            for join_prefix in (paths.join_prefix, f"{paths.prefix}verify/join/"):
                try:
                    swept = iceberg_steps(mirror).sweep_attempt(
                        ctx, mirror, join_prefix, lease_ttl=lease_ttl_seconds(ctx.table)
                    )
                except CdcError as exc:  # a later run sweeps again; this one goes on
                    log.warning("%s: could not sweep %s: %s", mirror.describe(), attempt, exc)
                    kept = True
                    continue
                if swept.get("kept"):
                    kept = True  # a commit whose outcome is unknown: its namespace stays for a later sweep
                elif swept.get("deleted_files"):
                    log.warning(
                        "%s: deleted %d staged files %s left in the mirror's location",
                        mirror.describe(),
                        swept["deleted_files"],
                        attempt,
                    )
            if kept:
                continue
        removed += store.delete_prefix(paths.prefix)
    if removed:
        log.warning("%s: swept %d objects earlier runs left", mirror.describe(), removed)
    return removed


def plan_fields(
    ctx: Context, mirror: MirrorConfig, changelog: Any, fields: list[Any], *, run_id: str, epoch: int
) -> dict[str, Any]:
    """What every staged mirror plan says of its mirror, run and columns (an apply's or a repair's)."""
    return {
        "source": ctx.table.source,
        "changelog": ctx.table.sink,
        "mirror_type": mirror.type,
        "mirror_table": mirror.table,
        "mirror_name": mirror.mirror_name,
        "run_id": run_id,
        "epoch": epoch,
        "columns": [f.name for f in fields],
        "changelog_schema_json": changelog.schema().model_dump_json(),
    }


def plan_apply(ctx: Context, mirror: MirrorConfig, detected: dict[str, Any]) -> dict[str, Any]:
    """Read the pending changelog, stage its net changes, and plan the target's work."""
    if detected["action"] != "apply":
        return {"action": detected["action"], "join_args": []}
    started = time.perf_counter()
    _confirm(ctx, mirror, detected)
    catalog = ctx.catalog()
    changelog = catalog.load_table(ctx.table.sink)
    key = mirror_key(ctx.table, mirror, load_source_table(catalog, ctx.table).schema())
    fields = mirror_fields(changelog.schema(), mirror, key)
    if mirror.type == "postgres":
        for field in fields:  # an unmappable type fails here, naming the column, before anything is staged
            pg_type(field.name, field.field_type)
    base = ChangelogMark.from_dict(detected["base"])
    pend = Pending(
        base,
        ChangelogMark.from_dict(detected["through"]),  # type: ignore[arg-type]
        int(detected["snapshots"]),
        [int(s) for s in detected["reprocessed"]],
    )
    net = read_net_changes(
        changelog, ctx.table.source, pend, key, [f.name for f in fields], mirror.mirror_name
    )
    paths = MirrorPaths.of(ctx.table.source, mirror.mirror_name, int(detected["epoch"]))
    plan = stage_net_changes(
        ctx.runtime.store(),
        paths,
        net,
        plan_fields={
            **plan_fields(
                ctx, mirror, changelog, fields, run_id=detected["run_id"], epoch=int(detected["epoch"])
            ),
            "base": detected["base"],
            "snapshots": pend.snapshots,
            "reprocessed": detected["reprocessed"],
        },
    )
    staged = {
        "action": "apply",
        "plan": paths.plan,
        "upserts": plan.upsert_rows,
        "deletes": plan.delete_rows,
        "snapshots": plan.snapshots,
        "through": plan.through,
        "seconds": round(time.perf_counter() - started, 3),
    }
    log.info(
        "%s: net changes of %d changelog snapshot(s): %d upserts, %d deletes (staged at %s)",
        mirror.describe(),
        plan.snapshots,
        plan.upsert_rows,
        plan.delete_rows,
        ctx.runtime.store().describe(paths.prefix),
    )
    if mirror.type == "iceberg":
        planned = iceberg_steps(mirror).plan(ctx, mirror, staged)
        return {**staged, **planned, "join_args": list(planned.get("join_args", []))}
    return {**staged, "join_args": []}


def _own_plan(ctx: Context, detected: dict[str, Any]) -> MirrorPlan:
    plan = MirrorPlan.load(ctx.runtime.store(), detected["plan"])
    if plan.epoch != int(detected["epoch"]) or plan.run_id != detected["run_id"]:
        raise CdcError(
            f"the mirror plan {detected['plan']} belongs to run {plan.run_id!r} (epoch {plan.epoch}), not to this "
            f"run {detected['run_id']!r}; nothing was applied"
        )
    return plan


def apply(
    ctx: Context,
    mirror: MirrorConfig,
    detected: dict[str, Any],
    planned: dict[str, Any],
    *,
    hook: Hook | None = None,
) -> dict[str, Any]:
    """Apply the staged net changes to the target, exactly once by the mirror's watermark."""
    if detected["action"] != "apply":
        return {"applied": False, "reason": "caught up"}
    _confirm(ctx, mirror, detected)
    if mirror.type == "iceberg":
        return iceberg_steps(mirror).commit(ctx, mirror, planned)
    started = time.perf_counter()
    store = ctx.runtime.store()
    plan = _own_plan(ctx, detected)
    net = load_net_changes(store, plan)
    _confirm(ctx, mirror, detected)
    result = postgres_target(ctx, mirror).apply(
        net,
        base=plan.base_mark,
        fields=plan.fields(),
        epoch=plan.epoch,
        run_id=plan.run_id,
        hook=hook,
    )
    log.info(
        "%s: %s (%d upserted, %d deleted) -> source snapshot %s in %.1f s",
        mirror.describe(),
        result.reason,
        result.upserted,
        result.deleted,
        plan.through_mark.source_snapshot_id,
        time.perf_counter() - started,
    )
    return {
        **result.to_dict(),
        "through": plan.through,
        "seconds_total": round(time.perf_counter() - started, 3),
    }


def cleanup(
    ctx: Context,
    mirror: MirrorConfig,
    detected: dict[str, Any] | None,
    run_id: str,
    planned: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Release the run's lease, then delete its namespace (unless ``shuffle.retain_files``).

    An Iceberg mirror's target first deletes the data and delete files its
    join tasks staged in the mirror's location that no commit references
    (``planned``: plan_apply's answer; kept while a commit's outcome is unknown).
    """
    released = False
    removed = 0
    target: dict[str, Any] = {}
    epoch = int(detected["epoch"]) if detected and detected.get("epoch") is not None else None
    if epoch is None:
        return {"objects_deleted": 0, "lease_released": False}
    # The lease goes first (the commit-in-flight protocol's order): a zombie commit of this run that
    # has not yet put its marker then fails its lease check, and one that has is seen below.
    try:
        released = mirror_lease(ctx, mirror).release(run_id, epoch)
    except Exception:
        log.exception("run %r could not release the lease of %s", run_id, mirror.describe())
    if mirror.type == "iceberg" and planned and planned.get("action") == "apply":
        try:
            target = iceberg_steps(mirror).cleanup(ctx, mirror, planned)
        except Exception:  # a teardown: the run's own error (if any) matters more
            log.exception("run %r could not clean up the staged files of %s", run_id, mirror.describe())
            target = {"kept": "cleanup failed"}  # the namespace leads a later sweep back to the files
    if not ctx.config.shuffle.retain_files and not target.get("kept"):
        paths = MirrorPaths.of(ctx.table.source, mirror.mirror_name, epoch)
        removed = ctx.runtime.store().delete_prefix(paths.prefix)
    return {
        "objects_deleted": removed,
        "lease_released": released,
        **{f"target_{k}": v for k, v in target.items()},
    }

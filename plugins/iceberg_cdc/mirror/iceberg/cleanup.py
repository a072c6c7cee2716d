"""An Iceberg mirror attempt's leftovers: its shuffle-store objects and the staged files no commit references.

The join units write delete files and rewritten data files into the
mirror's own location (the plan's ``staging_dir``) before the commit. What
the attempt's commit added must stay; everything else it wrote is garbage
once the attempt is over. :func:`cleanup` is the attempt's teardown;
:func:`sweep_attempt` is the same for an attempt that died before it, run by
a later run's detect. Whether a ``commit-pending`` marker keeps everything is
the one rule of :mod:`iceberg_cdc.coordination.commit_in_flight`: for a
teardown whenever the marker is not known to be absent, for a sweep until
the lease's two TTLs plus the grace have passed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.manifest import ManifestEntryStatus

from iceberg_cdc.coordination.commit_in_flight import describe as describe_marker
from iceberg_cdc.coordination.commit_in_flight import may_sweep, read_marker
from iceberg_cdc.errors import CdcError, ObjectNotFoundError
from iceberg_cdc.mirror.iceberg.plan import ApplyPaths, ApplyPlan
from iceberg_cdc.mirror.iceberg.table import find_apply
from iceberg_cdc.pyiceberg_internals.manifest_reader import manifest_entries
from iceberg_cdc.storage import get_json_many, open_store

log = logging.getLogger("iceberg_cdc.mirror")


def unit_records(store: Any, paths: ApplyPaths) -> list[dict[str, Any]]:
    """The units' result records of one attempt."""
    keys = sorted(i.key for i in store.list(paths.staged_prefix) if i.key.endswith(".json"))
    return get_json_many(store, keys)


def cleanup(
    ctx: Any,
    mirror: Any,
    planned: Mapping[str, Any],
    *,
    sweep_lease_ttl: float | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """Delete the attempt's objects and its staged files no commit references (a teardown: never raises on them).

    A ``commit-pending`` marker (an outcome not known) keeps everything: a
    commit that lands late references those files. With ``sweep_lease_ttl``
    (a later run sweeping a dead attempt), a readable marker older than the
    protocol's sweep delay no longer keeps them: the mirror's history then
    says whether the commit landed. An unreadable marker always keeps them.
    """
    if planned.get("action") != "apply":
        return {"deleted_objects": 0, "deleted_files": 0}
    store = ctx.runtime.store()
    paths = ApplyPaths(
        str(planned["mirror"]),
        int(planned["through"]["changelog_snapshot_id"]),
        f"epoch-{planned['epoch']}",
        planned.get("root"),
    )
    marker = read_marker(store, paths.commit_pending)
    keep = marker.keeps_files if sweep_lease_ttl is None else not may_sweep(marker, sweep_lease_ttl, now=now)
    if keep:
        log.warning(
            "mirror %s: a commit's outcome is unknown (%s); its files are kept",
            planned["mirror"],
            describe_marker(marker),
        )
        return {"deleted_objects": 0, "deleted_files": 0, "kept": "commit outcome unknown"}
    deleted_files = 0
    apply_plan, unreadable = read_plan(store, planned["plan"])
    if unreadable:
        # Its staging directory is named only by the plan: the namespace stays, to lead a later sweep back.
        log.warning("mirror %s: %s; its namespace %s is kept", planned["mirror"], unreadable, paths.prefix)
        return {"deleted_objects": 0, "deleted_files": 0, "kept": unreadable}
    if apply_plan is not None:
        try:
            table = ctx.catalog().load_table(apply_plan.mirror)
        except NoSuchTableError:  # dropped since: no commit of it references anything
            committed = None
        else:
            committed = find_apply(table, _through(apply_plan))
        keep = set()
        if committed:
            # Only what that commit added: another attempt may have committed the same changes.
            keep = {f["file_path"] for r in unit_records(store, paths) for f in r.get("added", ())}
            keep &= files_added_by(table, committed)
        warehouse = open_store(apply_plan.staging_dir, ctx.runtime.io_properties)
        for info in warehouse.list(""):
            path = f"{apply_plan.staging_dir.rstrip('/')}/{info.key}"
            if path not in keep:
                warehouse.delete_prefix(info.key)
                deleted_files += 1
    deleted_objects = store.delete_prefix(paths.prefix)
    return {"deleted_objects": deleted_objects, "deleted_files": deleted_files}


def sweep_attempt(
    ctx: Any, mirror: Any, root: str, *, lease_ttl: float, now: float | None = None
) -> dict[str, Any]:
    """The staged files of an earlier attempt that died before its cleanup (called holding the lease).

    ``root`` is the attempt's namespace for this target (the mirror DAG's
    ``.../epoch-<n>/join/``). Its plan names its staging directory; what the
    attempt's commit added stays when the mirror's history holds that commit,
    everything else goes, as its own cleanup would have done. A commit whose
    outcome is unknown keeps its files while the commit-in-flight protocol says
    so, and a plan that cannot be read (a store error after retries, a damaged
    object) keeps them too: ``kept`` in the result, and the caller leaves the
    namespace, marker included, for a later sweep.
    """
    store = ctx.runtime.store()
    paths = ApplyPaths("", 0, "", root)
    plan, unreadable = read_plan(store, paths.plan)
    if unreadable:  # fail closed: a plan that cannot be read is not a plan that never was
        log.warning("%s; the attempt's namespace %s is kept for a later sweep", unreadable, root)
        return {"deleted_objects": 0, "deleted_files": 0, "kept": unreadable}
    if plan is None:  # never planned (or already swept): nothing of it is in the mirror's location
        marker = read_marker(store, paths.commit_pending)
        if not may_sweep(marker, lease_ttl, now=now):
            log.warning("the attempt %s has no plan but %s", root, describe_marker(marker))
            return {"deleted_objects": 0, "deleted_files": 0, "kept": "commit outcome unknown"}
        return {"deleted_objects": 0, "deleted_files": 0}
    planned = {
        "action": "apply",
        "mirror": plan.mirror,
        "through": plan.through,
        "epoch": plan.epoch,
        "root": root,
        "plan": paths.plan,
    }
    return cleanup(ctx, mirror, planned, sweep_lease_ttl=lease_ttl, now=now)


def read_plan(store: Any, key: str) -> tuple[ApplyPlan | None, str]:
    """An attempt's plan, or ``None``: with ``""`` when the store says there is none, else why it cannot be read.

    Only a clear "not found" means the attempt never planned (or was swept). A
    store error after retries or a damaged plan is unknown, not absent: the
    plan names the staging directory of a commit that may still be in flight.
    """
    try:
        return ApplyPlan.load(store, key), ""
    except ObjectNotFoundError:
        return None, ""
    except (CdcError, ValueError, TypeError, KeyError) as exc:
        return None, (
            f"the mirror apply plan {store.describe(key)} cannot be read ({type(exc).__name__}: {exc}); "
            "if it stays unreadable, delete that namespace by hand once its staged files are checked"
        )


def files_added_by(table: Any, snapshot: Any) -> set[str]:
    """Paths of the data, delete and DV files ``snapshot`` added to ``table``."""
    added: set[str] = set()
    for manifest in snapshot.manifests(table.io):
        if manifest.added_snapshot_id != snapshot.snapshot_id:
            continue
        for entry in manifest_entries(table.io, manifest, table.metadata.format_version):
            if entry.snapshot_id == snapshot.snapshot_id and entry.status == ManifestEntryStatus.ADDED:
                added.add(entry.data_file.file_path)
    return added


def _through(apply_plan: ApplyPlan):
    from iceberg_cdc.mirror.iceberg.inputs import Through

    return Through.from_dict(apply_plan.through)

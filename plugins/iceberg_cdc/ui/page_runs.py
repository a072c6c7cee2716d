"""The CDC page's tables of Airflow runs: the recent runs with their notes, and the failed runs.

Runs are listed most recently started first (:mod:`iceberg_cdc.airflow.views.airflow_side`);
every value goes through :func:`~iceberg_cdc.ui.page_format.esc`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from iceberg_cdc.ui.page_format import esc, time_tag


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
        if error:
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
            f"<td>{tasks}</td><td>{error_html}</td></tr>"
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
            f"<td>{time_tag(run.started_at or run.run_after, now)}</td>"
            f"<td>{time_tag(run.ended_at, now) if run.ended_at else '—'}</td>"
            f"<td>{note}</td></tr>"
        )
    return (
        "<h3>Recent runs</h3>"
        '<div class="scroll"><table class="grid runs" data-field="recent-runs"><thead><tr><th>Run</th>'
        "<th>State</th><th>Started</th><th>Ended</th><th>Note</th></tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )

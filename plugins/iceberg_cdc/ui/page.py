"""The CDC page: server-rendered HTML, inline CSS, a few lines of JavaScript for auto-refresh.

No template engine and no build step: every value goes through :func:`html.escape`.
The page is shown inside Airflow's UI (an iframe under ``/plugin/cdc``), so
links to Airflow's own pages open at the top level (``target="_top"``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from iceberg_cdc.ui.page_format import (
    CSS,
    REFRESH_SECONDS,
    SCRIPT,
    esc,
    fmt_age,
    fmt_clock,
    fmt_int,
    fmt_time,
    time_tag,
)
from iceberg_cdc.ui.page_mirrors import mirror_section
from iceberg_cdc.ui.page_runs import blocked_line, failed_runs, recent_runs, run_badge, run_when
from iceberg_cdc.ui.page_snapshots import recent_table
from iceberg_cdc.ui.status import TableStatus
from iceberg_cdc.units import format_duration


@dataclass
class PageModel:
    """Everything the page shows; built by :mod:`iceberg_cdc.airflow.views.app`."""

    generated_at: datetime
    statuses: Sequence[TableStatus] = ()
    runs: Mapping[str, Any] = field(default_factory=dict)  # dag_id -> airflow_api.DagRuns
    config_path: str | None = None
    config_error: str | None = None
    hidden_tables: int = 0  # configured tables whose DAG the user may not read
    api_href: str = "api/tables"


_STATE_LABEL = {
    "caught-up": "caught up",
    "behind": "behind",
    "late": "late",
    "error": "error",
    "blocked": "blocked",
    "unknown": "unknown",
}


def _badge(status: TableStatus, now: datetime) -> str:
    label, title = _STATE_LABEL[status.state], ""
    if status.state == "blocked" and status.blocked is not None:  # red: no run moves it until a person acts
        since = f" since {fmt_clock(status.blocked.since, now)}" if status.blocked.since else ""
        label = f"blocked{since} by {status.blocked.error_name}"
        title = f' title="{esc(status.blocked.fix or status.blocked.error)}"'
    elif status.state == "behind":
        label = f"{status.pending} pending"
    elif status.state == "late":  # red: the freshness SLO is broken
        age, slo = (
            format_duration(status.oldest_pending_age_seconds or 0),
            format_duration(status.freshness_slo or 0),
        )
        label = f"late: {status.pending} pending, oldest {age} old (SLO {slo})"
    return f'<span class="badge {status.state}" data-field="state"{title}>{esc(label)}</span>'


def _anchor(source: str) -> str:
    return "table-" + "".join(c if c.isalnum() or c in "-_" else "-" for c in source)


def _retention(status: TableStatus) -> str:
    """The retention guard's line: time left before a needed snapshot may be expired, or why there is none."""
    retention = status.retention
    if not retention:
        return ""
    first = retention.get("first") or {}
    left = retention.get("seconds_left")
    if retention.get("protected"):
        text = "every snapshot the sink needs is protected by its tags (protect_pending)"
    elif left is None:
        text = "no snapshot the sink needs can be expired now" + (
            f" ({esc(first['kept_by'])})" if first.get("kept_by") else ""
        )
    else:
        role = "the watermark's snapshot" if first.get("role") == "watermark" else "a pending snapshot"
        when = "now" if left <= 0 else f"in {esc(fmt_age(left))}"
        text = f'{role} <span class="mono">{esc(first.get("snapshot_id"))}</span> may be expired {when} ({esc(first.get("kept_by"))})'
    if status.retention_warning:
        return f'<span class="warn" data-field="retention" title="{esc(status.retention_warning)}">⚠ {text}</span>'
    return f'<span data-field="retention">{text}</span>'


def _facts(status: TableStatus, runs: Any, now: datetime) -> str:
    items = []
    if status.watermark_snapshot_id is not None:
        made = f", made {time_tag(status.watermark_snapshot_at, now)}" if status.watermark_snapshot_at else ""
        items.append(
            (
                "Watermark",
                f'snapshot <span class="mono" data-field="watermark-snapshot">{esc(status.watermark_snapshot_id)}</span>'
                f' · ordinal <span data-field="watermark-ordinal">{esc(status.watermark_ordinal)}</span>{made}',
            )
        )
    else:
        items.append(("Watermark", '<span class="muted" data-field="watermark-snapshot">none yet</span>'))
    if status.pending is not None:
        if status.pending:
            oldest = ""
            if status.oldest_pending_snapshot_id is not None:
                oldest = (
                    f' · oldest <span class="mono">{esc(status.oldest_pending_snapshot_id)}</span>'
                    f" waiting {esc(fmt_age(status.oldest_pending_age_seconds))}"
                )
            lag = f'<span data-field="pending">{esc(status.pending)}</span> snapshot{"s" if status.pending != 1 else ""} pending{oldest}'
        else:
            lag = '<span data-field="pending">0</span> pending: caught up'
        items.append(("Lag", lag))
    retention = _retention(status)
    if retention:
        items.append(("Expiry", retention))
    if status.source_snapshot_id is not None:
        items.append(
            (
                "Source now",
                f'snapshot <span class="mono">{esc(status.source_snapshot_id)}</span>, made '
                f"{time_tag(status.source_snapshot_at, now)}",
            )
        )
    if status.lease is not None:
        items.append(
            (
                "Running",
                f'run <span class="mono">{esc(status.lease.owner)}</span> holds the lease (epoch '
                f"{esc(status.lease.epoch)}, host {esc(status.lease.host)}, until {esc(fmt_time(status.lease.expires_at))})",
            )
        )
    elif status.lease_checked:
        items.append(("Running", '<span class="muted">no run holds the lease</span>'))
    if runs is not None and runs.latest is not None:
        latest = runs.latest
        items.append(
            (
                "Latest run",
                f'<a href="{esc(latest.url)}" target="_top" class="mono">{esc(latest.run_id)}</a> '
                f"{run_badge(latest.state)} {run_when(latest, now)}"
                + (
                    f'<div class="run-note" data-field="latest-note">{esc(latest.note)}</div>'
                    if latest.note
                    else ""
                ),
            )
        )
    elif runs is not None and not runs.error:
        known = "" if runs.known else " (the DAG is not in Airflow's database yet)"
        items.append(("Latest run", f'<span class="muted">none{esc(known)}</span>'))
    if status.skewed_commits:
        newest = next(s for s in status.recent if s.skew)
        items.append(
            (
                "Skew",
                f'<span class="warn" data-field="skew">⚠ {esc(status.skewed_commits)} of the last '
                f"{esc(len(status.recent))} commits had skewed partitions</span> (latest: snapshot "
                f'<span class="mono">{esc(newest.source_snapshot_id)}</span>, {esc(newest.skew[0])}): '
                "skewed keys; a read task takes each skewed partition alone and is the run's long pole",
            )
        )
    if runs is not None and runs.paused:
        items.append(("DAG", '<span class="warn">paused</span>'))
    items.append(("Start", esc(status.start)))
    return '<dl class="facts">' + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in items) + "</dl>"


def _section(status: TableStatus, all_runs: Mapping[str, Any], now: datetime) -> str:
    runs = all_runs.get(status.dag_id)
    dag_link = (
        f'<a class="dag-link" href="{esc(runs.url)}" target="_top">DAG {esc(status.dag_id)}</a>'
        if runs is not None
        else f'<span class="dag-link">DAG {esc(status.dag_id)}</span>'
    )
    # The block's error is on its own line, with its fix: a status error that repeats it is left out.
    shown = [e for e in status.errors if not (status.blocked and status.blocked.cause in e)]
    errors = "".join(f'<p class="error" data-field="error">{esc(e)}</p>' for e in shown)
    errors += "".join(f'<p class="warn" data-field="warning">⚠ {esc(w)}</p>' for w in status.warnings)
    errors = blocked_line(status.blocked, now) + errors
    notes = "".join(f'<p class="note">{esc(n)}</p>' for n in status.notes)
    return (
        f'<section class="card" id="{esc(_anchor(status.source))}" data-source="{esc(status.source)}">'
        f'<h2><span class="mono">{esc(status.source)}</span> → <span class="mono">{esc(status.sink)}</span> '
        f"{_badge(status, now)} {dag_link}</h2>"
        f"{errors}{notes}{_facts(status, runs, now)}"
        f"{mirror_section(status.mirrors, all_runs, now, table_blocked=status.blocked is not None)}"
        f"<h3>Last processed snapshots</h3>{recent_table(status, now)}"
        f"{recent_runs(runs, now)}"
        f"<h3>Failed runs</h3>{failed_runs(runs, now)}"
        "</section>"
    )


def _overview(model: PageModel, now: datetime) -> str:
    rows = []
    for status in model.statuses:
        runs = model.runs.get(status.dag_id)
        last = status.last_commit
        latest = runs.latest if runs is not None else None
        failed = len(runs.failed) if runs is not None else None
        blocking = ' <span class="failure blocking">(1 blocking)</span>' if status.blocked is not None else ""
        watermark = (
            f'<span class="mono">{esc(status.watermark_snapshot_id)}</span> <span class="muted">#{esc(status.watermark_ordinal)}</span>'
            if status.watermark_snapshot_id is not None
            else '<span class="muted">none</span>'
        )
        rows.append(
            f'<tr data-source="{esc(status.source)}">'
            f'<td><a href="#{esc(_anchor(status.source))}" class="mono">{esc(status.source)}</a></td>'
            f"<td>{_badge(status, now)}</td>"
            f"<td>{watermark}</td>"
            f'<td class="num">{esc(fmt_int(status.pending))}</td>'
            f"<td>{esc(fmt_age(status.oldest_pending_age_seconds)) if status.pending else '—'}</td>"
            f"<td>{time_tag(last.committed_at, now) if last else '—'}</td>"
            f"<td>{run_badge(latest.state if latest else None)}</td>"
            f'<td class="num">{esc(fmt_int(failed)) + blocking if failed is not None else "—"}</td>'
            "</tr>"
        )
    return (
        '<div class="scroll"><table class="grid overview"><thead><tr><th>Source table</th><th>State</th>'
        '<th>Watermark</th><th class="num">Pending</th><th>Oldest pending</th><th>Last commit</th>'
        '<th>Latest run</th><th class="num">Failed runs</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def render_page(model: PageModel) -> str:
    now = model.generated_at
    parts = []
    count = len(model.statuses)
    subtitle = [f"{count} table{'s' if count != 1 else ''}"]
    if model.config_path:
        subtitle.append(f'config <span class="mono">{esc(model.config_path)}</span>')
    subtitle.append(f"read {esc(fmt_time(now))}")
    subtitle.append(f'<a href="{esc(model.api_href)}">JSON</a>')
    parts.append(
        '<header><div class="toolbar"><label><input type="checkbox" id="auto-refresh" checked> '
        f"refresh every {REFRESH_SECONDS} s</label></div>"
        "<h1>Change data capture</h1>"
        f"<p>{' · '.join(subtitle)}</p></header>"
    )
    if model.config_error:
        parts.append(f'<p class="error" data-field="config-error">{esc(model.config_error)}</p>')
    if model.hidden_tables:
        n = model.hidden_tables
        parts.append(
            f'<p class="note">{n} configured table{"s are" if n != 1 else " is"} not shown: your Airflow '
            "role may not read its DAG.</p>"
        )
    if model.statuses:
        parts.append(_overview(model, now))
        parts.extend(_section(s, model.runs, now) for s in model.statuses)
    elif not model.config_error and not model.hidden_tables:
        parts.append('<p class="muted">No tables configured.</p>')
    body = "".join(parts)
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>Change data capture</title><style>{CSS}</style></head>"
        f"<body>{body}<script>{SCRIPT}</script></body></html>"
    )

"""The CDC page: server-rendered HTML, inline CSS, a few lines of JavaScript for auto-refresh.

No template engine and no build step: every value goes through :func:`html.escape`.
The page is shown inside Airflow's UI (an iframe under ``/plugin/cdc``), so
links to Airflow's own pages open at the top level (``target="_top"``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from html import escape
from typing import Any

from iceberg_cdc.ui.status import ProcessedSnapshot, TableStatus
from iceberg_cdc.units import format_bytes

REFRESH_SECONDS = 30


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


def _e(value: Any) -> str:
    return escape("" if value is None else str(value), quote=True)


def fmt_int(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


def fmt_bytes(value: int | None) -> str:
    return "—" if value is None else format_bytes(value)


def fmt_age(seconds: float | None) -> str:
    """``42 s``, ``5 min``, ``3 h 20 min``, ``2 d 4 h``."""
    if seconds is None:
        return "—"
    s = int(max(0, seconds))
    if s < 60:
        return f"{s} s"
    minutes, s = divmod(s, 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def fmt_time(value: datetime | None) -> str:
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def fmt_seconds(value: float) -> str:
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 100 else f"{value:.0f}"


def _time_tag(value: datetime | None, now: datetime) -> str:
    if value is None:
        return "—"
    age = (now - value).total_seconds()
    return f'<time datetime="{_e(value.isoformat())}" title="{_e(fmt_time(value))}">{_e(fmt_age(age))} ago</time>'


_STATE_LABEL = {"caught-up": "caught up", "behind": "behind", "error": "error", "unknown": "unknown"}


def _badge(status: TableStatus) -> str:
    label = _STATE_LABEL[status.state]
    if status.state == "behind":
        label = f"{status.pending} pending"
    return f'<span class="badge {status.state}" data-field="state">{_e(label)}</span>'


def _run_badge(state: str | None) -> str:
    if not state:
        return '<span class="muted">no runs</span>'
    return f'<span class="run-state {_e(state)}">{_e(state)}</span>'


def _anchor(source: str) -> str:
    return "table-" + "".join(c if c.isalnum() or c in "-_" else "-" for c in source)


def _kind(snapshot: ProcessedSnapshot) -> str:
    parts = []
    if snapshot.initial_load:
        parts.append("initial load")
    elif snapshot.operation:
        parts.append(snapshot.operation)
    if snapshot.reprocess:
        parts.append("reprocess")
    return " · ".join(parts) or "—"


def _phases(snapshot: ProcessedSnapshot) -> str:
    if not snapshot.seconds:
        return '<span class="muted">—</span>'
    items = " ".join(
        f'<span class="phase"><span class="muted">{_e(name)}</span> {_e(fmt_seconds(value))}</span>'
        for name, value in snapshot.seconds.items()
    )
    return f'<span class="total">{_e(fmt_seconds(snapshot.total_seconds or 0))} s</span> {items}'


def _conservation(snapshot: ProcessedSnapshot) -> str:
    rows = snapshot.rows
    if not rows:
        return '<span class="muted">not recorded</span>'
    text = (
        f"{fmt_int(rows.get('input'))} in → {fmt_int(rows.get('shuffled'))} shuffled → "
        f"{fmt_int(rows.get('read'))} read = {fmt_int(rows.get('carryover'))} carryover + "
        f"{fmt_int(rows.get('changes'))} changes"
    )
    balanced = snapshot.balanced
    mark = (
        '<span class="ok" title="rows add up">✓</span>'
        if balanced
        else '<span class="bad" title="rows do not add up">✗</span>'
        if balanced is False
        else ""
    )
    return f'<span class="rows">{_e(text)}</span> {mark}'


def _recent_table(status: TableStatus, now: datetime) -> str:
    if not status.recent:
        if status.sink_exists:
            return '<p class="muted">No commits from this source in the sink yet.</p>'
        return ""
    head = (
        "<tr><th>Ordinal</th><th>Source snapshot</th><th>Committed</th><th>Kind</th>"
        '<th class="num">INSERT</th><th class="num">DELETE</th><th class="num">UPDATE</th>'
        '<th class="num">Carryover</th><th class="num">Shuffled</th><th>Rows (conservation)</th>'
        "<th>Seconds per phase</th><th>Warnings</th></tr>"
    )
    body = []
    for s in status.recent:
        warnings = "".join(f'<div class="warn" data-field="skew-warning">⚠ {_e(w)}</div>' for w in s.skew)
        body.append(
            f'<tr data-snapshot="{_e(s.source_snapshot_id)}">'
            f'<td class="num">{_e(fmt_int(s.ordinal))}</td>'
            f'<td class="mono">{_e(s.source_snapshot_id)}</td>'
            f"<td>{_time_tag(s.committed_at, now)}</td>"
            f"<td>{_e(_kind(s))}</td>"
            f'<td class="num" data-field="inserts">{_e(fmt_int(s.inserts))}</td>'
            f'<td class="num" data-field="deletes">{_e(fmt_int(s.deletes))}</td>'
            f'<td class="num" data-field="updates">{_e(fmt_int(s.updates))}</td>'
            f'<td class="num" data-field="carryover">{_e(fmt_int(s.carryover_rows))}</td>'
            f'<td class="num" data-field="shuffle-bytes">{_e(fmt_bytes(s.shuffle_bytes))}</td>'
            f"<td>{_conservation(s)}</td>"
            f'<td class="phases">{_phases(s)}</td>'
            f'<td class="warnings">{warnings or "<span class=muted>—</span>"}</td>'
            "</tr>"
        )
    return (
        f'<div class="scroll"><table class="grid recent"><thead>{head}</thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
        '<p class="hint">UPDATE counts pairs (an UPDATE_BEFORE and an UPDATE_AFTER row each). Snapshots whose '
        "changes all cancelled out, and skipped <code>replace</code> snapshots, move the watermark "
        "without a sink commit and are not listed.</p>"
    )


def _failed_runs(runs: Any, now: datetime) -> str:
    if runs is None:
        return ""
    if runs.error:
        return f'<p class="error">Airflow\'s runs of this DAG cannot be read: {_e(runs.error)}</p>'
    if not runs.failed:
        return '<p class="muted" data-field="failed-runs">No failed runs.</p>'
    body = []
    for run in runs.failed:
        tasks = (
            ", ".join(
                f'<a href="{_e(t.url)}" target="_top">{_e(t.task_id)}'
                f"{'' if t.map_index < 0 else f' [{t.map_index}]'}</a>"
                for t in run.failed_tasks
            )
            or '<span class="muted">—</span>'
        )
        error = next((t.error for t in run.failed_tasks if t.error), None)
        if error:
            error_html = f'<code class="error-line">{_e(error)}</code>'
        elif run.note:  # e.g. `airflow dags test` runs: no log to read, but the run's note names the error
            error_html = (
                f'<code class="error-line" data-field="run-note">{_e(run.note)}</code>'
                '<div class="muted">from the run\'s note</div>'
            )
        else:
            error_html = '<span class="muted">not in the log (see the task\'s log)</span>'

        snapshot = f'<div class="muted">snapshot {_e(run.snapshot_id)}</div>' if run.snapshot_id else ""
        body.append(
            f'<tr data-run="{_e(run.run_id)}">'
            f'<td><a href="{_e(run.url)}" target="_top" class="mono">{_e(run.run_id)}</a>{snapshot}</td>'
            f"<td>{_time_tag(run.ended_at or run.run_after, now)}</td>"
            f"<td>{tasks}</td><td>{error_html}</td></tr>"
        )
    return (
        '<div class="scroll"><table class="grid failed" data-field="failed-runs"><thead><tr><th>Run</th>'
        "<th>Ended</th><th>Failed task</th><th>First error</th></tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def _recent_runs(runs: Any, now: datetime) -> str:
    """The DAG's last runs with their notes: what each did, or why it failed (Airflow's Runs list has no note column)."""
    if runs is None or runs.error or not getattr(runs, "recent", None):
        return ""
    body = []
    for run in runs.recent:
        note = (
            f'<span data-field="run-note">{_e(run.note)}</span>'
            if run.note
            else '<span class="muted">no note (the run has not ended, or ended before runs were noted)</span>'
        )
        body.append(
            f'<tr data-run="{_e(run.run_id)}">'
            f'<td><a href="{_e(run.url)}" target="_top" class="mono">{_e(run.run_id)}</a></td>'
            f"<td>{_run_badge(run.state)}</td>"
            f"<td>{_time_tag(run.ended_at or run.started_at or run.run_after, now)}</td>"
            f"<td>{note}</td></tr>"
        )
    return (
        "<h3>Recent runs</h3>"
        '<div class="scroll"><table class="grid runs" data-field="recent-runs"><thead><tr><th>Run</th>'
        "<th>State</th><th>Ended</th><th>Note</th></tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


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
            f" ({_e(first['kept_by'])})" if first.get("kept_by") else ""
        )
    else:
        role = "the watermark's snapshot" if first.get("role") == "watermark" else "a pending snapshot"
        when = "now" if left <= 0 else f"in {_e(fmt_age(left))}"
        text = f'{role} <span class="mono">{_e(first.get("snapshot_id"))}</span> may be expired {when} ({_e(first.get("kept_by"))})'
    if status.retention_warning:
        return f'<span class="warn" data-field="retention" title="{_e(status.retention_warning)}">⚠ {text}</span>'
    return f'<span data-field="retention">{text}</span>'


def _facts(status: TableStatus, runs: Any, now: datetime) -> str:
    items = []
    if status.watermark_snapshot_id is not None:
        made = (
            f", made {_time_tag(status.watermark_snapshot_at, now)}" if status.watermark_snapshot_at else ""
        )
        items.append(
            (
                "Watermark",
                f'snapshot <span class="mono" data-field="watermark-snapshot">{_e(status.watermark_snapshot_id)}</span>'
                f' · ordinal <span data-field="watermark-ordinal">{_e(status.watermark_ordinal)}</span>{made}',
            )
        )
    else:
        items.append(("Watermark", '<span class="muted" data-field="watermark-snapshot">none yet</span>'))
    if status.pending is not None:
        if status.pending:
            oldest = ""
            if status.oldest_pending_snapshot_id is not None:
                oldest = (
                    f' · oldest <span class="mono">{_e(status.oldest_pending_snapshot_id)}</span>'
                    f" waiting {_e(fmt_age(status.oldest_pending_age_seconds))}"
                )
            lag = f'<span data-field="pending">{_e(status.pending)}</span> snapshot{"s" if status.pending != 1 else ""} pending{oldest}'
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
                f'snapshot <span class="mono">{_e(status.source_snapshot_id)}</span>, made '
                f"{_time_tag(status.source_snapshot_at, now)}",
            )
        )
    if status.lease is not None:
        items.append(
            (
                "Running",
                f'run <span class="mono">{_e(status.lease.owner)}</span> holds the lease (epoch '
                f"{_e(status.lease.epoch)}, host {_e(status.lease.host)}, until {_e(fmt_time(status.lease.expires_at))})",
            )
        )
    elif status.lease_checked:
        items.append(("Running", '<span class="muted">no run holds the lease</span>'))
    if runs is not None and runs.latest is not None:
        latest = runs.latest
        items.append(
            (
                "Latest run",
                f'<a href="{_e(latest.url)}" target="_top" class="mono">{_e(latest.run_id)}</a> '
                f"{_run_badge(latest.state)} {_time_tag(latest.ended_at or latest.started_at or latest.run_after, now)}"
                + (
                    f'<div class="run-note" data-field="latest-note">{_e(latest.note)}</div>'
                    if latest.note
                    else ""
                ),
            )
        )
    elif runs is not None and not runs.error:
        known = "" if runs.known else " (the DAG is not in Airflow's database yet)"
        items.append(("Latest run", f'<span class="muted">none{_e(known)}</span>'))
    if status.skewed_commits:
        newest = next(s for s in status.recent if s.skew)
        items.append(
            (
                "Skew",
                f'<span class="warn" data-field="skew">⚠ {_e(status.skewed_commits)} of the last '
                f"{_e(len(status.recent))} commits had skewed partitions</span> (latest: snapshot "
                f'<span class="mono">{_e(newest.source_snapshot_id)}</span>, {_e(newest.skew[0])}): '
                "skewed keys; a read task takes each skewed partition alone and is the run's long pole",
            )
        )
    for mirror in status.mirrors:
        items.append((f"Mirror {_e(mirror.name)}", _mirror_fact(mirror, now)))
    if runs is not None and runs.paused:
        items.append(("DAG", '<span class="warn">paused</span>'))
    items.append(("Start", _e(status.start)))
    return '<dl class="facts">' + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in items) + "</dl>"


def _mirror_fact(mirror: Any, now: datetime) -> str:
    """A mirror's line: its target, watermark and lag (or why they cannot be read)."""
    where = f'{_e(mirror.type)} <span class="mono">{_e(mirror.table)}</span>'
    if mirror.error:
        return f'{where}: <span class="warn" data-field="mirror-error">{_e(mirror.error)}</span>'
    if mirror.snapshot_id is None:
        at = '<span class="muted">nothing applied yet</span>'
    else:
        made = f", made {_time_tag(mirror.snapshot_at, now)}" if mirror.snapshot_at else ""
        at = (
            f'at snapshot <span class="mono" data-field="mirror-snapshot">{_e(mirror.snapshot_id)}</span>'
            f" · ordinal {_e(mirror.ordinal)}{made}"
        )
    if mirror.behind_changelog is None:
        lag = ""
    elif mirror.behind_changelog or mirror.behind_source:
        lag = (
            f' · <span class="warn" data-field="mirror-lag">{_e(mirror.behind_changelog)} changelog snapshot(s) '
            f"behind</span> ({_e(mirror.behind_source)} behind the source)"
        )
    else:
        lag = ' · <span data-field="mirror-lag">caught up</span>'
    return f'{where} {at}{lag} · DAG <span class="mono">{_e(mirror.dag_id)}</span>'


def _section(status: TableStatus, runs: Any, now: datetime) -> str:
    dag_link = (
        f'<a class="dag-link" href="{_e(runs.url)}" target="_top">DAG {_e(status.dag_id)}</a>'
        if runs is not None
        else f'<span class="dag-link">DAG {_e(status.dag_id)}</span>'
    )
    errors = "".join(f'<p class="error" data-field="error">{_e(e)}</p>' for e in status.errors)
    notes = "".join(f'<p class="note">{_e(n)}</p>' for n in status.notes)
    return (
        f'<section class="card" id="{_e(_anchor(status.source))}" data-source="{_e(status.source)}">'
        f'<h2><span class="mono">{_e(status.source)}</span> → <span class="mono">{_e(status.sink)}</span> '
        f"{_badge(status)} {dag_link}</h2>"
        f"{errors}{notes}{_facts(status, runs, now)}"
        f"<h3>Last processed snapshots</h3>{_recent_table(status, now)}"
        f"{_recent_runs(runs, now)}"
        f"<h3>Failed runs</h3>{_failed_runs(runs, now)}"
        "</section>"
    )


def _overview(model: PageModel, now: datetime) -> str:
    rows = []
    for status in model.statuses:
        runs = model.runs.get(status.dag_id)
        last = status.last_commit
        latest = runs.latest if runs is not None else None
        failed = len(runs.failed) if runs is not None else None
        watermark = (
            f'<span class="mono">{_e(status.watermark_snapshot_id)}</span> <span class="muted">#{_e(status.watermark_ordinal)}</span>'
            if status.watermark_snapshot_id is not None
            else '<span class="muted">none</span>'
        )
        rows.append(
            f'<tr data-source="{_e(status.source)}">'
            f'<td><a href="#{_e(_anchor(status.source))}" class="mono">{_e(status.source)}</a></td>'
            f"<td>{_badge(status)}</td>"
            f"<td>{watermark}</td>"
            f'<td class="num">{_e(fmt_int(status.pending))}</td>'
            f"<td>{_e(fmt_age(status.oldest_pending_age_seconds)) if status.pending else '—'}</td>"
            f"<td>{_time_tag(last.committed_at, now) if last else '—'}</td>"
            f"<td>{_run_badge(latest.state if latest else None)}</td>"
            f'<td class="num">{_e(fmt_int(failed)) if failed is not None else "—"}</td>'
            "</tr>"
        )
    return (
        '<div class="scroll"><table class="grid overview"><thead><tr><th>Source table</th><th>State</th>'
        '<th>Watermark</th><th class="num">Pending</th><th>Oldest pending</th><th>Last commit</th>'
        '<th>Latest run</th><th class="num">Failed runs</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


_CSS = """
:root { color-scheme: light dark; --fg:#1f2328; --muted:#656d76; --bg:#fff; --card:#f6f8fa; --line:#d0d7de;
  --ok:#1a7f37; --warn:#9a6700; --bad:#cf222e; --link:#0969da; }
@media (prefers-color-scheme: dark) { :root { --fg:#e6edf3; --muted:#8d96a0; --bg:#0d1117; --card:#161b22;
  --line:#30363d; --ok:#3fb950; --warn:#d29922; --bad:#f85149; --link:#4493f8; } }
* { box-sizing: border-box; }
body { margin: 0; padding: 16px 20px 40px; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif;
  color: var(--fg); background: var(--bg); }
a { color: var(--link); text-decoration: none; } a:hover { text-decoration: underline; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 0 0 8px; } h3 { font-size: 14px; margin: 16px 0 6px; }
header p { margin: 0 0 14px; color: var(--muted); }
.mono, code { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12.5px; }
.muted { color: var(--muted); } .hint { color: var(--muted); font-size: 12px; margin: 4px 0 0; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 14px 16px; margin: 16px 0; }
.grid { border-collapse: collapse; width: 100%; background: var(--bg); }
.grid th, .grid td { border: 1px solid var(--line); padding: 4px 8px; text-align: left; vertical-align: top; }
.grid th { font-weight: 600; white-space: nowrap; background: var(--card); }
.grid td.num, .grid th.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px; font-weight: 600; color: #fff; }
.badge.caught-up { background: var(--ok); } .badge.behind { background: var(--warn); }
.badge.error { background: var(--bad); } .badge.unknown { background: var(--muted); }
.run-state { font-weight: 600; } .run-state.success { color: var(--ok); } .run-state.failed { color: var(--bad); }
.run-state.running, .run-state.queued { color: var(--warn); }
.run-note { font-size: 0.9em; margin-top: 2px; }
td.warnings { min-width: 14em; }
.dag-link { font-size: 13px; font-weight: normal; margin-left: 8px; }
.facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 8px 0 0; }
.facts dt { color: var(--muted); } .facts dd { margin: 0; }
.error { color: var(--bad); margin: 4px 0; } .note { color: var(--muted); margin: 4px 0; font-style: italic; }
.warn { color: var(--warn); } .ok { color: var(--ok); font-weight: 700; } .bad { color: var(--bad); font-weight: 700; }
.phases { font-size: 12px; } .phase { white-space: nowrap; margin-right: 6px; } .total { font-weight: 600; margin-right: 6px; }
.rows { font-size: 12px; } .error-line { color: var(--bad); white-space: pre-wrap; word-break: break-word; }
.scroll { overflow-x: auto; }
.toolbar { float: right; color: var(--muted); font-size: 12px; } .toolbar label { cursor: pointer; }
"""

_JS = """
(function () {
  var box = document.getElementById("auto-refresh"), key = "cdc-ui-auto-refresh", timer = null;
  if (!box) return;
  try { box.checked = localStorage.getItem(key) !== "off"; } catch (e) {}
  function arm() { clearTimeout(timer); if (box.checked) timer = setTimeout(function () { location.reload(); }, REFRESH_MS); }
  box.addEventListener("change", function () {
    try { localStorage.setItem(key, box.checked ? "on" : "off"); } catch (e) {}
    arm();
  });
  arm();
})();
""".replace("REFRESH_MS", str(REFRESH_SECONDS * 1000))


def render_page(model: PageModel) -> str:
    now = model.generated_at
    parts = []
    count = len(model.statuses)
    subtitle = [f"{count} table{'s' if count != 1 else ''}"]
    if model.config_path:
        subtitle.append(f'config <span class="mono">{_e(model.config_path)}</span>')
    subtitle.append(f"read {_e(fmt_time(now))}")
    subtitle.append(f'<a href="{_e(model.api_href)}">JSON</a>')
    parts.append(
        '<header><div class="toolbar"><label><input type="checkbox" id="auto-refresh" checked> '
        f"refresh every {REFRESH_SECONDS} s</label></div>"
        "<h1>Change data capture</h1>"
        f"<p>{' · '.join(subtitle)}</p></header>"
    )
    if model.config_error:
        parts.append(f'<p class="error" data-field="config-error">{_e(model.config_error)}</p>')
    if model.hidden_tables:
        n = model.hidden_tables
        parts.append(
            f'<p class="note">{n} configured table{"s are" if n != 1 else " is"} not shown: your Airflow '
            "role may not read its DAG.</p>"
        )
    if model.statuses:
        parts.append(_overview(model, now))
        parts.extend(_section(s, model.runs.get(s.dag_id), now) for s in model.statuses)
    elif not model.config_error and not model.hidden_tables:
        parts.append('<p class="muted">No tables configured.</p>')
    body = "".join(parts)
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>Change data capture</title><style>{_CSS}</style></head>"
        f"<body>{body}<script>{_JS}</script></body></html>"
    )

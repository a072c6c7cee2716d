"""How the CDC page writes values, and its style and script: no template engine, no build step.

Every value goes through :func:`esc` (:func:`html.escape`); byte sizes use the
same binary units as the run notes.
"""

from __future__ import annotations

from datetime import UTC, datetime
from html import escape
from typing import Any

from iceberg_cdc.units import format_bytes, format_duration

REFRESH_SECONDS = 30


def esc(value: Any) -> str:
    return escape("" if value is None else str(value), quote=True)


def fmt_int(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


def fmt_bytes(value: int | None) -> str:
    """Binary units, as the run notes use (:func:`~iceberg_cdc.units.format_bytes`)."""
    return "—" if value is None else format_bytes(value)


def fmt_age(seconds: float | None) -> str:
    """An age as :func:`iceberg_cdc.units.format_duration` writes it; ``—`` when unknown."""
    return "—" if seconds is None else format_duration(seconds)


def fmt_time(value: datetime | None) -> str:
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def fmt_clock(value: datetime, now: datetime) -> str:
    """``04:12 UTC`` on the day of ``now`` (UTC), else ``2026-01-02 04:12 UTC``: when something began."""
    value, now = value.astimezone(UTC), now.astimezone(UTC)
    return value.strftime("%H:%M UTC" if value.date() == now.date() else "%Y-%m-%d %H:%M UTC")


def fmt_seconds(value: float) -> str:
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 100 else f"{value:.0f}"


def time_tag(value: datetime | None, now: datetime) -> str:
    if value is None:
        return "—"
    age = (now - value).total_seconds()
    return f'<time datetime="{esc(value.isoformat())}" title="{esc(fmt_time(value))}">{esc(fmt_age(age))} ago</time>'


CSS = """
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
.badge.error, .badge.late, .badge.blocked { background: var(--bad); } .badge.unknown { background: var(--muted); }
.run-state { font-weight: 600; } .run-state.success { color: var(--ok); } .run-state.failed { color: var(--bad); }
.run-state.running, .run-state.queued { color: var(--warn); }
.run-note { font-size: 0.9em; margin-top: 2px; }
/* The snapshots table fits its card at 1,400 px, framed by Airflow's UI too (its nav takes ~70 px): a smaller
   font and padding, its headers and Kind's marks wrap (snapshot ids stay whole), the warnings share the
   width; ~1,180 px wide at the least, with a bridge's two ids (the .scroll box scrolls below that). */
.grid.recent { font-size: 13px; } .grid.recent th, .grid.recent td { padding: 4px 6px; }
.grid.recent th { white-space: normal; } td.warnings { min-width: 9em; overflow-wrap: anywhere; }
.bridge-mark { font-size: 12px; }
.dag-link { font-size: 13px; font-weight: normal; margin-left: 8px; }
.facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 8px 0 0; }
.facts dt { color: var(--muted); } .facts dd { margin: 0; }
.error { color: var(--bad); margin: 4px 0; } .note { color: var(--muted); margin: 4px 0; font-style: italic; }
.warn { color: var(--warn); } .ok { color: var(--ok); font-weight: 700; } .bad { color: var(--bad); font-weight: 700; }
.phases { font-size: 12px; } .phase { white-space: nowrap; margin-right: 6px; } .total { font-weight: 600; margin-right: 6px; }
.rows { font-size: 12px; } .error-line { color: var(--bad); white-space: pre-wrap; word-break: break-word; }
.scroll { overflow-x: auto; }
.blocked-line { color: var(--bad); margin: 4px 0; font-weight: 600; }
.blocked-line .fix, .blocked-line code { font-weight: normal; }
.failure { font-size: 12px; } .failure.blocking { color: var(--bad); font-weight: 700; }
.failure.harmless { color: var(--muted); }
tr.replaced td { color: var(--muted); } tr.replaced td.mono { text-decoration: line-through; }
.replaced-mark { color: var(--warn); font-size: 12px; }
.toolbar { float: right; color: var(--muted); font-size: 12px; } .toolbar label { cursor: pointer; }
"""

SCRIPT = """
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


def login_page(login_url: str | None) -> str:
    """What a browser without a login gets with its 401: a note, and on to Airflow's login page."""
    go = body = ""
    if login_url:
        target = esc(login_url)
        go = f'<meta http-equiv="refresh" content="0; url={target}">'
        body = f'<a href="{target}" target="_top">Log in</a> to Airflow to see this page.'
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>Log in - Change data capture</title>{go}<style>{CSS}</style></head>"
        f"<body><p>{body or 'Log in to Airflow to see this page.'}</p></body></html>"
    )

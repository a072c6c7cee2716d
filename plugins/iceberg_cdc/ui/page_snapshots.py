"""The CDC page's table of the last processed snapshots: one row per sink commit, with its figures.

Built from :class:`~iceberg_cdc.ui.sink_history.ProcessedSnapshot`; every value
goes through :func:`~iceberg_cdc.ui.page_format.esc`.
"""

from __future__ import annotations

from datetime import datetime

from iceberg_cdc.run.story import bridge_label
from iceberg_cdc.ui.page_format import esc, fmt_bytes, fmt_int, fmt_seconds, time_tag
from iceberg_cdc.ui.sink_history import ProcessedSnapshot
from iceberg_cdc.ui.table_status import TableStatus


def _kind(snapshot: ProcessedSnapshot, now: datetime) -> str:
    parts = []
    if snapshot.initial_load:
        parts.append("initial load")
    elif snapshot.operation:
        parts.append(snapshot.operation)
    if snapshot.reprocess:
        parts.append("reprocess")
    kind = esc(" · ".join(parts) or "—")
    if snapshot.bridge:
        kind += (
            f'<div class="bridge-mark" data-field="bridge" title="one commit of the net change over a gap '
            f"in the source's history\">{esc(bridge_label(snapshot.bridge))}</div>"
        )
    if snapshot.replaced:
        kind += (
            f'<div class="replaced-mark" data-field="replaced" title="its rows were deleted by sink commit '
            f'{esc(snapshot.replaced_by)}">replaced by a reprocess {time_tag(snapshot.replaced_at, now)}</div>'
        )
    return kind


def _phases(snapshot: ProcessedSnapshot) -> str:
    if not snapshot.seconds:
        return '<span class="muted">—</span>'
    items = " ".join(
        f'<span class="phase"><span class="muted">{esc(name)}</span> {esc(fmt_seconds(value))}</span>'
        for name, value in snapshot.seconds.items()
    )
    return f'<span class="total">{esc(fmt_seconds(snapshot.total_seconds or 0))} s</span> {items}'


def _conservation(snapshot: ProcessedSnapshot) -> str:
    rows = snapshot.rows
    if not rows:
        return '<span class="muted">not recorded</span>'
    cancelled = f", {fmt_int(rows['cancelled'])} cancelled" if rows.get("cancelled") else ""
    text = (
        f"{fmt_int(rows.get('input'))} in{cancelled} → {fmt_int(rows.get('shuffled'))} shuffled → "
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
    return f'<span class="rows">{esc(text)}</span> {mark}'


def recent_table(status: TableStatus, now: datetime) -> str:
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
        warnings = "".join(f'<div class="warn" data-field="skew-warning">⚠ {esc(w)}</div>' for w in s.skew)
        replaced = ' class="replaced" data-replaced="true"' if s.replaced else ""
        body.append(
            f'<tr data-snapshot="{esc(s.source_snapshot_id)}"{replaced}>'
            f'<td class="num">{esc(fmt_int(s.ordinal))}</td>'
            f'<td class="mono">{esc(s.source_snapshot_id)}</td>'
            f"<td>{time_tag(s.committed_at, now)}</td>"
            f"<td>{_kind(s, now)}</td>"
            f'<td class="num" data-field="inserts">{esc(fmt_int(s.inserts))}</td>'
            f'<td class="num" data-field="deletes">{esc(fmt_int(s.deletes))}</td>'
            f'<td class="num" data-field="updates">{esc(fmt_int(s.updates))}</td>'
            f'<td class="num" data-field="carryover">{esc(fmt_int(s.carryover_rows))}</td>'
            f'<td class="num" data-field="shuffle-bytes">{esc(fmt_bytes(s.shuffle_bytes))}</td>'
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
        "without a sink commit and are not listed. A commit a later reprocess replaced (its rows deleted) "
        "is struck through.</p>"
    )

"""The CDC page's mirror section: one row per mirror of a table.

Per mirror: the changelog snapshot it reached (and the source snapshot that
is), its lag in snapshots and in time, its last apply's rows and seconds, the
last failed run of its DAG with the error line (which names the fix), and its
last verification. Built from :class:`~iceberg_cdc.ui.mirrors.MirrorStatus`
and the mirror DAG's runs (:class:`~iceberg_cdc.airflow.views.airflow_side.DagRuns`,
keyed by DAG id like the table's own); every value goes through
:func:`~iceberg_cdc.ui.page_format.esc`.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from iceberg_cdc.ui.page_format import esc, fmt_age, fmt_int, fmt_seconds, time_tag
from iceberg_cdc.ui.page_runs import run_badge
from iceberg_cdc.verify_status import VerifyStatus


def mirror_section(
    mirrors: list[Any], runs: Mapping[str, Any], now: datetime, *, table_blocked: bool = False
) -> str:
    """The ``Mirrors`` heading and table ('' for a table without mirrors).

    ``table_blocked``: the table's own DAG is blocked, so a mirror caught up with
    the changelog waits on it (its lag is the changelog's, not its own).
    """
    if not mirrors:
        return ""
    head = (
        "<tr><th>Mirror</th><th>Reached</th><th>Lag</th><th>Last apply</th>"
        "<th>Last failure</th><th>Verified</th><th>DAG</th></tr>"
    )
    body = "".join(_row(m, runs.get(m.dag_id), now, table_blocked) for m in mirrors)
    return (
        '<h3>Mirrors</h3><div class="scroll"><table class="grid mirrors" data-field="mirrors">'
        f"<thead>{head}</thead><tbody>{body}</tbody></table></div>"
        '<p class="hint">Each mirror DAG runs on the changelog\'s asset events and applies every changelog '
        "snapshot after its watermark at once. Lag in time: how long the oldest source change the mirror "
        "does not hold has been waiting. The last apply is the latest apply run, one that changed no row "
        "included, read from the mirror itself (PostgreSQL: its state table; Iceberg: its table "
        "properties).</p>"
    )


def _row(mirror: Any, runs: Any, now: datetime, table_blocked: bool = False) -> str:
    where = f'{esc(mirror.type)} <span class="mono">{esc(mirror.table)}</span>'
    cells = [f'<td><b>{esc(mirror.name)}</b><div class="muted">{where}</div></td>']
    if mirror.error:
        cells.append(
            f'<td colspan="3"><span class="warn" data-field="mirror-error">{esc(mirror.error)}</span></td>'
        )
    else:
        cells += [
            f"<td>{_reached(mirror, now)}</td>",
            f"<td>{_lag(mirror, table_blocked)}</td>",
            f"<td>{_applied(mirror, now)}</td>",
        ]
    cells += [
        f"<td>{_failure(runs, now)}</td>",
        f"<td>{verified(mirror, now)}</td>",
        f"<td>{_dag(mirror, runs, now)}</td>",
    ]
    return f'<tr data-mirror="{esc(mirror.name)}" data-state="{esc(mirror.state)}">{"".join(cells)}</tr>'


def _reached(mirror: Any, now: datetime) -> str:
    if mirror.snapshot_id is None:
        return '<span class="muted" data-field="mirror-snapshot">nothing applied yet</span>'
    made = f"<div>made {time_tag(mirror.snapshot_at, now)}</div>" if mirror.snapshot_at else ""
    changelog = (
        f'<div class="muted">changelog snapshot <span class="mono" data-field="mirror-changelog-snapshot">'
        f"{esc(mirror.changelog_snapshot_id)}</span></div>"
        if mirror.changelog_snapshot_id is not None
        else ""
    )
    return (
        f'source snapshot <span class="mono" data-field="mirror-snapshot">{esc(mirror.snapshot_id)}</span> '
        f'<span class="muted">#{esc(mirror.ordinal)}</span>{changelog}{made}'
    )


def _lag(mirror: Any, table_blocked: bool = False) -> str:
    if mirror.behind_changelog is None:
        return '<span class="muted" data-field="mirror-lag">unknown</span>'
    if not (mirror.behind_changelog or mirror.behind_source):
        return '<span data-field="mirror-lag">caught up</span>'
    if not mirror.behind_changelog:  # it holds the whole changelog: the lag is the changelog's own
        why = (
            "waits on the blocked table (see its error above)"
            if table_blocked
            else "waits for the changelog's next commit"
        )
        return (
            f'<span data-field="mirror-lag">caught up with the changelog</span>; <span class="muted" '
            f'data-field="mirror-lag-source">{why}: {esc(mirror.behind_source)} source snapshot(s) not in '
            "the changelog yet</span>"
        )
    age = mirror.lag_seconds
    waiting = (
        f'<div>oldest change waiting <span data-field="mirror-lag-age">{esc(fmt_age(age))}</span></div>'
        if age is not None
        else ""
    )
    if mirror.late:
        waiting += (
            f'<div class="bad" data-field="mirror-late">late: over its freshness SLO of '
            f"{esc(fmt_age(mirror.freshness_slo))}</div>"
        )
    return (
        f'<span class="warn" data-field="mirror-lag">{esc(mirror.behind_changelog)} changelog snapshot(s) '
        f"behind</span> ({esc(mirror.behind_source)} behind the source){waiting}"
    )


def _applied(mirror: Any, now: datetime) -> str:
    if mirror.last_apply_error:
        return f'<span class="warn" data-field="mirror-apply">{esc(mirror.last_apply_error)}</span>'
    last = mirror.last_apply
    if last is None:
        return '<span class="muted" data-field="mirror-apply">none recorded</span>'
    # Upserts first on every target, whatever order the record kept (a JSON property sorts its keys).
    ordered = sorted(last.rows.items(), key=lambda item: (item[0] != "upserted", item[0]))
    rows = ", ".join(f"{fmt_int(n)} {name}" for name, n in ordered) or "rows not recorded"
    seconds = (
        f' in <span data-field="mirror-apply-seconds">{esc(fmt_seconds(last.seconds))} s</span>'
        if last.seconds is not None
        else ""
    )
    phases = (
        '<div class="muted">'
        + esc(", ".join(f"{k} {fmt_seconds(v)}" for k, v in last.phases.items()))
        + "</div>"
        if last.phases
        else ""
    )
    when = f"<div>{time_tag(last.at, now)}</div>" if last.at else ""
    return f'<span data-field="mirror-apply-rows">{esc(rows)}</span>{seconds}{phases}{when}'


def _failure(runs: Any, now: datetime) -> str:
    """The mirror DAG's last failed run: when, and its first error line (else its note), as the table's are shown."""
    if runs is None:
        return '<span class="muted">—</span>'
    if runs.error:
        return f'<span class="warn">runs not readable: {esc(runs.error)}</span>'
    if not runs.failed:
        return '<span class="muted" data-field="mirror-failure">none</span>'
    run = runs.failed[0]
    error = next((f"{t.task_id}: {t.error}" for t in run.failed_tasks if t.error), None) or run.note
    line = (
        f'<code class="error-line">{esc(error)}</code>'
        if error
        else '<span class="muted">not in the log (see the task\'s log)</span>'
    )
    return (
        f'<div data-field="mirror-failure"><a href="{esc(run.url)}" target="_top" class="mono">{esc(run.run_id)}</a> '
        f"{time_tag(run.ended_at or run.run_after, now)}</div>{line}"
    )


def _dag(mirror: Any, runs: Any, now: datetime) -> str:
    name = f'<span class="mono">{esc(mirror.dag_id)}</span>'
    if runs is None:
        return name
    link = f'<a href="{esc(runs.url)}" target="_top" class="mono">{esc(mirror.dag_id)}</a>'
    latest = runs.latest
    state = (
        f"<div>{run_badge(latest.state)} {time_tag(latest.started_at or latest.run_after, now)}</div>"
        if latest
        else f"<div>{run_badge(None)}</div>"
    )
    paused = '<div class="warn">paused</div>' if runs.paused else ""
    return f"{link}{state}{paused}"


def verified(mirror: Any, now: datetime) -> str:
    """The last verification: when, at which snapshot, equal / keys repaired / keys that still differ."""
    found = mirror.verification
    if not found or not found.get("verified_at"):
        return '<span data-field="mirror-verified">never verified</span>'
    when = time_tag(datetime.fromtimestamp(float(found["verified_at"]), tz=UTC), now)
    at = (found.get("at") or {}).get("source_snapshot_id")
    where = f' at snapshot <span class="mono">{esc(at)}</span>' if at else ""
    verified_ordinal = (found.get("at") or {}).get("ordinal")
    if verified_ordinal is not None and mirror.ordinal is not None and int(verified_ordinal) < mirror.ordinal:
        where += (
            f' <span class="warn" data-field="mirror-verified-older">(#{esc(verified_ordinal)}: older than '
            f"the mirror's #{esc(mirror.ordinal)}; it says nothing of what was applied since)</span>"
        )
    status = found.get("status")
    if status == VerifyStatus.EQUAL:
        verdict = "equal"
    elif status == VerifyStatus.REPAIRED:
        verdict = f"{esc(found.get('repaired_keys', 0))} keys repaired"
    elif status == VerifyStatus.NOT_APPLIED:
        verdict = "nothing applied yet"
    else:
        verdict = f'<span class="warn">{esc(found.get("left_keys", 0))} keys differ</span>'
    return f'<span data-field="mirror-verified">verified {when}{where}: {verdict}</span>'

"""One line that says what a DAG run did, for the places an operator looks first.

Built from the small dicts the steps return (detect's, commit's, watermark's),
so the Airflow task that shows it (a run note, a log line, an asset event's
extra) needs no second look at storage. No Airflow import.

:func:`run_note` is the DAG run's note in Airflow's Runs list and grid: the
story of a run that succeeded, ``caught up``, or for a failed run the first
failed task and its error line (:func:`iceberg_cdc.error_lines.line_of`,
recorded by the task's failure callback). Notes go through
:func:`iceberg_cdc.redaction.redact` and fit Airflow's 1,000-character note
column, losing their middle rather than their end.

A run's history stays true: when a run that already ended is cleared and
ends again, :func:`merged_note` appends what the new attempt did to the note
instead of replacing it, so the first committed story is never erased.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from iceberg_cdc.error_lines import FailedTask, clip
from iceberg_cdc.errors import CdcError
from iceberg_cdc.redaction import redact
from iceberg_cdc.run.state import Detected
from iceberg_cdc.units import format_bytes

__all__ = [
    "CHAIN_PREFIX",
    "NOTE_LIMIT",
    "FailedTask",
    "chained_note",
    "chained_run_id",
    "chained_snapshot",
    "merged_note",
    "run_note",
    "story",
]

NOTE_LIMIT = 1000  # Airflow's dag_run_note.content is a String(1000)
# Notes a run starts with (set when a predecessor queued it); the run's own outcome replaces them.
PROVISIONAL_PREFIXES = ("chained: ", "queued: ")
AFTER_CLEAR = " ⟶ cleared, then: "
MARKED_FAILED = "marked failed by a person"
# Airflow's reason when a person sets a run's state: "Dag Run's state was manually set to `failed`."
_MANUAL_FAILED = "manually set to `failed`"


def _count(value: int) -> str:
    return f"{value:,}"


def range_label(detected: Detected | Mapping[str, Any]) -> str:
    """``reprocess of 42 through 57, 2 more after this one`` for a run of a range reprocess, else ``""``."""
    detected = Detected.of(detected)
    through = detected.through_snapshot_id
    if through is None or detected.snapshot_id is None:
        return ""
    left = detected.range_left
    more = "" if left is None else f", {left} more after this one" if left else ", the last one"
    return f"reprocess of {detected.snapshot_id} through {through}{more}"


def bridge_label(bridge: Mapping[str, Any]) -> str:
    """``bridge from 41 over expired snapshots`` / ``... after a rollback (common ancestor 40)``, or ``""``."""
    if not bridge:
        return ""
    if bridge.get("reason") == "expired":
        why = "over expired snapshots"
    else:
        ancestor = bridge.get("common_ancestor")
        why = "after a rollback" + (f" (common ancestor {ancestor})" if ancestor else "")
    if bridge.get("base") == "changelog replay":
        why += ", from the changelog's replay"
    return f"bridge from {bridge.get('from')} {why}"


def snapshot_label(detected: Detected | Mapping[str, Any]) -> str:
    """``snapshot 123 (overwrite, #7)``, or what the run found instead of a snapshot."""
    detected = Detected.of(detected)
    if detected.snapshot_id is None:
        return "caught up"
    if detected.bridge:
        return f"snapshot {detected.snapshot_id} ({bridge_label(detected.bridge)}, #{detected.ordinal})"
    kind = "initial load" if detected.initial_load else (detected.operation or "?")
    manual = range_label(detected) or ("reprocess" if detected.manual else "")
    return f"snapshot {detected.snapshot_id} ({kind}, #{detected.ordinal}{', ' + manual if manual else ''})"


def outcome(committed: dict[str, Any]) -> str:
    """``+300 -100 ±1,000 updates, carryover 37,800, 794.0 KiB shuffled, write 4.3 s / read 3.4 s``.

    A phase that ran in the Airflow task's process says so: ``write 0.1 s in process``.
    """
    if not committed.get("committed") and "inserts" not in committed:
        return str(committed.get("reason", "nothing committed"))
    parts = [
        f"+{_count(committed.get('inserts', 0))}",
        f"-{_count(committed.get('deletes', 0))}",
        f"±{_count(committed.get('updates', 0))} updates",
    ]
    if committed.get("carryover_rows"):
        cancelled = committed.get("cancelled_rows")
        before = f" ({_count(cancelled)} cancelled before the shuffle)" if cancelled else ""
        parts.append(f"carryover {_count(committed['carryover_rows'])}{before}")
    if committed.get("shuffle_bytes"):
        parts.append(f"{format_bytes(committed['shuffle_bytes'])} shuffled")
    if committed.get("skewed_partitions"):
        count = committed["skewed_partitions"]
        ratio = committed.get("skew_max_ratio")
        worst = f", largest {ratio:.0f}x the median" if ratio else ""
        parts.append(f"{count} skewed partition{'s' if count != 1 else ''}{worst}")
    seconds = committed.get("seconds") or {}
    here = set(committed.get("in_process") or ())  # ran in the task's process, no Spark job
    phases = [
        f"{phase} {seconds[phase]:.1f} s{' in process' if phase in here else ''}"
        for phase in ("write", "insert", "read")
        if phase in seconds
    ]
    line = " ".join(parts[:3]) + (", " + ", ".join(parts[3:]) if parts[3:] else "")
    if phases:
        line += ", " + " / ".join(phases)
    if not committed.get("committed"):
        line += f" ({committed.get('reason', 'not committed')})"
    return line


def story(detected: Detected | Mapping[str, Any], committed: dict[str, Any] | None = None) -> str:
    """The run in one line: which snapshot, and what changed (and what detect warned about)."""
    detected = Detected.of(detected)
    label = snapshot_label(detected)
    if detected.action == "caught_up":
        # A run that left the pending snapshot to the chain says so: "caught up" would be untrue.
        line = f"nothing processed ({detected.reason})" if detected.reason else label
    elif detected.action == "skip":
        line = f"{label}: skipped ({detected.reason}: no logical change)"
    else:
        line = f"{label}: {outcome(committed or {})}"
    for warning in detected.warnings:
        line += f"; ⚠ {warning}"
    return line + retention_suffix(detected)


def chained_note(mark: dict[str, Any]) -> str:
    """The note a run starts with when its predecessor queued it (replaced by its outcome when it ends).

    A range reprocess names the snapshot, the range's end and how many of the
    range are left; an ordinary chain how many snapshots are pending.
    """
    conf = mark.get("next_conf") or {}
    if conf.get("snapshot_id") is not None:
        left = mark.get("range_left")
        count = "" if left is None else f" ({left} left in the range, this one included)"
        return (
            f"queued: reprocess of snapshot {conf['snapshot_id']} through {conf.get('through_snapshot_id')}"
            f"{count}"
        )
    return f"chained: {int(mark.get('remaining') or 0):,} snapshot(s) pending"


def merged_note(previous: str | None, new: str) -> str:
    """The note after a run ended (again): ``new``, appended to what the run had already said.

    Clearing a run that ended makes it end once more, often with a different
    outcome (``caught up`` after its snapshot was committed). Its note keeps
    the first story and adds the new one; a provisional note (set when a
    predecessor queued the run) is replaced. Cut to the note column by
    removing the middle, so the first story and the latest outcome stay.
    """
    if not previous or previous.startswith(PROVISIONAL_PREFIXES) or previous == new:
        return clip(new, NOTE_LIMIT)
    if previous.endswith(new):
        return clip(previous, NOTE_LIMIT)
    first = previous.split(AFTER_CLEAR, 1)[0]
    merged = previous + AFTER_CLEAR + new
    return clip(merged, NOTE_LIMIT, keep_start=min(len(first), NOTE_LIMIT // 2))


def retention_suffix(detected: Detected | Mapping[str, Any] | None) -> str:
    """``; WARNING: <retention guard's warning>`` when detect raised one (run/retention_guard.py)."""
    if detected is None:
        return ""
    warning = Detected.of(detected).retention_warning
    return f"; WARNING: {warning}" if warning else ""


def chained_run_id(snapshot_id: int | None, stamp: str, kind: str = "chained") -> str:
    """Run id of a chained run: names the snapshot it will process (``chained__s123__<stamp>``).

    ``kind`` is ``reprocess`` for the runs of a range reprocess (``reprocess__s123__<stamp>``).
    """
    target = f"s{snapshot_id}" if snapshot_id is not None else "next"
    return f"{kind}__{target}__{stamp}"


CHAIN_PREFIX = "chained__"


def chained_snapshot(run_id: str | None) -> int | None:
    """The snapshot a chained run's id names (``chained__s123__<stamp>`` -> 123), else None.

    detect holds the run to it: a chained run processes that snapshot or none.
    """
    if not run_id or not run_id.startswith(CHAIN_PREFIX):
        return None
    target = run_id[len(CHAIN_PREFIX) :].split("__", 1)[0]
    return int(target[1:]) if target[:1] == "s" and target[1:].isdigit() else None


def _readable(value: Any) -> Detected | None:
    """Detect's XCom as a record, or None when there is none or it cannot be read (a note never fails)."""
    if isinstance(value, Detected):
        return value
    if not isinstance(value, Mapping):
        return None
    try:
        return Detected.of(value)
    except (TypeError, ValueError, CdcError):
        return None


def run_note(
    state: str,
    *,
    detected: Detected | Mapping[str, Any] | None = None,
    committed: dict[str, Any] | None = None,
    mark: dict[str, Any] | None = None,
    failed: list[FailedTask] | None = None,
    reason: str | None = None,
) -> str:
    """The DAG run's note: what it did (success), or where and why it failed.

    ``detected`` / ``committed`` / ``mark``: detect's, commit's and
    watermark's XComs (any may be missing); ``failed``: the run's failed
    tasks, first to fail first; ``reason``: why Airflow ended the run when no
    task failed (a state set by hand).
    """
    detected = _readable(detected)
    committed = committed if isinstance(committed, dict) else None
    if state == "success":
        if committed and committed.get("story"):
            note = str(committed["story"])
        elif detected:
            note = story(detected, committed)
        else:
            note = "succeeded" + (f" ({reason})" if reason else "")
        remaining = (mark or {}).get("remaining") if isinstance(mark, dict) else None
        if detected and detected.through_snapshot_id is not None:
            pass  # the label says how many of the range are left; the watermark's pending count is not theirs
        elif isinstance(remaining, int) and remaining and detected and detected.action != "caught_up":
            note += f"; {remaining:,} more pending"
        return clip(redact(note), NOTE_LIMIT)
    where = ""
    if detected and detected.snapshot_id is not None:
        where = snapshot_label(detected) + ": "
    return clip(redact(where + failure(failed, reason) + retention_suffix(detected)), NOTE_LIMIT)


def failure(failed: list[FailedTask] | None, reason: str | None) -> str:
    """Why a run failed: its first failed task and error line, or that a person marked it failed.

    A run a person marks failed in Airflow's UI gets its running tasks marked
    failed too; their logs hold no error, so "see its log" would send the
    reader nowhere: the note says who ended the run instead.
    """
    failed = failed or []
    cause = next((t for t in failed if t.error), None)
    if cause is None and manually_failed(reason):
        stopped = f" ({', '.join(t.name for t in failed[:3])}{', …' if len(failed) > 3 else ''} stopped)"
        return MARKED_FAILED + (stopped if failed else "")
    if not failed:
        return "failed" + (f": {reason}" if reason else "")
    cause = cause or failed[0]
    what = f"failed at {cause.name}: {cause.error}" if cause.error else f"{cause.name} failed (see its log)"
    others = [t.name for t in failed if t is not cause]
    if others:
        what += f" (also failed: {', '.join(others[:3])}{', …' if len(others) > 3 else ''})"
    return what


def manually_failed(reason: str | None) -> bool:
    """Whether Airflow's reason for ending a run says a person set its state (UI or REST API)."""
    return bool(reason) and _MANUAL_FAILED in str(reason)


def last_outcome(note: str | None) -> str:
    """The newest outcome a note tells: after its last "cleared, then:" (a cleared run's note keeps its past)."""
    return (note or "").rsplit(AFTER_CLEAR, 1)[-1]


def marked_failed_by_person(note: str | None) -> bool:
    """Whether a run's note says its latest end was a person marking it failed (:func:`failure`)."""
    outcome = last_outcome(note)
    return MARKED_FAILED in outcome or manually_failed(outcome)


def mirror_note(
    state: str,
    *,
    detected: Mapping[str, Any] | None = None,
    applied: Mapping[str, Any] | None = None,
    verified: Mapping[str, Any] | None = None,
    failed: list[FailedTask] | None = None,
    reason: str | None = None,
) -> str:
    """A mirror DAG run's note: what the apply did and what the verification found (or why it failed)."""
    parts: list[str] = []
    detected = detected if isinstance(detected, Mapping) else None
    applied = applied if isinstance(applied, Mapping) else None
    if detected and detected.get("action") == "apply":
        through = (detected.get("through") or {}).get("source_snapshot_id")
        what = f"{detected.get('snapshots', 0)} changelog snapshot(s) to source snapshot {through}"
        if applied is not None:
            upserted = applied.get("upserted", applied.get("added_rows"))
            deleted = applied.get("deleted", applied.get("deleted_rows"))
            counts = (
                f": {int(upserted or 0):,} upserted, {int(deleted or 0):,} deleted"
                if upserted is not None
                else ""
            )
            what = f"applied {what}{counts}"
        parts.append(what)
    elif detected:
        parts.append("caught up")
    if isinstance(verified, Mapping) and verified.get("line"):
        parts.append(f"verify: {verified['line']}")
    if state == "success":
        return clip(redact("; ".join(parts) or "succeeded"), NOTE_LIMIT)
    parts.append(failure(failed, reason))
    return clip(redact("; ".join(parts)), NOTE_LIMIT)

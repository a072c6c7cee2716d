"""One line that says what a DAG run did, for the places an operator looks first.

Built from the small dicts the steps return (detect's, commit's, watermark's),
so the Airflow task that shows it (a run note, a log line, an asset event's
extra) needs no second look at storage. No Airflow import.

:func:`run_note` is the DAG run's note in Airflow's Runs list and grid: the
story of a run that succeeded, ``caught up``, or for a failed run the first
failed task and its error line (:func:`error_line`, recorded by the task's
failure callback). Notes are scrubbed of anything that looks like a secret
(:func:`scrub`) and fit Airflow's 1,000-character note column.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from iceberg_cdc.run.state import Detected
from iceberg_cdc.units import format_bytes

NOTE_LIMIT = 1000  # Airflow's dag_run_note.content is a String(1000)
ERROR_LIMIT = 400


def _count(value: int) -> str:
    return f"{value:,}"


def snapshot_label(detected: Detected | Mapping[str, Any]) -> str:
    """``snapshot 123 (overwrite, #7)``, or what the run found instead of a snapshot."""
    detected = Detected.of(detected)
    if detected.snapshot_id is None:
        return "caught up"
    kind = "initial load" if detected.initial_load else (detected.operation or "?")
    manual = ", reprocess" if detected.manual else ""
    return f"snapshot {detected.snapshot_id} ({kind}, #{detected.ordinal}{manual})"


def outcome(committed: dict[str, Any]) -> str:
    """``+300 -100 ±1,000 updates, carryover 37,800, 794.0 KiB shuffled, write 4.3 s / read 3.4 s``."""
    if not committed.get("committed") and "inserts" not in committed:
        return str(committed.get("reason", "nothing committed"))
    parts = [
        f"+{_count(committed.get('inserts', 0))}",
        f"-{_count(committed.get('deletes', 0))}",
        f"±{_count(committed.get('updates', 0))} updates",
    ]
    if committed.get("carryover_rows"):
        parts.append(f"carryover {_count(committed['carryover_rows'])}")
    if committed.get("shuffle_bytes"):
        parts.append(f"{format_bytes(committed['shuffle_bytes'])} shuffled")
    if committed.get("skewed_partitions"):
        count = committed["skewed_partitions"]
        ratio = committed.get("skew_max_ratio")
        worst = f", largest {ratio:.0f}x the median" if ratio else ""
        parts.append(f"{count} skewed partition{'s' if count != 1 else ''}{worst}")
    seconds = committed.get("seconds") or {}
    phases = [f"{phase} {seconds[phase]:.1f} s" for phase in ("write", "insert", "read") if phase in seconds]
    line = " ".join(parts[:3]) + (", " + ", ".join(parts[3:]) if parts[3:] else "")
    if phases:
        line += ", " + " / ".join(phases)
    if not committed.get("committed"):
        line += f" ({committed.get('reason', 'not committed')})"
    return line


def story(detected: Detected | Mapping[str, Any], committed: dict[str, Any] | None = None) -> str:
    """The run in one line: which snapshot, and what changed."""
    detected = Detected.of(detected)
    label = snapshot_label(detected)
    if detected.action == "caught_up":
        line = label
    elif detected.action == "skip":
        line = f"{label}: skipped ({detected.reason}: no logical change)"
    else:
        line = f"{label}: {outcome(committed or {})}"
    return line + retention_suffix(detected)


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


# Exceptions that only carry another error's line: ``AirflowFailException("LeaseHeldError: ...")``.
_WRAPPERS = ("AirflowFailException", "AirflowException", "AirflowSkipException")
_NAMED_LINE = re.compile(r"^[A-Z][A-Za-z0-9_]*(Error|Exception|Timeout)\b:")


def error_line(type_name: str, message: str) -> str:
    """``Type: first line of the message``, without Airflow's wrapper when the message names the error."""
    text = str(message).strip()
    first = text.splitlines()[0].strip() if text else ""
    if type_name in _WRAPPERS and _NAMED_LINE.match(first):
        line = first
    else:
        line = f"{type_name}: {first}" if first else type_name
    return clip(line, ERROR_LIMIT)


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


_URL_PASSWORD = re.compile(r"(://[^/:@\s]*:)[^/@\s]+@")
_URL_TOKEN = re.compile(r"(;\s*token\s*=)[^;\s]+", re.IGNORECASE)
_SECRET_ASSIGNMENT = re.compile(
    r"""(["']?[\w.-]*(?:secret|password|passwd|token|credential|session|api[-_]?key)[\w.-]*["']?\s*[=:]\s*)"""
    r"""("[^"]*"|'[^']*'|[^\s,;&)}\]]+)""",
    re.IGNORECASE,
)
_AWS_KEY_ID = re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b")


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with secrets replaced by ``***``: the given values, URL passwords and tokens, secret assignments."""
    for secret in sorted((s for s in secrets if s and len(s) >= 4), key=len, reverse=True):
        text = text.replace(secret, "***")
    text = _URL_TOKEN.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", text))
    text = _SECRET_ASSIGNMENT.sub(r"\1***", text)
    return _AWS_KEY_ID.sub("***", text)


def _readable(value: Any) -> Detected | None:
    """Detect's XCom as a record, or None when there is none or it cannot be read (a note never fails)."""
    if isinstance(value, Detected):
        return value
    if not isinstance(value, Mapping):
        return None
    try:
        return Detected.of(value)
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class FailedTask:
    """A failed task instance of the run, with the error line its failure callback recorded (if any)."""

    task_id: str
    map_index: int = -1
    error: str | None = None

    @property
    def name(self) -> str:
        return self.task_id if self.map_index < 0 else f"{self.task_id}[{self.map_index}]"


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
        if isinstance(remaining, int) and remaining and detected and detected.action != "caught_up":
            note += f"; {remaining:,} more pending"
        return clip(scrub(note), NOTE_LIMIT)
    where = ""
    if detected and detected.snapshot_id is not None:
        where = snapshot_label(detected) + ": "
    failed = failed or []
    if failed:
        cause = next((t for t in failed if t.error), failed[0])
        what = (
            f"failed at {cause.name}: {cause.error}" if cause.error else f"{cause.name} failed (see its log)"
        )
        others = [t.name for t in failed if t is not cause]
        if others:
            what += f" (also failed: {', '.join(others[:3])}{', …' if len(others) > 3 else ''})"
    else:
        what = "failed" + (f": {reason}" if reason else "")
    return clip(scrub(where + what + retention_suffix(detected)), NOTE_LIMIT)

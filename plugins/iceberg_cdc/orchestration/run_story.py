"""One line that says what a DAG run did, for the places an operator looks first.

Built from the small dicts the steps return (detect's, commit's, watermark's),
so the Airflow task that shows it (a run note, a log line, an asset event's
extra) needs no second look at storage. No Airflow import.
"""

from __future__ import annotations

from typing import Any


def _count(value: int) -> str:
    return f"{value:,}"


def _bytes(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def snapshot_label(detected: dict[str, Any]) -> str:
    """``snapshot 123 (overwrite, #7)``, or what the run found instead of a snapshot."""
    if detected.get("snapshot_id") is None:
        return "caught up"
    kind = "initial load" if detected.get("initial_load") else detected.get("operation", "?")
    manual = ", reprocess" if detected.get("manual") else ""
    return f"snapshot {detected['snapshot_id']} ({kind}, #{detected.get('ordinal')}{manual})"


def outcome(committed: dict[str, Any]) -> str:
    """``+300 -100 ±1,000 updates, carryover 37,800, 794.0 KB shuffled, write 4.3 s / read 3.4 s``."""
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
        parts.append(f"{_bytes(committed['shuffle_bytes'])} shuffled")
    seconds = committed.get("seconds") or {}
    phases = [f"{phase} {seconds[phase]:.1f} s" for phase in ("write", "insert", "read") if phase in seconds]
    line = " ".join(parts[:3]) + (", " + ", ".join(parts[3:]) if parts[3:] else "")
    if phases:
        line += ", " + " / ".join(phases)
    if not committed.get("committed"):
        line += f" ({committed.get('reason', 'not committed')})"
    return line


def story(detected: dict[str, Any], committed: dict[str, Any] | None = None) -> str:
    """The run in one line: which snapshot, and what changed."""
    label = snapshot_label(detected)
    if detected.get("action") == "caught_up":
        return label
    if detected.get("action") == "skip":
        return f"{label}: skipped ({detected.get('reason')}: no logical change)"
    return f"{label}: {outcome(committed or {})}"


def chained_run_id(snapshot_id: int | None, stamp: str, kind: str = "chained") -> str:
    """Run id of a chained run: names the snapshot it will process (``chained__s123__<stamp>``).

    ``kind`` is ``reprocess`` for the runs of a range reprocess (``reprocess__s123__<stamp>``).
    """
    target = f"s{snapshot_id}" if snapshot_id is not None else "next"
    return f"{kind}__{target}__{stamp}"

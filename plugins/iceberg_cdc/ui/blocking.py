"""Whether a table is blocked, and what each failed run of its DAG means for it.

A failed run either holds the table up until a person fixes something, or
it does not. The rules (docs/ui.md, "Blocked tables"), applied to the DAG's
failed runs newest first:

* **marked failed by a person** -- the run's note says a person set its state
  (:func:`iceberg_cdc.run.story.marked_failed_by_person`): harmless;
* **bad input to this run** -- a reprocess (its conf names ``snapshot_id`` or
  ``through_snapshot_id``) that failed in ``detect``, where those ids are
  checked: harmless; a reprocess that failed later is harmless for the table
  too (its ordinary runs go on past it);
* **a later run succeeded** -- it started before the last successful run that
  is not a reprocess: harmless;
* **blocking** -- the newest of the remaining runs whose error is a *final*
  error of the pipeline (:func:`iceberg_cdc.error_lines.is_final_line`: no
  retry can fix it, e.g. ``SourceFileMissingError``, ``SourceHistoryError``,
  a missing bucket): the table is blocked, since the first failure with the
  same error after the last success, until a run succeeds;
* older final failures are the same story (**final**); anything else is
  **retryable** (the next run tries again) or **unknown** (no error line).

The error is the failed task's line from its log, else the one the run's
note carries (:mod:`iceberg_cdc.airflow.listeners.run_notes`). The fix is the
error's last sentence: the pipeline's messages name the fix last. No Airflow
import: the runs are :mod:`iceberg_cdc.airflow.views.airflow_side`'s objects.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from iceberg_cdc.error_lines import error_name, is_final_line
from iceberg_cdc.run.story import last_outcome, marked_failed_by_person

# kind -> what the failed-runs list says of such a run
LABELS = {
    "blocking": "blocking: no retry can fix this; the table waits until it is fixed and a run succeeds",
    "final": "final error; the newest one blocks the table",
    "retryable": "retryable: the next run tries again",
    "bad-input": "harmless: bad input to this run (its snapshot ids); the table's runs go on",
    "reprocess": "harmless: a reprocess failed; the table's own runs go on",
    "marked": "harmless: marked failed by a person",
    "superseded": "harmless: a later run succeeded",
    "unknown": "error not known (see the task's log)",
}
HARMLESS = frozenset({"marked", "bad-input", "reprocess", "superseded"})  # kinds that never hold the table up
_FAILED_AT = re.compile(r"failed at (\S+?): (.+)$")
_NOTE_TAIL = (re.compile(r"; WARNING: .*$"), re.compile(r" \(also failed: [^)]*\)$"))
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(])")


@dataclass(frozen=True)
class Failure:
    """What one failed run means for its table."""

    kind: str  # a key of LABELS
    task: str | None = None  # the failed task the error comes from
    error: str | None = None  # its error line, ``Type: message``

    @property
    def label(self) -> str:
        return LABELS[self.kind]

    @property
    def harmless(self) -> bool:
        return self.kind in HARMLESS

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "label": self.label,
            "blocking": self.kind == "blocking",
            "harmless": self.harmless,
        }


@dataclass(frozen=True)
class Blocked:
    """A table no run can move on until a person fixes what ``error`` names."""

    since: datetime | None  # when the first failed run of this block ended
    run_id: str  # the newest blocking run
    run_url: str
    task: str | None
    error: str
    fix: str | None

    @property
    def error_name(self) -> str:
        return error_name(self.error) or self.error.split(":", 1)[0]

    @property
    def cause(self) -> str:
        """The error without its fix (shown apart), so the card does not say the fix twice."""
        if self.fix and self.error.rstrip().endswith(self.fix):
            return self.error.rstrip()[: -len(self.fix)].rstrip()
        return self.error

    def to_dict(self) -> dict[str, Any]:
        return {
            "since": None if self.since is None else self.since.isoformat().replace("+00:00", "Z"),
            "run_id": self.run_id,
            "run_url": self.run_url,
            "task": self.task,
            "error": self.error,
            "error_name": self.error_name,
            "fix": self.fix,
        }


@dataclass
class Assessment:
    """The table's block (None when it is not blocked) and each failed run's meaning, by run id."""

    blocked: Blocked | None = None
    failures: dict[str, Failure] = field(default_factory=dict)


def fix_of(error: str) -> str | None:
    """The fix an error line names: its last sentence (the pipeline's messages end with it); None for one sentence."""
    message = error.split(": ", 1)[1] if error_name(error) else error
    sentences = [s for s in _SENTENCE_END.split(message.strip()) if s]
    return sentences[-1] if len(sentences) > 1 else None


def _error(run: Any) -> tuple[str | None, str | None]:
    """(task, error line) of a failed run: the first failed task's log line, else the run's note."""
    for task in run.failed_tasks:
        if task.error:
            return task.name, task.error
    found = _FAILED_AT.search(last_outcome(run.note))
    if not found:
        return None, None
    line = found.group(2)
    for tail in _NOTE_TAIL:
        line = tail.sub("", line)
    return found.group(1), line


def assess(runs: Any) -> Assessment:
    """Apply the rules of this module to a DAG's failed runs (``DagRuns``, newest first)."""
    result = Assessment()
    if runs is None or getattr(runs, "error", None):
        return result
    success = getattr(runs, "last_success", None)
    success_at = success.ran_at if success is not None else None
    blocking: list[tuple[Any, str | None, str]] = []
    for run in runs.failed:
        task, error = _error(run)
        ran = run.ran_at
        if marked_failed_by_person(run.note):
            failure = Failure("marked", task, error)
        elif getattr(run, "reprocess", False):
            failure = Failure("bad-input" if task == "detect" else "reprocess", task, error)
        elif success_at is not None and (ran is None or ran <= success_at):
            failure = Failure("superseded", task, error)
        elif error is None:
            failure = Failure("unknown", task, error)
        elif is_final_line(error):
            failure = Failure("final" if blocking else "blocking", task, error)
            if not blocking or error_name(error) == error_name(blocking[0][2]):
                blocking.append((run, task, error))
        else:
            failure = Failure("retryable", task, error)
        result.failures[run.run_id] = failure
    if blocking:
        newest, task, error = blocking[0]
        first = blocking[-1][0]
        since = first.ended_at or first.ran_at or newest.ended_at
        result.blocked = Blocked(since, newest.run_id, newest.url, task, error, fix_of(error))
    return result

"""The one error line a person reads first: from an exception, a Spark job's text, or a task's log.

A failed task is summed up everywhere -- its run's note, the CDC view and its
JSON, the Airflow task's own first log line -- by one line: ``Type: message``.
Every place takes it from here, so they agree:

* :func:`line_of` -- an exception (or its type name and message), unwrapping
  Airflow's ``AirflowFailException("LeaseHeldError: ...")``;
* :func:`line_in_text` -- the pipeline's own error inside a Spark or Py4J
  traceback (an executor's exception reaches the driver as text);
* :func:`line_in_log` -- the first error of an Airflow task log (structured
  messages);
* :func:`clip` -- a line too long for where it goes loses its **middle**, never
  its end: the pipeline's messages name what went wrong first and the fix last.

Every line is passed through :func:`iceberg_cdc.redaction.redact` (with the
secrets the caller knows) before it leaves. :class:`FailedTask` is a failed
task instance as notes and the CDC view show it. No Airflow import.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from iceberg_cdc.redaction import redact

ERROR_LIMIT = 900  # an error line in a note (notes hold 1,000 characters) or on the page
ELLIPSIS = " … "
# Exceptions that only carry another error's line: ``AirflowFailException("LeaseHeldError: ...")``.
_WRAPPERS = frozenset({"AirflowFailException", "AirflowException", "AirflowSkipException"})
# A line that starts with a named error, its module optional: ``LeaseHeldError: ...``,
# ``iceberg_cdc.errors.ConfigError: ...``. The one pattern for "this line names an error".
_NAMED_LINE = re.compile(r"^\s*(?:[A-Za-z_]\w*\.)*([A-Z][A-Za-z0-9_]*(?:Error|Exception|Timeout|Exit))\b\s*:")
_PIPELINE_IN_TEXT = re.compile(r"iceberg_cdc\.errors\.(\w+): ([^\n]+)")
_ANY_ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?(\w+(?:Error|Exception|Exit)): (.+)$", re.MULTILINE)
# Messages Airflow's log reader writes about the log itself, not the task's own errors.
_READER_NOISE = (
    "Error fetching the logs",
    "Could not read",
    "Could not find",
    "Log file does not exist",
    "*** ",
)


def clip(text: str, limit: int = ERROR_LIMIT, *, keep_start: int | None = None) -> str:
    """``text`` cut to ``limit`` characters by removing its middle: the start and the end (the fix) stay.

    ``keep_start``: how many leading characters to keep (default two fifths of the room).
    """
    if len(text) <= limit:
        return text
    if limit <= len(ELLIPSIS) + 2:
        return text[:limit]
    keep = limit - len(ELLIPSIS)
    head = min(keep - 1, keep * 2 // 5 if keep_start is None else max(0, keep_start))
    return text[:head] + ELLIPSIS + text[len(text) - (keep - head) :]


def _message_line(message: str) -> str:
    """The message on one line: its first line, or -- when that only introduces a list -- the list too."""
    lines = [line.strip() for line in str(message).strip().splitlines() if line.strip()]
    if not lines:
        return ""
    if lines[0].endswith(":") and len(lines) > 1:
        return lines[0] + " " + "; ".join(lines[1:])
    return lines[0]


def line_of(error: BaseException | str, message: str | None = None, *, secrets: Iterable[Any] = ()) -> str:
    """``Type: message`` of an exception, or of ``(type name, message)``; redacted and clipped.

    An Airflow wrapper whose message already starts with a named error
    (``AirflowFailException: LeaseHeldError: ...``) is left out.
    """
    if isinstance(error, BaseException):
        type_name, text = type(error).__name__, str(error)
    else:
        type_name, text = str(error), "" if message is None else str(message)
    first = _message_line(text)
    if type_name in _WRAPPERS and _NAMED_LINE.match(first):
        line = first
    else:
        line = f"{type_name}: {first}" if first else type_name
    return clip(redact(line, secrets))


def error_name(line: str) -> str | None:
    """The error type a ``Type: message`` line starts with, without its module; None if it names none."""
    match = _NAMED_LINE.match(line or "")
    return match.group(1) if match else None


def is_final_line(line: str) -> bool:
    """Whether an error line (``Type: message``, e.g. from a Spark driver) names a final pipeline error.

    The line-only twin of :func:`iceberg_cdc.errors.is_final`, for callers that
    have the error's line but not the exception (the Spark operators).
    """
    from iceberg_cdc.errors import error_class

    name = error_name(line)
    cls = error_class(name) if name else None
    return cls is not None and cls.final


def line_in_text(error: BaseException | str, *, secrets: Iterable[Any] = ()) -> str:
    """The pipeline's own error in one line, even when Spark wrapped it in a JVM traceback.

    The last ``iceberg_cdc.errors.X: message`` line of the text wins, else its
    last ``XError: message`` line, else the exception's own line.
    """
    from iceberg_cdc.errors import CdcError

    if isinstance(error, CdcError):
        return line_of(error, secrets=secrets)
    text = str(error)
    found = list(_PIPELINE_IN_TEXT.finditer(text))
    if found:
        return clip(redact(f"{found[-1].group(1)}: {found[-1].group(2).strip()}", secrets))
    lines = list(_ANY_ERROR_LINE.finditer(text))
    if lines:
        return clip(redact(f"{lines[-1].group(1)}: {lines[-1].group(2).strip()}", secrets))
    if isinstance(error, BaseException):
        return line_of(error, secrets=secrets)
    return clip(redact(_message_line(text), secrets))


def line_in_log(messages: Iterable[Any], *, limit: int = 5000, secrets: Iterable[Any] = ()) -> str | None:
    """The first error of an Airflow task log: the raised exception's line, else the first ERROR line.

    ``messages``: Airflow's structured log messages (objects or dicts with
    ``event``, ``level`` and, for exceptions, ``error_detail``); reads at most
    ``limit`` of them.
    """
    fallback = None
    for count, message in enumerate(messages):
        if count >= limit:
            break
        get = message.get if isinstance(message, dict) else (lambda key, m=message: getattr(m, key, None))
        details = get("error_detail")
        if isinstance(details, list) and details:
            detail = details[-1] if isinstance(details[-1], dict) else {}
            # error_detail lists the chain of causes first; the last entry is the raised exception.
            exc_type = str(detail.get("exc_type") or "").strip()
            exc_value = str(detail.get("exc_value") or "").strip()
            if exc_type:
                return line_of(exc_type, exc_value, secrets=secrets)
            if exc_value:
                return clip(redact(_message_line(exc_value), secrets))
        level = str(get("level") or "").lower()
        event = str(get("event") or "").strip()
        if (
            fallback is None
            and level in ("error", "critical")
            and event
            and not event.startswith(_READER_NOISE)
        ):
            fallback = _message_line(event)
    return clip(redact(fallback, secrets)) if fallback else None


@dataclass(frozen=True)
class FailedTask:
    """A failed task instance of a run, with its error line when one was recorded or found."""

    task_id: str
    map_index: int = -1
    error: str | None = None
    try_number: int | None = None
    ended_at: datetime | None = None
    url: str | None = None

    @property
    def name(self) -> str:
        return self.task_id if self.map_index < 0 else f"{self.task_id}[{self.map_index}]"

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "map_index": self.map_index,
            "try_number": self.try_number,
            "ended_at": None if self.ended_at is None else self.ended_at.isoformat().replace("+00:00", "Z"),
            "error": self.error,
            "url": self.url,
        }

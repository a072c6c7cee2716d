"""How a failed Spark Connect job is told: the unit's own error again, or the job's in one line.

A unit's exception is re-raised on the server's Python worker with a
one-line JSON marker (type and message, :data:`MARKER`); the client turns it
back into the pipeline's own exception (``AmbiguousUpdateError: key ...``)
instead of a gRPC error around a Python traceback.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any
from urllib.parse import urlparse

from iceberg_cdc import errors
from iceberg_cdc.error_lines import line_in_text
from iceberg_cdc.errors import ConnectJobError
from iceberg_cdc.redaction import secret_values

MARKER = "CDC-UNIT-FAILED "
TRACE_MARKER = "CDC-UNIT-TRACEBACK "
_MARKED = re.compile(re.escape(MARKER) + r"(\{.*\})\s*$", re.MULTILINE)
_TRACED = re.compile(re.escape(TRACE_MARKER) + r'(".*")\s*$', re.MULTILINE)


def describe(url: str) -> str:
    """``host:port`` of a Spark Connect URL: safe to log (the URL's parameters may hold a token)."""
    parsed = urlparse(url)
    return parsed.netloc.rsplit("@", 1)[-1] or url.split(";", 1)[0]


def unit_failure(exc: BaseException) -> dict[str, Any] | None:
    """The marker a failed unit left in a Connect job's error: type, message, unit (and traceback)."""
    text = str(exc)
    found = _MARKED.findall(text)
    if not found:
        return None
    info = json.loads(found[-1])
    traced = _TRACED.findall(text)
    info["traceback"] = json.loads(traced[-1]) if traced else "(not in the server's report)"
    return info


def unit_error(info: dict[str, Any]) -> Exception:
    """The pipeline's own exception again (same class, same message), from a unit's marker."""
    cls = errors.error_class(info["type"]) if info.get("module") == errors.__name__ else None
    if cls is not None:
        with contextlib.suppress(Exception):
            return cls(info["message"])
    return ConnectJobError(f"{info['type']}: {info['message']}")


def url_secrets(url: str) -> set[str]:
    """The values of a Spark Connect URL's secret parameters (``;token=...``), to hide wherever quoted."""
    params = dict(part.partition("=")[::2] for part in url.split(";")[1:] if "=" in part)
    return secret_values(params)


def job_error(exc: BaseException, phase: str, group: int, url: str) -> Exception:
    """What a failed Connect job means, message first: the unit's error, else the job's in one line."""
    info = unit_failure(exc)
    if info is not None:
        return unit_error(info)
    # pyspark quotes the server's URL in its errors: its token goes (iceberg_cdc.redaction).
    summary = line_in_text(exc, secrets=url_secrets(url))
    return ConnectJobError(
        f"{phase} group {group + 1} failed on the Spark Connect server {describe(url)}: {summary}"
    )

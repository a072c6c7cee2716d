"""S3 requests per phase, counted on the server: the local S3 server's access log.

The pipeline's S3 requests come from several processes (the driver of each
phase, Spark's Python workers, the harness's own steps), so per-process
client counters would have to be collected from each. The server sees them
all: moto logs one line per request (method, path and query, status). Phases
run one after another, so the lines between two marks are that phase's
requests. Each is classified by S3 operation and by which shuffle object it
touched (map output data or index, plan, ranges, staged record, ...).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_LINE = re.compile(r'"(?P<method>GET|PUT|POST|DELETE|HEAD) (?P<target>\S+) HTTP/[\d.]+" (?P<status>\d{3})')


def operation(method: str, query: dict[str, list[str]], status: int, is_bucket: bool) -> str:
    """The S3 API call a logged request was."""
    if method == "GET":
        if is_bucket:
            return "LIST" if "list-type" in query or not query else "GET_BUCKET_" + "_".join(sorted(query))
        return "GET_RANGE" if status == 206 else "GET"
    if method == "PUT":
        return "UPLOAD_PART" if "partNumber" in query else ("CREATE_BUCKET" if is_bucket else "PUT")
    if method == "POST":
        if "uploads" in query:
            return "CREATE_MULTIPART"
        if "uploadId" in query:
            return "COMPLETE_MULTIPART"
        return "DELETE_OBJECTS" if "delete" in query else "POST"
    return method


def object_kind(key: str) -> str:
    """Which shuffle object a key is (by the layout of ``iceberg_cdc.pipeline.paths``)."""
    if key.endswith(".data"):
        return "map data"
    if key.endswith(".index"):
        return "map index"
    for marker, kind in (
        ("/_leases/", "lease"),
        ("/staged/", "staged record"),
        ("/stats/", "stats"),
        ("/failed/", "failure marker"),
        ("plan.json", "plan"),
        ("ranges.json", "ranges"),
    ):
        if marker in "/" + key:
            return kind
    return "other"


class RequestLog:
    """Counts requests in the server's log since a mark."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def mark(self) -> int:
        time.sleep(0.05)  # the server writes a request's line as it answers; let the last one land
        return self.path.stat().st_size if self.path.exists() else 0

    def since(self, mark: int) -> dict[str, dict[str, int]]:
        """{operation: {object kind: count}} of the requests logged after ``mark``."""
        time.sleep(0.05)
        with open(self.path, "rb") as log:
            log.seek(mark)
            text = log.read().decode(errors="replace")
        counts: Counter[tuple[str, str]] = Counter()
        for line in text.splitlines():
            found = _LINE.search(_ANSI.sub("", line))
            if not found:
                continue
            parts = urlsplit(found["target"])
            _bucket, _, key = parts.path.lstrip("/").partition("/")
            query = parse_qs(parts.query, keep_blank_values=True)
            op = operation(found["method"], query, int(found["status"]), is_bucket=not key)
            kind = object_kind(key) if key else "bucket"
            if op == "LIST":
                kind = "listing"
            counts[(op, kind)] += 1
        result: dict[str, dict[str, int]] = {}
        for (op, kind), count in sorted(counts.items()):
            result.setdefault(op, {})[kind] = count
        return result


def total(requests: dict[str, dict[str, int]]) -> int:
    return sum(sum(kinds.values()) for kinds in requests.values())

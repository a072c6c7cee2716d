"""One phase group on a Spark Connect server: the driver runs here, in the Airflow worker, as a client.

The group's units (exactly :func:`~iceberg_cdc.pipeline.groups.units_of`)
run as one Spark job on a long-running Spark Connect server, one Spark task
per unit: ``spark.range(n, numPartitions=n)`` numbers them, and ``mapInArrow``
calls the phase's unit function (:data:`~iceberg_cdc.pipeline.groups.PHASE_FUNCTIONS`)
on each number's unit; results come back as JSON strings. No JVM starts
here: attaching to a session takes a few tenths of a second and a job on
warm Python workers well under a second (``bench/latency.py``).

The steps around the job -- lease check, heartbeat that cancels the job
(``interruptTag``) on a lost lease, failure markers, figures -- are the
spark-submit driver's (:mod:`.phase_driver`).

**What reaches the server.** The package: the ``--py-files`` archive of
:mod:`iceberg_cdc.pipeline.pyfiles`, added with ``addArtifacts(pyfile=True)``
once per process and session. Every client of one package version attaches
to one server session (an id derived from the package's digest), so the
server's Python workers -- one pool per session in Spark -- stay warm across
tasks and processes, and a new package version gets a fresh session (and
fresh workers). Sessions are cached per URL in this process too, and never
released by a client (others use them); the server closes them when idle. The plan, the units and the :class:`~iceberg_cdc.pipeline.runtime.Runtime`
(with the storage credentials) travel only inside the pickled function -- a
bytes field of the plan, which the server's UI and logs abbreviate to a few
bytes -- never in DataFrame literals, SQL text or session conf, which the
server shows.

**Errors.** A unit's exception is re-raised on the server's Python worker
with a one-line JSON marker (type and message); here it becomes the same
pipeline exception again (``AmbiguousUpdateError: key ...``), with the
worker's traceback logged, instead of a gRPC error around a Python traceback.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import logging
import os
import re
import sys
import threading
import time
import traceback
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from iceberg_cdc import errors
from iceberg_cdc.error_lines import line_in_text, line_of
from iceberg_cdc.pipeline import worker_heap
from iceberg_cdc.pipeline.groups import PHASE_FUNCTIONS
from iceberg_cdc.pipeline.phase_driver import GroupRun, run_phase_group
from iceberg_cdc.pipeline.plan import SnapshotPlan
from iceberg_cdc.pipeline.runtime import Runtime
from iceberg_cdc.redaction import secret_values

log = logging.getLogger("iceberg_cdc.spark")

MARKER = "CDC-UNIT-FAILED "
TRACE_MARKER = "CDC-UNIT-TRACEBACK "
_MARKED = re.compile(re.escape(MARKER) + r"(\{.*\})\s*$", re.MULTILINE)
_TRACED = re.compile(re.escape(TRACE_MARKER) + r'(".*")\s*$', re.MULTILINE)


def _url_secrets(url: str) -> set[str]:
    """The values of a Spark Connect URL's secret parameters (``;token=...``), to hide wherever quoted."""
    params = dict(part.partition("=")[::2] for part in url.split(";")[1:] if "=" in part)
    return secret_values(params)


class UnitFailed(Exception):
    """Raised on the server's Python worker: a unit failed; the message carries the marker line."""


class ConnectJobError(RuntimeError):
    """The Spark Connect job failed outside the units' code (server unreachable, worker crashed ...)."""


def describe(url: str) -> str:
    """``host:port`` of a Spark Connect URL: safe to log (the URL's parameters may hold a token)."""
    parsed = urlparse(url)
    return parsed.netloc.rsplit("@", 1)[-1] or url.split(";", 1)[0]


# --- on the server's Python workers ------------------------------------------------------------


def _unit_mapper(phase: str, plan: SnapshotPlan, runtime: Runtime, units: list[Any]):
    """The function ``mapInArrow`` pickles: unit numbers in, ``(unit, result JSON)`` batches out."""
    function = PHASE_FUNCTIONS[phase]

    def run_units(batches):
        import pyarrow as pa

        for batch in batches:
            numbers = batch.column(0).to_pylist()
            results = []
            for number in numbers:
                try:
                    results.append(json.dumps(function(plan, runtime, units[number])))
                except Exception as exc:
                    info = {
                        "type": type(exc).__name__,
                        "module": type(exc).__module__,
                        "message": str(exc),
                        "unit": number,
                    }
                    # Two lines: the first (type, message) stays whole even if a long report is cut.
                    trace = "".join(traceback.format_exception(exc))[-8000:]
                    raise UnitFailed(
                        f"{MARKER}{json.dumps(info)}\n{TRACE_MARKER}{json.dumps(trace)}"
                    ) from exc
            yield pa.RecordBatch.from_arrays(
                [pa.array(numbers, pa.int64()), pa.array(results, pa.string())], names=["unit", "result"]
            )
        worker_heap.settle_worker_heap()  # by reference: its state lives in the worker's module

    run_units.__name__ = run_units.__qualname__ = f"cdc_{phase}_units"
    return run_units


# --- in the client -----------------------------------------------------------------------------


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
    cls = getattr(errors, info["type"], None) if info.get("module") == errors.__name__ else None
    if isinstance(cls, type) and issubclass(cls, errors.CdcError):
        with contextlib.suppress(Exception):
            return cls(info["message"])
    return ConnectJobError(f"{info['type']}: {info['message']}")


def job_error(exc: BaseException, phase: str, group: int, url: str) -> Exception:
    """What a failed Connect job means, message first: the unit's error, else the job's in one line."""
    info = unit_failure(exc)
    if info is not None:
        return unit_error(info)
    # pyspark quotes the server's URL in its errors: its token goes (iceberg_cdc.redaction).
    summary = line_in_text(exc, secrets=_url_secrets(url))
    return ConnectJobError(
        f"{phase} group {group + 1} failed on the Spark Connect server {describe(url)}: {summary}"
    )


SHARED_GENERATIONS = 24  # shared session ids tried, in order, before falling back to a private session


def shared_session_id(digest: str, generation: int = 0, day: str | None = None) -> str:
    """The session id every client of package ``digest`` uses today (UTC), as a UUID (Spark Connect's format).

    One id per package version and day: Spark starts a Python worker daemon
    per session, and (Spark 4.2, seen here) the daemon outlives the session
    (about 50 MB each), so the server gains at most one a day per package
    version rather than one per task. ``generation`` moves past sessions the
    server closed (timed out).
    """
    day = day or time.strftime("%Y-%m-%d", time.gmtime())
    raw = hashlib.sha256(f"iceberg-cdc:{digest}:{day}:{generation}".encode()).digest()[:16]
    return str(uuid.UUID(bytes=raw, version=4))


def with_session_id(url: str, session_id: str) -> str:
    """``url`` with the ``session_id`` parameter (kept as it is when the URL names its own)."""
    if "session_id=" in url:
        return url
    base, _, params = url.partition(";")
    base = base if base.endswith("/") else base + "/"
    return f"{base};{params + ';' if params else ''}session_id={session_id}"


@dataclass
class _Session:
    spark: Any
    shared: bool
    artifacts: set[str] = field(default_factory=set)

    def close(self) -> None:
        """A shared session stays on the server for the next client; a private one is released."""
        with contextlib.suppress(Exception):
            if self.shared:
                self.spark.client.close()
            else:
                self.spark.stop()


_sessions: dict[str, _Session] = {}
_lock = threading.Lock()


def _new_session(url: str) -> Any:
    warnings.filterwarnings(
        "ignore", message="PySpark does not yet fully support pandas", category=FutureWarning
    )
    from pyspark.sql import SparkSession

    return SparkSession.builder.remote(url).create()


def _open(url: str, artifact: str | None, digest: str | None) -> _Session:
    """A session with ``artifact`` added: the shared one for ``digest``, else a private one.

    Every client of one package version uses the same server session
    (:func:`shared_session_id`), so the server's Python workers stay warm from
    one task (and one process) to the next -- Spark keeps one Python worker
    pool per session -- and the server holds one pool per package version,
    not one per task. A package change is a new session, so a warm worker
    never runs old code. A shared session the server closed (it timed out)
    cannot be reopened under its id: the next generation's id is tried.
    """
    shared_ids = [shared_session_id(digest, g) for g in range(SHARED_GENERATIONS)] if digest else []
    candidates: list[str | None] = [*shared_ids, None] if "session_id=" not in url else [None]
    for session_id in candidates:
        target = with_session_id(url, session_id) if session_id else url
        # A session named by the URL itself is someone's shared session too: never release it.
        opened = _Session(_new_session(target), shared="session_id=" in target)
        try:
            if artifact:
                opened.spark.addArtifacts(artifact, pyfile=True)
                opened.artifacts.add(artifact)
            return opened
        except Exception as exc:
            opened.close()
            if session_id is None or "SESSION_CLOSED" not in str(exc):
                raise
            log.info("shared Spark Connect session %s was closed by the server; trying the next", session_id)
    raise AssertionError("unreachable: the private session either opens or raises")


def session(url: str, artifact: str | None = None, digest: str | None = None) -> Any:
    """This process's session on ``url`` (opened once), with ``artifact`` added once per session.

    ``digest`` (the package's content hash) selects the session shared by
    every client of that package version; without it the session is private.
    """
    with _lock:
        cached = _sessions.get(url)
        if cached is not None and not cached.spark.is_stopped:
            if not artifact or artifact in cached.artifacts:
                return cached.spark
            try:
                cached.spark.addArtifacts(artifact, pyfile=True)
                cached.artifacts.add(artifact)
                return cached.spark
            except Exception:
                pass  # a session the server no longer knows (restarted): open a new one
        if cached is not None:
            _sessions.pop(url, None)
            cached.close()
        opened = _open(url, artifact, digest)
        _sessions[url] = opened
        return opened.spark


def forget_session(url: str) -> None:
    """Drop the cached session on ``url`` (releasing a private one); the next :func:`session` opens anew."""
    with _lock:
        cached = _sessions.pop(url, None)
    if cached is not None:
        cached.close()


@atexit.register
def close_sessions() -> None:
    """Close this process's connections (private sessions are released; shared ones stay for the next client)."""
    with _lock:
        for cached in _sessions.values():
            cached.close()
        _sessions.clear()


class ConnectUnitRunner:
    """The group's units as one ``mapInArrow`` job, one Spark task per unit, on a Connect session."""

    def __init__(self, spark: Any, url: str, group: int) -> None:
        self.spark = spark
        self.url = url
        self.group = group
        self.tag = f"cdc-{uuid.uuid4().hex[:16]}"

    def map_units(self, phase: str, plan: SnapshotPlan, runtime: Runtime, units: list[Any]) -> list[Any]:
        if not units:
            return []
        frame = self.spark.range(0, len(units), 1, len(units)).mapInArrow(
            _unit_mapper(phase, plan, runtime, list(units)), "unit long, result string"
        )
        self.spark.addTag(self.tag)
        try:
            table = frame.toArrow()
        except Exception as exc:
            error = job_error(exc, phase, self.group, self.url)
            log.error("%s group %d failed: %s: %s", phase, self.group, type(error).__name__, error)
            info = unit_failure(exc)
            if info is not None:
                log.info(
                    "unit %s's traceback on the Spark Connect server:\n%s", info["unit"], info["traceback"]
                )
            else:
                log.info("the Spark Connect server's report:\n%s", str(exc)[-8000:])
                forget_session(self.url)  # the server may have restarted: a retry opens a new session
            raise error from None
        finally:
            self.spark.removeTag(self.tag)
        by_unit = dict(zip(table.column("unit").to_pylist(), table.column("result").to_pylist(), strict=True))
        missing = sorted(set(range(len(units))) - set(by_unit))
        if missing:
            raise ConnectJobError(f"{phase} group {self.group + 1}: no result for units {missing}")
        return [json.loads(by_unit[i]) for i in range(len(units))]

    def cancel(self) -> None:
        try:
            interrupted = self.spark.interruptTag(self.tag)
        except Exception as exc:  # called from the heartbeat's thread: report, never raise there
            log.warning("could not interrupt the Spark Connect job %s: %s", self.tag, exc)
        else:
            log.warning("interrupted the Spark Connect job %s (%d operation(s))", self.tag, len(interrupted))


def run_group(
    url: str,
    runtime: Runtime,
    plan_key: str,
    phase: str,
    group: int,
    *,
    label: str = "",
    on_runner: Callable[[ConnectUnitRunner], None] | None = None,
) -> GroupRun:
    """Run one phase group on the Spark Connect server at ``url``; raises the pipeline's errors.

    ``on_runner`` is handed the group's runner as soon as it exists, so a
    caller that is told to stop (Airflow's ``on_kill``) can interrupt the
    group's job with :meth:`ConnectUnitRunner.cancel`.
    """
    from iceberg_cdc.pipeline.pyfiles import package_digest, package_zip

    def start_runner(plan: SnapshotPlan) -> ConnectUnitRunner:
        try:
            spark = session(url, package_zip(), package_digest())
        except Exception as exc:
            first = line_of(exc, secrets=_url_secrets(url))
            raise ConnectJobError(
                f"cannot open a Spark Connect session on {describe(url)}: {first}"
            ) from None
        log.info("Spark Connect session on %s", describe(url))
        runner = ConnectUnitRunner(spark, url, group)
        if on_runner is not None:
            on_runner(runner)
        return runner

    return run_phase_group(runtime, plan_key, phase, group, start_runner, label=label)


def main(argv: list[str] | None = None) -> int:
    """``python -m iceberg_cdc.pipeline.connect_app --remote sc://host:port --phase ... --plan ... --group N``."""
    from iceberg_cdc.config import load_config
    from iceberg_cdc.pipeline.runtime import runtime_from_config
    from iceberg_cdc.pipeline.spark_app import parse_args

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else list(argv)
    remote = os.environ.get("SPARK_REMOTE")
    if "--remote" in argv:
        at = argv.index("--remote")
        remote = argv[at + 1]
        del argv[at : at + 2]
    if not remote:
        print("error: give --remote sc://host:port (or set SPARK_REMOTE)", file=sys.stderr)
        return 2
    args = parse_args(argv)
    runtime = runtime_from_config(load_config(args.config))
    try:
        run_group(remote, runtime, args.plan, args.phase, args.group, label=args.label)
    except Exception as exc:
        log.error("%s group %d failed: %s: %s", args.phase, args.group, type(exc).__name__, exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

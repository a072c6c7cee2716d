"""A local S3 server (moto) in a subprocess, for the demo, the benchmark and tests.

It speaks real S3 over HTTP on 127.0.0.1, so the code under test uses boto3
exactly as against AWS. Not for production: moto keeps objects in memory.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from cdc_devtools.children import die_with_parent

DUMMY_CREDENTIALS = {"s3.access-key-id": "local", "s3.secret-access-key": "local", "s3.region": "us-east-1"}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _answers(url: str) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=1) as response:
            return response.status < 500
    except urllib.error.HTTPError as exc:  # any HTTP answer means it is up
        return exc.code < 500
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


class LocalS3Server:
    """``with LocalS3Server() as s3: s3.endpoint`` -- started on a free port, stopped on exit."""

    def __init__(self, log_path: str | Path | None = None, port: int | None = None) -> None:
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_path) if log_path else None
        self._process: subprocess.Popen | None = None

    @property
    def process(self) -> subprocess.Popen | None:
        """The server's process while it runs (make stack records its pid)."""
        return self._process

    @property
    def properties(self) -> dict[str, str]:
        """pyiceberg-style ``s3.*`` properties that reach this server."""
        return {"s3.endpoint": self.endpoint, **DUMMY_CREDENTIALS}

    def start(self, timeout: float = 30.0) -> LocalS3Server:
        log = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self._process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent(),
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"the local S3 server exited with code {self._process.returncode}"
                    + (f"; see {self.log_path}" if self.log_path else "")
                )
            if _answers(self.endpoint):
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the local S3 server did not answer on {self.endpoint} within {timeout:.0f} s")

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=DUMMY_CREDENTIALS["s3.access-key-id"],
            aws_secret_access_key=DUMMY_CREDENTIALS["s3.secret-access-key"],
            region_name=DUMMY_CREDENTIALS["s3.region"],
        )

    def __enter__(self) -> LocalS3Server:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

"""A long-running dev command (``make airflow``) found and stopped from another shell by its pid file.

:func:`pid_file` writes the process id while the command runs and removes
it when it ends; :func:`stop_running` sends that process SIGTERM -- which the
command turns into its Ctrl-C path, stopping what it started in order -- and
waits for it to end. A pid file left by a process that died, or whose id now
belongs to another program, is reported and removed, never signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path


class AlreadyRunning(RuntimeError):
    """The pid file names a live process of the same command: a second one would take its files."""


def _read_pid(path: Path) -> int | None:
    """The process id ``path`` holds (None: no file, or not a pid file)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def running_pid(path: Path, marker: str) -> int | None:
    """The live process ``path`` names, if its command line contains ``marker``; else None."""
    pid = _read_pid(path)
    return pid if pid is not None and pid != os.getpid() and marker in _command_line(pid) else None


@contextlib.contextmanager
def pid_file(
    path: Path, marker: str | None = None, stop_command: str = "make airflow-stop"
) -> Iterator[Path]:
    """This process's id in ``path`` for the block (removed after it, if still ours).

    With ``marker``: refused (:class:`AlreadyRunning`) while the file names a
    live process of the same command (a second ``make airflow`` would wipe the
    first one's work directory); a stale file is taken over.
    """
    if marker is not None and (other := running_pid(path, marker)) is not None:
        raise AlreadyRunning(
            f"already running as process {other} (its pid file: {path}); stop it first ({stop_command})"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{os.getpid()}\n")
    try:
        yield path
    finally:
        if _read_pid(path) == os.getpid():
            path.unlink(missing_ok=True)


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def stop_running(path: Path, marker: str, *, timeout: float = 90.0) -> tuple[bool, str]:
    """Stop the process ``path`` names if its command line contains ``marker``: (stopped, what happened)."""
    pid = _read_pid(path)
    if pid is None:
        return False, f"nothing to stop: no pid file {path} (is it running?)"
    if marker not in _command_line(pid):
        path.unlink(missing_ok=True)
        return False, f"nothing to stop: process {pid} of {path} is gone (the stale pid file was removed)"
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while marker in _command_line(pid):
        if time.monotonic() > deadline:
            return (
                False,
                f"process {pid} did not stop within {timeout:.0f} s; see its terminal, or kill {pid}",
            )
        time.sleep(0.2)
    path.unlink(missing_ok=True)
    return True, f"stopped process {pid} and what it had started"

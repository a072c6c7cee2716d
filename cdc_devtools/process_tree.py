"""Process trees on Linux: who is below a pid, whether a pid lives, stopping a server and all it started.

Servers started by tests and ``make`` targets (Airflow components, Celery
workers, JVMs) fork children that may leave their process group; /proc
finds them so nothing outlives a stop.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable


def _children() -> dict[int, list[int]]:
    """Parent pid -> child pids, from /proc (empty where /proc is not available)."""
    tree: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            tree.setdefault(int(fields[1]), []).append(int(entry))
    return tree


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (children, their children, ...)."""
    tree, found, todo = _children(), set(), [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stop_processes(processes: Iterable[subprocess.Popen], timeout: float = 20.0) -> None:
    """Stop processes started with ``start_new_session``: their groups, then every descendant by pid.

    A descendant that left the group (a task runner in its own session) is
    found through /proc before anything is signalled, so it is stopped too.
    """
    processes = [p for p in processes if p is not None]
    stray = set()
    for process in processes:
        stray |= descendants(process.pid)
    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        # Whatever is still in the group (workers the component forked) goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
    for pid in stray:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in stray) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in stray:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

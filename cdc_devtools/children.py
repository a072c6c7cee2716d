"""Servers started by tests and ``make`` targets end with the process that started them.

Fixtures stop their servers on a normal teardown, but a pytest run that is
killed (SIGTERM from CI's timeout, SIGKILL, a closed terminal) never tears
down: its Airflow scheduler, triggerer, Spark Connect JVM or PostgreSQL kept
running, and an orphaned triggerer was seen using a quarter of a core for an
hour. Linux's parent-death signal (``prctl(PR_SET_PDEATHSIG)``) has the kernel
send the child SIGTERM when its parent goes, whatever way it goes.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1

# A preexec_fn makes Popen fork() (not vfork), and fork() runs gRPC's fork handlers in a process that
# has used a Spark Connect client (gRPC): a test worker hung in them for good, starting a Connect
# server with a client's channel still open (CI ran out its 90 minutes). These children exec at once
# and need nothing of gRPC, so its handlers are off here; set before gRPC is imported (read at its start).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")


@functools.cache
def _libc() -> ctypes.CDLL | None:
    # The running interpreter's own symbols hold libc's prctl (ctypes.util.find_library would run
    # ldconfig in a subprocess, at every server start).
    return ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def die_with_parent(sig: signal.Signals = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` for :class:`subprocess.Popen`: the child gets ``sig`` when this process ends.

    None where the kernel has no such signal (not Linux): the fixtures' own
    teardown is all there is there.
    """
    libc = _libc()
    if libc is None:
        return None
    prctl = libc.prctl

    def set_signal() -> None:
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)

    return set_signal


__all__ = ["die_with_parent"]

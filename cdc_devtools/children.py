"""Servers started by tests and ``make`` targets end with the process that started them.

Fixtures stop their servers on a normal teardown, but a pytest run that is
killed (SIGTERM from CI's timeout, SIGKILL, a closed terminal) never tears
down: its Airflow scheduler, triggerer, Spark Connect JVM or PostgreSQL kept
running, and an orphaned triggerer was seen using a quarter of a core for an
hour. Linux's parent-death signal (``prctl(PR_SET_PDEATHSIG)``) has the kernel
send the child SIGTERM when its parent goes, whatever way it goes.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import sys
from collections.abc import Callable, Iterator

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


class StopSignals:
    """SIGINT and SIGTERM as one ``KeyboardInterrupt``, raised where every child started so far is known.

    A long-running command (``make airflow``) stops what it started on its
    Ctrl-C path. Two gaps left children running after a SIGTERM:

    * a signal while a child was starting -- after ``Popen`` forked, before the
      command kept the new process -- stopped everything but that child:
      :meth:`deferred` holds the interrupt until the block has kept it;
    * a second signal while the stop ran (``make`` forwards its SIGTERM to its
      child, so a process manager signalling the process group sends two) raised
      again inside the stop and cut it short: only the first signal raises; later
      ones are noted on stderr and the stop goes on (it ends on its own timeouts).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.requested: int | None = None  # the first stop signal received
        self._raised = False
        self._deferring = 0

    def install(self) -> None:
        """Take SIGINT and SIGTERM in this (the main) thread; a new run forgets an earlier stop."""
        self.requested, self._raised, self._deferring = None, False, 0
        signal.signal(signal.SIGINT, self._handle)
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        if self.requested is not None:
            # os.write, not print: the signal may have landed inside a print to the same stream.
            os.write(2, f"\n{self.name}: already stopping; everything it started is being stopped\n".encode())
            return
        self.requested = signum
        if not self._deferring:
            self._interrupt()

    def _interrupt(self) -> None:
        self._raised = True
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """A stop signal in this block raises at its end: start a child and keep it inside it."""
        self._deferring += 1
        try:
            yield
        finally:
            self._deferring -= 1
        if self.requested is not None and not self._deferring and not self._raised:
            self._interrupt()


__all__ = ["StopSignals", "die_with_parent"]

"""Keep a run's lease alive while a long phase works: renew it from a background thread.

A Spark phase can run for much longer than the lease TTL (minutes), and a
lease that is not renewed expires and may be taken over. The heartbeat renews
every ``ttl / 4`` seconds, so two renewals may fail in a row (a short S3
outage) before the lease is at risk. When a renewal finds the lease lost --
another run took over the table -- the heartbeat stops and calls ``on_lost``
(the Spark driver cancels its jobs): the phase's outputs live in this run's own
epoch namespace, so nothing the new holder uses is touched either way.

Only a store error (:class:`~iceberg_cdc.errors.CdcError`) is retried at the
next beat. Anything else is a bug that would silently stop the renewals: the
heartbeat stops, and :meth:`LeaseHeartbeat.check` -- or the ``with`` block's
end, when the block itself succeeded -- raises it, so the task fails.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from iceberg_cdc.coordination.lease import TableLease
from iceberg_cdc.errors import CdcError, LeaseLostError

log = logging.getLogger(__name__)


class LeaseHeartbeat:
    """``with LeaseHeartbeat(lease, owner, epoch, ttl):`` renews until the block ends."""

    def __init__(
        self,
        lease: TableLease,
        owner: str,
        epoch: int,
        ttl_seconds: float,
        *,
        on_lost: Callable[[LeaseLostError], None] | None = None,
        interval_seconds: float | None = None,
    ) -> None:
        self.lease = lease
        self.owner = owner
        self.epoch = epoch
        self.ttl_seconds = ttl_seconds
        self.interval = interval_seconds if interval_seconds is not None else max(ttl_seconds / 4, 0.05)
        self.on_lost = on_lost
        self.lost: LeaseLostError | None = None
        self.failed: Exception | None = None  # an unexpected error that stopped the renewals
        self.renewals = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cdc-lease-heartbeat", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.lease.renew(self.owner, self.epoch, self.ttl_seconds)
                self.renewals += 1
            except LeaseLostError as exc:
                self.lost = exc
                log.error("%s", exc)
                if self.on_lost is not None:
                    self.on_lost(exc)
                return
            except CdcError as exc:  # a store error (after its own retries): try again at the next beat
                log.warning("lease heartbeat of %s could not renew (will retry): %s", self.lease.table, exc)
            except Exception as exc:
                self.failed = exc
                log.error("lease heartbeat of %s stopped: %s: %s", self.lease.table, type(exc).__name__, exc)
                return

    def __enter__(self) -> LeaseHeartbeat:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        self.stop()
        if exc_type is None and self.failed is not None:  # the block's own error, if any, matters more
            raise self.failed

    def stop(self) -> None:
        """Stop renewing (raises nothing: :meth:`check` says what went wrong)."""
        self._stop.set()
        self._thread.join(timeout=max(self.interval, 1.0) + 30)

    def check(self) -> None:
        """Raise the :class:`LeaseLostError` the heartbeat saw, or the unexpected error that stopped it."""
        if self.lost is not None:
            raise self.lost
        if self.failed is not None:
            raise self.failed

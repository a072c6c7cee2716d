"""Keep a run's lease alive while a long phase works: renew it from a background thread.

A Spark phase can run for much longer than the lease TTL (minutes), and a
lease that is not renewed expires and may be taken over. The heartbeat renews
every ``ttl / 4`` seconds, so two renewals may fail in a row (a short S3
outage) before the lease is at risk. When a renewal finds the lease lost --
another run took over the table -- the heartbeat stops and calls ``on_lost``
(the Spark driver cancels its jobs): the phase's outputs live in this run's own
epoch namespace, so nothing the new holder uses is touched either way.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from iceberg_cdc.coordination.lease import TableLease
from iceberg_cdc.errors import LeaseLostError

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
            except Exception as exc:  # a transient store error: try again at the next beat
                log.warning("lease heartbeat of %s could not renew (will retry): %s", self.lease.table, exc)

    def __enter__(self) -> LeaseHeartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=max(self.interval, 1.0) + 30)

    def check(self) -> None:
        """Raise the :class:`LeaseLostError` the heartbeat saw, if any."""
        if self.lost is not None:
            raise self.lost

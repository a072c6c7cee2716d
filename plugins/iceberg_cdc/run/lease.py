"""A DAG run's hold on its table: taken in detect, proven at every step, given back in cleanup.

The lease (:mod:`iceberg_cdc.coordination.lease`) carries an epoch, the run's
fencing token; detect hands it on in its XCom. Every later step that acts on
shared state -- coalesce, commit, cleanup, the barrier, the Spark drivers --
first renews the lease *with that epoch*, a conditional write that fails with
:class:`~iceberg_cdc.errors.LeaseLostError` when another run has taken the
table over. Renewing at every step also keeps the lease alive with a short TTL,
so a dead run blocks its table for one TTL (plus one more when Airflow still
shows its run as running), not hours.

The TTL is the config's ``tables[].lease_ttl`` (default 300 s; the environment
variable ``CDC_LEASE_TTL_SECONDS`` overrides it for every table): long enough
to ride out an S3 outage of a minute or two between renewals, short enough
that a crashed run is overtaken within minutes.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from iceberg_cdc.config import TableConfig
from iceberg_cdc.coordination.heartbeat import LeaseHeartbeat
from iceberg_cdc.coordination.lease import HolderState, LeaseInfo
from iceberg_cdc.coordination.store_probe import probe_once
from iceberg_cdc.errors import ConfigError
from iceberg_cdc.run.context import Context
from iceberg_cdc.run.state import Detected

log = logging.getLogger("iceberg_cdc")

LEASE_TTL_ENV = "CDC_LEASE_TTL_SECONDS"
LEASE_TTL_KNOB = f"tables[].lease_ttl in the config (or the environment variable {LEASE_TTL_ENV})"
DEFAULT_LEASE_TTL_SECONDS = 300.0


def lease_ttl_seconds(table: TableConfig | None = None) -> float:
    """The lease TTL in seconds: ``CDC_LEASE_TTL_SECONDS`` if set, else ``tables[].lease_ttl``, else 300."""
    raw = os.environ.get(LEASE_TTL_ENV)
    if not raw:
        if table is not None and table.lease_ttl is not None:
            return float(table.lease_ttl)
        return DEFAULT_LEASE_TTL_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError(
            f"the environment variable {LEASE_TTL_ENV}={raw!r} must be a positive number of seconds (it "
            "overrides tables[].lease_ttl of the config); fix it or unset it"
        )
    return value


def take(
    ctx: Context,
    run_id: str,
    *,
    dag_id: str = "",
    try_number: int | None = None,
    holder_state: Callable[[LeaseInfo], HolderState] | None = None,
) -> LeaseInfo:
    """Take the table's lease for this run with a new epoch (detect).

    The first time in a process, the store is probed: an S3-compatible store
    that ignores conditional requests would let two runs hold one table.
    """
    lease = ctx.lease()
    probe_once(lease.store)
    return lease.acquire(
        run_id, lease_ttl_seconds(ctx.table), dag_id=dag_id, try_number=try_number, holder_state=holder_state
    )


def confirm(ctx: Context, detected: Detected | Mapping[str, Any]) -> LeaseInfo:
    """Prove this run still holds its epoch of the lease, and extend it (every later step)."""
    detected = Detected.of(detected)
    return ctx.lease().renew(detected.run_id, int(detected.epoch), float(detected.lease_ttl))


@contextlib.contextmanager
def kept_alive(ctx: Context, detected: Detected | Mapping[str, Any] | None) -> Iterator[None]:
    """Renew the run's lease from a background thread while a step works (every ``ttl / 4`` seconds).

    With every task of a run renewing while it runs, the lease mirrors
    Airflow's own view of the task: a task Airflow shows running whose lease
    expired has stopped (killed or hung), and the next run takes the table at
    once (:mod:`iceberg_cdc.coordination.lease`, "Dead holders"). A lost lease
    is not raised here: the step's own lease check raises it.
    """
    if not detected:
        yield
        return
    detected = Detected.of(detected)
    with renewing(ctx, detected.run_id, int(detected.epoch), float(detected.lease_ttl)):
        yield


@contextlib.contextmanager
def renewing(ctx: Context, run_id: str, epoch: int, ttl: float) -> Iterator[None]:
    """:func:`kept_alive` for a run whose detect is still deciding (it holds the lease of ``epoch``)."""
    with LeaseHeartbeat(ctx.lease(), run_id, epoch, ttl):
        yield


NO_EPOCH = 0  # a run that took no lease (epochs start at 1): there is nothing of it to release or delete


def give_back(ctx: Context, run_id: str, epoch: int | None) -> bool:
    """Release the run's lease of ``epoch`` (never another run's or epoch's)."""
    return ctx.lease().release(run_id, epoch)


RESCHEDULE_SECONDS = 10.0  # a detect waiting under a scheduler looks again this often, holding no slot


def lease_wait_step(
    *,
    now: float,
    waiting_since: float,
    holder_since: float | None,
    window: float,
    try_started: float,
    reschedule: bool,
    in_process_seconds: float,
    holder_expired: bool = False,
) -> tuple[str, float]:
    """What a detect that found its table held does next: ``("fail" | "sleep" | "reschedule", seconds)``.

    The wait is bounded per holder: ``window`` seconds from when this run
    started waiting, or from when the current holder took the table if that is
    later -- a queue of runs taking the table in turn is progress (a backfill's
    runs, a chained run behind its predecessor's cleanup), one holder blocking
    the table that long is not, and the run fails naming it. A holder whose
    lease has expired (``holder_expired``: it stopped renewing, most likely
    dead) is about to be taken over -- at once, or after one more TTL while
    Airflow shows its run between tasks -- so the run keeps waiting for it
    rather than giving up just before the takeover.

    Under a scheduler (``reschedule``) the task gives its worker slot back
    while it waits: it polls in process for ``in_process_seconds`` at most
    (the common case, a predecessor finishing its cleanup), then asks to be
    rescheduled. Waiting runs that hold slots could otherwise starve the
    holder itself on a small executor: a backfill starts many runs at once.
    ``airflow dags test`` (no scheduler) sleeps in process.
    """
    start = waiting_since if holder_since is None else max(waiting_since, holder_since)
    left = start + window - now
    if left <= 0 and not holder_expired:
        return "fail", 0.0
    left = max(left, 1.0)
    if not reschedule:
        return "sleep", min(15.0, max(1.0, left))
    if now - try_started < in_process_seconds:
        return "sleep", min(1.0, left)
    return "reschedule", min(RESCHEDULE_SECONDS, max(1.0, left))

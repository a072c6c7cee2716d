"""Which of a table's waiting runs goes on: at most one ordinary run queues behind a busy table.

A writer committing every few seconds starts a run per commit (the source's
asset events, the clock). The run holding the table chains the next one when
it finishes, so the pending snapshots are taken care of; runs that only
*wait* for the table add nothing but load -- each re-looking at the lease,
and, once it got it, holding it for a few seconds only to find the chain's
snapshot (``run/detect.py``, "one chain per table") while the chained run that
has the work waits behind it.

So before it takes the lease, an ordinary run (event- or clock-started, or
manual without a snapshot) asks Airflow which runs of its DAG have not
finished detect yet, and leaves the table to

* a chained run (it was started for the very snapshot this run would take), or
* another ordinary run that sorts before it (by run id: a total order, so of
  any set of queued ordinary runs exactly one goes on).

Backfill runs, reprocess runs and chained runs never leave: they are asked
for by someone, and a backfill's runs queue on purpose. A run that leaves
processes nothing, takes no lease and ends green, naming the run ahead.
The one that stays keeps the dead-holder guarantee: it is there to take the
table over when the holder's lease expires.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from iceberg_cdc.run.story import CHAIN_PREFIX

# detect states of a run that has not yet taken the table (or is taking it now): Airflow's state names.
NOT_YET_DETECTED = frozenset(
    {"none", "scheduled", "queued", "running", "up_for_reschedule", "up_for_retry", "deferred"}
)
# Run ids of runs started by the table's events or clock: the only ones an ordinary run queues behind.
ORDINARY_PREFIXES = ("asset_triggered__", "scheduled__")


def waiting(states: Iterable[str]) -> bool:
    """Whether a run's detect task states say it has not taken its snapshot yet."""
    return any(state in NOT_YET_DETECTED for state in states)


def live_chain(own_run_id: str, detect_states: Mapping[str, Iterable[str]]) -> str | None:
    """A chained run other than this one whose detect has not finished: it waits for the next snapshot."""
    for run_id, states in sorted(detect_states.items()):
        if run_id != own_run_id and run_id.startswith(CHAIN_PREFIX) and waiting(states):
            return run_id
    return None


def run_ahead(own_run_id: str, detect_states: Mapping[str, Iterable[str]]) -> str | None:
    """Why an ordinary run leaves the table alone (naming the run ahead), or None when it queues for it.

    ``detect_states``: every run of the DAG, by run id, with the states of its
    detect task (Airflow's names, lower case).
    """
    chain = live_chain(own_run_id, detect_states)
    if chain is not None:
        return f"left to the chain: run {chain} processes the next pending snapshot and those after it"
    for run_id, states in sorted(detect_states.items()):
        if run_id >= own_run_id:
            break
        if run_id.startswith(ORDINARY_PREFIXES) and waiting(states):
            return f"run {run_id} already queues for the table and processes the next pending snapshot"
    return None


__all__ = ["NOT_YET_DETECTED", "ORDINARY_PREFIXES", "live_chain", "run_ahead", "waiting"]

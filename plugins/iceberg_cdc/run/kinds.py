"""What a DAG run may do, by how it was started: scheduled, chained, manual, range reprocess, backfill.

Plain functions over a run's type and conf, so the DAG factory's tasks stay
thin and the rules are tested without Airflow:

* a **backfill** run processes the next pending snapshot and never chains (a
  chained run would escape the backfill); ``snapshot_id`` and
  ``through_snapshot_id`` are refused in it;
* a **manual reprocess** (``snapshot_id``) replaces one snapshot's rows and
  does not chain unless ``trigger_next`` is true;
* a **range reprocess** (``snapshot_id`` A, ``through_snapshot_id`` B)
  replaces A's rows, then chains to the next snapshot of the range, one run
  per snapshot, up to B (``trigger_next: false`` stops it after one);
* any other run chains while snapshots are pending (``trigger_next: false``
  turns that off).
"""

from __future__ import annotations

from typing import Any

REPROCESS_KEYS = ("snapshot_id", "through_snapshot_id")


def is_backfill(run_type: Any) -> bool:
    """Whether a run's ``run_type`` (an enum or its value) is a backfill's."""
    return str(getattr(run_type, "value", run_type) or "").lower() == "backfill"


def backfill_refusal(params: dict[str, Any] | None) -> str | None:
    """Why a backfill run must not start with these params (None when it may)."""
    given = {
        key: value for key, value in (params or {}).items() if key in REPROCESS_KEYS and value is not None
    }
    if not given:
        return None
    named = ", ".join(f"{key}={value}" for key, value in given.items())
    return (
        f"{named} is not allowed in a backfill: a backfill processes the pending snapshots in order, "
        "one per run, and its runs never chain. To reprocess one snapshot, trigger a manual run with "
        '{"snapshot_id": <id>}; to reprocess several, one run per snapshot, trigger '
        '{"snapshot_id": <first>, "through_snapshot_id": <last>}. Nothing was run.'
    )


def should_chain(mark: dict[str, Any], params: dict[str, Any] | None, *, backfill: bool) -> bool:
    """Whether the run starts the next one at once (``mark``: the watermark step's result)."""
    if backfill:
        return False
    params = params or {}
    chain = params.get("trigger_next")
    if mark.get("next_conf"):
        return chain is None or bool(chain)
    if chain is None:
        chain = params.get("snapshot_id") is None
    return bool(mark.get("remaining")) and bool(chain)

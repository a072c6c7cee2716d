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

from iceberg_cdc.errors import ConfigError

REPROCESS_KEYS = ("snapshot_id", "through_snapshot_id")


def is_backfill(run_type: Any) -> bool:
    """Whether a run's ``run_type`` (an enum or its value) is a backfill's."""
    return str(getattr(run_type, "value", run_type) or "").lower() == "backfill"


def backfill_refusal(params: dict[str, Any] | None) -> str | None:
    """Why a backfill run must not start with these params (None when it may)."""
    given = {
        key: value
        for key, value in (params or {}).items()
        if key in REPROCESS_KEYS and value is not None and value != ""
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


_CHOICES = {"auto": None, "yes": True, "no": False, "true": True, "false": False}


def trigger_next_choice(value: Any) -> bool | None:
    """``trigger_next`` as given -- the form's ``auto`` / ``yes`` / ``no``, or an API caller's boolean.

    None means "auto": chain, except after a reprocess of one snapshot.
    """
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("", "none", "null"):
        return None
    if text not in _CHOICES:
        raise ConfigError(f"trigger_next={value!r} is not a choice: give auto, yes or no (or true / false)")
    return _CHOICES[text]


def should_chain(mark: dict[str, Any], params: dict[str, Any] | None, *, backfill: bool) -> bool:
    """Whether the run starts the next one at once (``mark``: the watermark step's result)."""
    if backfill:
        return False
    params = params or {}
    chain = trigger_next_choice(params.get("trigger_next"))
    if mark.get("next_conf"):
        return chain is None or chain
    if chain is None:
        chain = params.get("snapshot_id") in (None, "")
    return bool(mark.get("remaining")) and chain

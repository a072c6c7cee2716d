"""What detect decided for a run, typed: the one record every later step of the run reads.

Detect returns a :class:`Detected`; the orchestrator stores it as the detect
task's XCom (:meth:`Detected.to_xcom`, a small JSON object) and every later
step takes it back with :meth:`Detected.of`, which accepts the record or its
XCom form. Snapshot ids travel as strings of digits in the XCom form: they are
63-bit, and a browser showing an XCom (Airflow's UI) would round them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from iceberg_cdc import snapshot_ids

Action = Literal["caught_up", "skip", "shuffle", "insert"]
ACTIONS: tuple[str, ...] = ("caught_up", "skip", "shuffle", "insert")

_SNAPSHOT_ID_FIELDS = ("snapshot_id", "through_snapshot_id", "next_in_range", "base_snapshot_id")


def snapshot_id_or_none(value: Any) -> int | None:
    """A snapshot id from an int or a string of digits (as the XCom form and Params carry it).

    The one parser of ids people and browsers hand over: :func:`iceberg_cdc.snapshot_ids.parse`.
    """
    return snapshot_ids.parse(value)


@dataclass(frozen=True)
class Detected:
    """The snapshot a run processes (or why it processes none), its plan, and the run's lease epoch.

    ``action``: ``caught_up`` (nothing pending), ``skip`` (a snapshot with no
    logical change: only the watermark moves), ``shuffle`` (a snapshot with
    deletes: the shuffle path) or ``insert`` (insert-only: no shuffle).
    ``write_args`` / ``insert_args`` are the mapped Spark tasks' arguments of
    the path the run takes (the other is empty).
    """

    action: Action
    source: str
    sink: str
    run_id: str
    epoch: int
    lease_ttl: float
    manual: bool = False
    swept: Mapping[str, int] = field(default_factory=dict)
    remaining: int = 0
    snapshot_id: int | None = None
    # The snapshot the run's changes are relative to (the processed one's parent; None: an initial load,
    # which reads the whole table): lineage names the range read as (base, snapshot_id].
    base_snapshot_id: int | None = None
    ordinal: int | None = None
    operation: str | None = None
    source_uuid: str | None = None
    plan: str | None = None
    initial_load: bool = False
    reason: str | None = None
    identifier_columns: tuple[str, ...] = ()
    write_args: tuple[tuple[str, ...], ...] = ()
    insert_args: tuple[tuple[str, ...], ...] = ()
    write_task_ids: tuple[str, ...] = ()
    through_snapshot_id: int | None = None
    next_in_range: int | None = None
    range_left: int | None = None  # a range reprocess: snapshots of the range after this one
    warnings: tuple[str, ...] = ()  # what the operator should know (a sink another writer changed)
    # Where the tables live: their names in lineage events (iceberg_cdc/lineage.py).
    source_location: str | None = None
    sink_location: str | None = None
    # The retention guard (run/retention_guard.py): its outlook, the note's warning, the tag moves.
    retention: Mapping[str, Any] = field(default_factory=dict)
    retention_warning: str | None = None
    protection: Mapping[str, Any] = field(default_factory=dict)
    # A bridge over a gap in the source's history: reason, from, to, common_ancestor (ids as strings).
    bridge: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"unknown action {self.action!r}; expected one of {', '.join(ACTIONS)}")

    def to_xcom(self) -> dict[str, Any]:
        """The JSON form stored as the detect task's XCom (snapshot ids as strings of digits)."""
        out = asdict(self)
        for name in _SNAPSHOT_ID_FIELDS:
            if out[name] is not None:
                out[name] = str(out[name])
        out["swept"] = dict(self.swept)
        out["retention"] = dict(self.retention)
        out["protection"] = dict(self.protection)
        out["bridge"] = dict(self.bridge)
        for name in ("identifier_columns", "write_task_ids", "warnings"):
            out[name] = list(out[name])
        for name in ("write_args", "insert_args"):
            out[name] = [list(args) for args in out[name]]
        return out

    @classmethod
    def of(cls, value: Detected | Mapping[str, Any]) -> Detected:
        """The record itself, or the record back from its XCom form (unknown keys are ignored)."""
        if isinstance(value, Detected):
            return value
        known = {f.name for f in fields(cls)}
        raw = {k: v for k, v in value.items() if k in known}
        for name in _SNAPSHOT_ID_FIELDS:
            raw[name] = snapshot_id_or_none(raw.get(name))
        for name in ("identifier_columns", "write_task_ids", "warnings"):
            raw[name] = tuple(raw.get(name) or ())
        for name in ("write_args", "insert_args"):
            raw[name] = tuple(tuple(str(a) for a in args) for args in raw.get(name) or ())
        raw["swept"] = dict(raw.get("swept") or {})
        raw["retention"] = dict(raw.get("retention") or {})
        raw["protection"] = dict(raw.get("protection") or {})
        raw["bridge"] = dict(raw.get("bridge") or {})
        return cls(**raw)

"""How long until a snapshot the sink still needs may be expired from the source table.

Snapshot expiry (Spark's ``expire_snapshots`` procedure, a catalog's table
maintenance, pyiceberg's ``table.maintenance.expire_snapshots()``) removes old
snapshots. The pipeline still needs, for every table, the **watermark's
snapshot** (the parent the next snapshot is diffed against: the files that
snapshot removed are only reachable through it) and every **pending
snapshot** after it. Once one of them is gone the table stops with
:class:`~iceberg_cdc.errors.SourceHistoryError` and can only restart from the
current state: the changes in between are lost for good (apache/iceberg#9141).
This module says how close that is, before it happens.

The rules are Iceberg's own (Java ``RemoveSnapshots``, which the engines'
procedures use): a snapshot survives an expiry when

* it is the head of a branch or a tag (a tag, or a branch other than
  ``main``, only until its ``max-ref-age-ms`` has passed since the snapshot); or
* it is an ancestor of a branch head that is newer than the branch's
  ``max-snapshot-age-ms`` (the ref's own, else the table property
  ``history.expire.max-snapshot-age-ms``, default 5 days) or among the
  branch's ``min-snapshots-to-keep`` newest ancestors (ref, else
  ``history.expire.min-snapshots-to-keep``, default 1).

So a needed snapshot that only ``main`` keeps may be expired once it is older
than ``max-snapshot-age`` and ``min-snapshots-to-keep`` newer snapshots exist; one kept by a tag without an age limit (as the pipeline's own
``protect_pending`` tags, :mod:`iceberg_cdc.source.protection`) is safe.
Whether anyone actually runs an expiry then is not visible from the table:
this is the earliest moment one *may* remove it. pyiceberg 0.12's own expiry
is cruder (``older_than`` removes every snapshot that heads no ref, whatever
the table's properties), which only the tags protect against.

Pure functions over pyiceberg's table metadata: no catalog call, no clock
(``now_ms`` is passed in).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRef, SnapshotRefType
from pyiceberg.table.snapshots import ancestors_of

from iceberg_cdc.units import format_duration
from iceberg_cdc.watermark import Watermark

MAX_SNAPSHOT_AGE_PROPERTY = "history.expire.max-snapshot-age-ms"
MIN_SNAPSHOTS_PROPERTY = "history.expire.min-snapshots-to-keep"
MAX_REF_AGE_PROPERTY = "history.expire.max-ref-age-ms"
DEFAULT_MAX_SNAPSHOT_AGE_MS = 5 * 24 * 3600 * 1000  # Iceberg's default: 5 days
DEFAULT_MIN_SNAPSHOTS_TO_KEEP = 1

Role = Literal["watermark", "pending"]


@dataclass(frozen=True)
class NeededSnapshots:
    """What the sink still needs from the source: the watermark's snapshot and the pending ones (oldest first)."""

    watermark_snapshot_id: int | None
    pending: tuple[int, ...]

    @property
    def ids(self) -> tuple[int, ...]:
        mark = () if self.watermark_snapshot_id is None else (self.watermark_snapshot_id,)
        return mark + self.pending


@dataclass(frozen=True)
class SnapshotExposure:
    """When one needed snapshot may be expired, and what keeps it until then."""

    snapshot_id: int
    role: Role
    committed_at_ms: int
    # The last moment every expiry keeps it (epoch ms; from the next millisecond on one may remove
    # it, as Iceberg keeps a snapshot while ``now - committed_at <= max age``). None: kept with no
    # end in sight (a ref head without an age limit), or for now by min-snapshots-to-keep alone
    # (it may go once ``newer_needed`` more snapshots arrive, at no time that can be told).
    kept_until_ms: int | None
    kept_by: str  # "tag cdc-pending-...", "branch main (head)", "main: max-snapshot-age 5 d", ...
    newer_needed: int = 0  # min-snapshots-to-keep: snapshots still to arrive before age alone decides


@dataclass(frozen=True)
class RetentionOutlook:
    """The needed snapshot that may be expired first, with the table's expiry settings."""

    max_snapshot_age_ms: int
    min_snapshots_to_keep: int
    needed: int  # snapshots the sink needs (watermark's + pending)
    first: SnapshotExposure | None  # the one that may go first; None when nothing needed is exposed
    protected: bool  # every needed snapshot heads a ref without an age limit (protect_pending)
    # Whether the table says how old its snapshots may get (history.expire.max-snapshot-age-ms, or
    # main's own): without it the estimate is Iceberg's default, and an expiry job with its own limit
    # (pyiceberg's older_than, a platform's nightly job) is invisible from the table.
    settings_known: bool = True
    # The oldest needed snapshot no pipeline tag holds: its id and commit time (the evidence that
    # holds whatever the settings: how long it has been exposed).
    oldest_unheld: tuple[int, int] | None = None

    def seconds_left(self, now_ms: int) -> float | None:
        """Seconds until the first needed snapshot may be expired (<= 0: it may be already); None: no limit."""
        if self.first is None or self.first.kept_until_ms is None:
            return None
        return (self.first.kept_until_ms - now_ms) / 1000

    def warning(self, now_ms: int, threshold_seconds: float) -> str | None:
        """A warning when a needed snapshot may be expired within ``threshold_seconds``.

        From the table's settings when it has them. Without them the settings'
        estimate means little (any expiry job may use its own age limit), so
        the evidence decides: a needed snapshot no tag holds that is already
        older than the threshold is warned about, saying the limit is unknown.
        """
        left = self.seconds_left(now_ms)
        if left is not None and left <= threshold_seconds and self.first is not None:
            first = self.first
            what = "the watermark's snapshot" if first.role == "watermark" else "pending snapshot"
            when = "may be expired now" if left <= 0 else f"may be expired in {format_duration(left)}"
            unknown = "" if self.settings_known else f" -- {UNKNOWN_SETTINGS}"
            return f"{what} {first.snapshot_id} {when} ({first.kept_by}{unknown}); {WAYS_OUT}"
        if self.settings_known or self.oldest_unheld is None:
            return None
        snapshot_id, committed_at_ms = self.oldest_unheld
        age = (now_ms - committed_at_ms) / 1000
        if age < threshold_seconds:
            return None
        return (
            f"snapshot {snapshot_id}, needed by the sink, is {format_duration(age)} old and no tag holds it; "
            f"when it may be expired cannot be known: {UNKNOWN_SETTINGS}; {WAYS_OUT}"
        )

    def to_dict(self, now_ms: int) -> dict[str, Any]:
        """JSON-able, ids as strings (browsers lose digits of 64-bit integers)."""
        first = asdict(self.first) if self.first else None
        if first is not None:
            first["snapshot_id"] = str(first["snapshot_id"])
        return {
            "max_snapshot_age_ms": self.max_snapshot_age_ms,
            "min_snapshots_to_keep": self.min_snapshots_to_keep,
            "needed": self.needed,
            "protected": self.protected,
            "seconds_left": self.seconds_left(now_ms),
            "first": first,
            "settings_known": self.settings_known,
        }


UNKNOWN_SETTINGS = (
    "the table sets no history.expire.max-snapshot-age-ms, so an expiry job's own age limit (pyiceberg's "
    "older_than, Spark's expire_snapshots(older_than => ...)) is not visible here"
)
WAYS_OUT = (
    "if it goes before it is processed, its changes reach the changelog only inside a bridge commit "
    "(or, with on_history_gap: fail, the table stops). Process the backlog, raise the source's snapshot "
    "retention, or set protect_pending: true"
)


def _int_property(properties: Mapping[str, str], key: str, default: int) -> int:
    try:
        value = int(properties.get(key, default))
    except (TypeError, ValueError):
        return default  # a malformed property: Iceberg's engines fall back the same way or fail the expiry
    return value if value > 0 else default


def needed_snapshots(table: Table, watermark: Watermark | None, start: str = "earliest") -> NeededSnapshots:
    """The watermark's snapshot and the pending snapshots of ``main``'s current ancestry, oldest first.

    A watermark that is not on the current line (expired, rolled back) needs
    nothing more: detect refuses that table with the reason anyway.
    """
    ancestry = list(ancestors_of(table.metadata.current_snapshot(), table.metadata))
    ancestry.reverse()
    ids = [s.snapshot_id for s in ancestry]
    if watermark is None:
        if start == "latest":
            return NeededSnapshots(None, tuple(ids[-1:]))
        return NeededSnapshots(None, tuple(ids))
    if watermark.snapshot_id not in ids:
        return NeededSnapshots(None, ())
    position = ids.index(watermark.snapshot_id)
    return NeededSnapshots(watermark.snapshot_id, tuple(ids[position + 1 :]))


def _ref_end(ref: SnapshotRef, committed_at_ms: int, table_max_ref_age: int | None) -> int | None:
    """When a tag (or non-main branch) stops protecting its head: its max-ref-age after the snapshot."""
    age = ref.max_ref_age_ms or table_max_ref_age
    return None if age is None else committed_at_ms + age


def outlook(
    metadata: TableMetadata,
    needed: NeededSnapshots,
    *,
    protection_prefix: str | tuple[str, ...] | None = None,
) -> RetentionOutlook:
    """When each needed snapshot may be expired, and which one first (see the module docstring).

    ``protection_prefix``: names of the pipeline's own tags; ``protected`` is
    true when every needed snapshot heads one without an age limit.
    """
    properties = metadata.properties
    table_age = _int_property(properties, MAX_SNAPSHOT_AGE_PROPERTY, DEFAULT_MAX_SNAPSHOT_AGE_MS)
    table_min = _int_property(properties, MIN_SNAPSHOTS_PROPERTY, DEFAULT_MIN_SNAPSHOTS_TO_KEEP)
    raw_ref_age = properties.get(MAX_REF_AGE_PROPERTY)
    table_ref_age = _int_property(properties, MAX_REF_AGE_PROPERTY, 1) if raw_ref_age is not None else None
    main = metadata.refs.get(MAIN_BRANCH)
    main_age = (main.max_snapshot_age_ms if main else None) or table_age
    main_min = (main.min_snapshots_to_keep if main else None) or table_min

    # Position of each snapshot in every branch's ancestry (0 = the head), for min-snapshots-to-keep.
    branches: list[tuple[str, SnapshotRef, dict[int, int]]] = []
    for name, ref in metadata.refs.items():
        if ref.snapshot_ref_type == SnapshotRefType.BRANCH:
            head = metadata.snapshot_by_id(ref.snapshot_id)
            line = {s.snapshot_id: i for i, s in enumerate(ancestors_of(head, metadata))} if head else {}
            branches.append((name, ref, line))

    roles: dict[int, Role] = {sid: "pending" for sid in needed.pending}
    if needed.watermark_snapshot_id is not None:
        roles[needed.watermark_snapshot_id] = "watermark"
    exposures = []
    protected = bool(roles) and protection_prefix is not None
    for snapshot_id, role in roles.items():
        snapshot = metadata.snapshot_by_id(snapshot_id)
        if snapshot is None:
            continue
        exposure = _exposure(
            metadata, snapshot_id, role, snapshot.timestamp_ms, branches, table_age, table_min, table_ref_age
        )
        exposures.append(exposure)
        if protection_prefix is not None and not _own_tag_holds(
            metadata, snapshot_id, protection_prefix, table_ref_age
        ):
            protected = False
    exposed = [e for e in exposures if e.kept_until_ms is not None]
    first = min(exposed, key=lambda e: (e.kept_until_ms, e.committed_at_ms), default=None)
    if first is None:  # nothing ends by age: show what only min-snapshots-to-keep holds, if anything
        first = min(
            (e for e in exposures if e.newer_needed),
            key=lambda e: (e.newer_needed, e.committed_at_ms),
            default=None,
        )
    known = MAX_SNAPSHOT_AGE_PROPERTY in properties or bool(main and main.max_snapshot_age_ms)
    unheld = [
        e
        for e in exposures
        if protection_prefix is None
        or not _own_tag_holds(metadata, e.snapshot_id, protection_prefix, table_ref_age)
    ]
    oldest = min(unheld, key=lambda e: e.committed_at_ms, default=None)
    return RetentionOutlook(
        main_age,
        main_min,
        len(roles),
        first,
        protected,
        settings_known=known,
        oldest_unheld=None if oldest is None else (oldest.snapshot_id, oldest.committed_at_ms),
    )


def _own_tag_holds(
    metadata: TableMetadata, snapshot_id: int, prefix: str | tuple[str, ...], table_ref_age: int | None
) -> bool:
    return any(
        name.startswith(prefix)
        and ref.snapshot_ref_type == SnapshotRefType.TAG
        and ref.snapshot_id == snapshot_id
        and (ref.max_ref_age_ms or table_ref_age) is None
        for name, ref in metadata.refs.items()
    )


def _exposure(
    metadata: TableMetadata,
    snapshot_id: int,
    role: Role,
    committed_at_ms: int,
    branches: list[tuple[str, SnapshotRef, dict[int, int]]],
    table_age: int,
    table_min: int,
    table_ref_age: int | None,
) -> SnapshotExposure:
    """The latest moment anything keeps this snapshot; None as soon as one thing keeps it for good."""
    kept: list[tuple[int | None, str, int]] = []  # (until, by what, newer snapshots still needed)
    for name, ref in metadata.refs.items():
        if ref.snapshot_id != snapshot_id:
            continue
        kind = "tag" if ref.snapshot_ref_type == SnapshotRefType.TAG else "branch"
        until = None if name == MAIN_BRANCH else _ref_end(ref, committed_at_ms, table_ref_age)
        kept.append((until, f"{kind} {name} points at it", 0))
    for name, ref, line in branches:
        position = line.get(snapshot_id)
        if position is None or position == 0:
            continue  # not on this branch, or its head (counted above)
        age = ref.max_snapshot_age_ms or table_age
        keep = ref.min_snapshots_to_keep or table_min
        head = metadata.snapshot_by_id(ref.snapshot_id)
        # A branch other than main is itself dropped max-ref-age after its *head* was committed.
        ref_end = (
            None if name == MAIN_BRANCH or head is None else _ref_end(ref, head.timestamp_ms, table_ref_age)
        )
        if position < keep:  # kept by count while the branch lives, whatever its age
            if ref_end is None:
                kept.append((None, f"on {name}: min-snapshots-to-keep {keep}", keep - position))
            else:
                kept.append((ref_end, f"on {name} (until the branch's max-ref-age)", 0))
            continue
        until = committed_at_ms + age
        if ref_end is not None:
            until = min(until, ref_end)
        kept.append((until, f"on {name}: max-snapshot-age {format_duration(age / 1000)}", 0))
    forever = [k for k in kept if k[0] is None and k[2] == 0]
    if forever:
        return SnapshotExposure(snapshot_id, role, committed_at_ms, None, forever[0][1])
    by_count = [k for k in kept if k[0] is None]
    if by_count:
        return SnapshotExposure(snapshot_id, role, committed_at_ms, None, by_count[0][1], by_count[0][2])
    if not kept:
        return SnapshotExposure(snapshot_id, role, committed_at_ms, committed_at_ms, "nothing keeps it")
    until, reason, _ = max(kept, key=lambda k: k[0] or 0)
    return SnapshotExposure(snapshot_id, role, committed_at_ms, until, reason)


def table_outlook(
    table: Table,
    watermark: Watermark | None,
    start: str = "earliest",
    *,
    protection_prefix: str | tuple[str, ...] | None = None,
) -> RetentionOutlook:
    """:func:`outlook` for a loaded source table and the sink's watermark."""
    return outlook(
        table.metadata, needed_snapshots(table, watermark, start), protection_prefix=protection_prefix
    )

"""The sink snapshot summary of a CDC commit: every ``cdc.*`` key, defined once, written and read by one record.

Each sink commit carries in its snapshot summary what it is (the marker: the
source table, snapshot id, table uuid and ordinal -- the exactly-once check
looks for it) and what the run measured: change counts, seconds per phase,
the conservation rows and the skew coalesce found. The summary outlives
Airflow's database, so the CDC view, the demo and the benchmarks read it
back. :class:`CommitSummary` is the one place that knows the keys: the commit
step builds one, :func:`iceberg_cdc.sink.commit.commit_changes` adds the
marker and writes it, and readers parse it with :meth:`CommitSummary.from_summary`.

The keys (all values strings, as Iceberg summaries are)::

    cdc.source-table, cdc.source-snapshot-id, cdc.source-uuid, cdc.change-ordinal   the marker
    cdc.replace = true             the append of a manual reprocess
    cdc.replaced-snapshot-id       on a reprocess's delete snapshot: whose rows it removed
    cdc.initial-load = true|false  the commit holds a snapshot's whole state as INSERTs
    cdc.operation                  the source snapshot's operation (append, overwrite, ...)
    cdc.<figure>                   a summed task figure, ``_`` written ``-`` (cdc.carryover-rows)
    cdc.seconds.<phase>            seconds per phase
    cdc.rows.<stage>               conservation rows (input, masked, cancelled, shuffled, read, carryover, changes)
    cdc.skewed, cdc.skew.*         skewed shuffle partitions (:class:`Skew`)
    cdc.bridge.*                   a bridge over a gap in the source's history (:class:`Bridge`)

Reading is lenient: a commit made before a figure existed lacks it (``None``,
never zero), and a value that does not parse is left out rather than failing
a status page. The key layout is the contract with every sink already written:
change it only by reading the old form too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PREFIX = "cdc."
SOURCE_TABLE_KEY = "cdc.source-table"
SOURCE_SNAPSHOT_ID_KEY = "cdc.source-snapshot-id"
SOURCE_UUID_KEY = "cdc.source-uuid"
CHANGE_ORDINAL_KEY = "cdc.change-ordinal"
# Set ("true") on the append of a manual reprocess (``replace_existing``): such a
# commit may sit above commits of later snapshots, so it never ends a search early.
REPLACE_KEY = "cdc.replace"
# On the delete snapshot of a reprocess: which source snapshot's rows it removed.
REPLACED_SNAPSHOT_ID_KEY = "cdc.replaced-snapshot-id"
# Set ("true") on a commit that holds a snapshot's whole state as INSERTs (an initial load):
# a reprocess of that snapshot must load the whole state again, not its diff.
INITIAL_LOAD_KEY = "cdc.initial-load"
OPERATION_KEY = "cdc.operation"
SECONDS_PREFIX = "cdc.seconds."
ROWS_PREFIX = "cdc.rows."
SKEWED_KEY = "cdc.skewed"
SKEW_MAX_RATIO_KEY = "cdc.skew.max-ratio"
SKEW_MAX_BYTES_KEY = "cdc.skew.max-bytes"
SKEW_MEDIAN_BYTES_KEY = "cdc.skew.median-bytes"
SKEW_PARTITIONS_KEY = "cdc.skew.partitions"

BRIDGE_REASON_KEY = "cdc.bridge.reason"  # expired | rolled back
BRIDGE_FROM_KEY = "cdc.bridge.from-snapshot-id"  # the watermark's snapshot the bridge starts from
BRIDGE_ANCESTOR_KEY = "cdc.bridge.common-ancestor"  # a rollback's common ancestor, when there is one
BRIDGE_BASE_KEY = "cdc.bridge.base"  # where the base state came from: snapshot | changelog replay

SKEW_LISTED = 20  # partitions named in ``cdc.skew.partitions``; the count says how many there are

# Keys of the form ``cdc.<name>`` that are not task figures.
_NAMED_KEYS = frozenset(
    {
        SOURCE_TABLE_KEY,
        SOURCE_SNAPSHOT_ID_KEY,
        SOURCE_UUID_KEY,
        CHANGE_ORDINAL_KEY,
        REPLACE_KEY,
        REPLACED_SNAPSHOT_ID_KEY,
        INITIAL_LOAD_KEY,
        OPERATION_KEY,
        SKEWED_KEY,
    }
)
_FIGURE_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def int_value(value: str | None) -> int | None:
    """A summary value as an integer; None when missing or not one (``"12.0"`` counts as 12).

    Summaries may be edited by hand or written by other tools: a reader never fails on them.
    """
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        number = _float(value)
        return int(number) if number is not None and number.is_integer() else None


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def figure_key(name: str) -> str:
    """``carryover_rows`` -> ``cdc.carryover-rows``; refuses a name that would collide with another key."""
    key = PREFIX + name.replace("_", "-")
    if not _FIGURE_NAME.match(name) or key in _NAMED_KEYS:
        raise ValueError(f"{name!r} cannot be a commit figure: it would be written as {key!r}")
    return key


def _figure(name: str) -> property:
    """A read-only attribute for ``figures[name]`` (None when the commit did not record it)."""

    def get(self: CommitSummary) -> int | None:
        return self.figures.get(name)

    return property(get, doc=f"``figures['{name}']``, None when not recorded.")


@dataclass(frozen=True)
class Skew:
    """Skewed shuffle partitions coalesce found (:func:`iceberg_cdc.pipeline.groups.skew_summary`).

    ``count`` skewed partitions, ``partitions`` the first :data:`SKEW_LISTED`
    of them (largest first); the largest one's size, the median non-empty
    partition's and their ratio (one decimal) when coalesce recorded sizes.
    """

    count: int
    partitions: tuple[int, ...] = ()
    max_ratio: float | None = None
    max_bytes: int | None = None
    median_bytes: int | None = None

    def to_summary(self) -> dict[str, str]:
        out = {SKEWED_KEY: str(self.count)}
        if self.max_ratio is not None:
            out[SKEW_MAX_RATIO_KEY] = f"{self.max_ratio:.1f}"
        if self.max_bytes is not None:
            out[SKEW_MAX_BYTES_KEY] = str(self.max_bytes)
        if self.median_bytes is not None:
            out[SKEW_MEDIAN_BYTES_KEY] = str(self.median_bytes)
        if self.partitions:
            out[SKEW_PARTITIONS_KEY] = ",".join(str(p) for p in self.partitions[:SKEW_LISTED])
        return out

    @classmethod
    def from_summary(cls, summary: Mapping[str, str]) -> Skew | None:
        """The skew a commit recorded; None when it recorded none (no shuffle, or from before skew was kept)."""
        count = int_value(summary.get(SKEWED_KEY))
        if count is None:
            return None
        tokens = re.split(r"[\s,\[\]]+", summary.get(SKEW_PARTITIONS_KEY, ""))
        return cls(
            count=count,
            partitions=tuple(p for p in map(int_value, tokens) if p is not None),
            max_ratio=_float(summary.get(SKEW_MAX_RATIO_KEY)),
            max_bytes=int_value(summary.get(SKEW_MAX_BYTES_KEY)),
            median_bytes=int_value(summary.get(SKEW_MEDIAN_BYTES_KEY)),
        )


@dataclass(frozen=True)
class Bridge:
    """A commit that bridges a gap in the source's history: from the watermark's snapshot, and why.

    The commit's marker names the snapshot the bridge reached; its rows are
    the net change from ``from_snapshot_id``'s state to that one's.
    """

    reason: str
    from_snapshot_id: int
    common_ancestor: int | None = None
    # ``snapshot``: the from-snapshot's files; ``changelog replay``: it was gone, the changelog's rows.
    base: str = "snapshot"

    def to_summary(self) -> dict[str, str]:
        out = {
            BRIDGE_REASON_KEY: self.reason,
            BRIDGE_FROM_KEY: str(self.from_snapshot_id),
            BRIDGE_BASE_KEY: self.base,
        }
        if self.common_ancestor is not None:
            out[BRIDGE_ANCESTOR_KEY] = str(self.common_ancestor)
        return out

    @classmethod
    def from_summary(cls, summary: Mapping[str, str]) -> Bridge | None:
        start = int_value(summary.get(BRIDGE_FROM_KEY))
        if start is None:
            return None
        return cls(
            reason=summary.get(BRIDGE_REASON_KEY, "?"),
            from_snapshot_id=start,
            common_ancestor=int_value(summary.get(BRIDGE_ANCESTOR_KEY)),
            base=summary.get(BRIDGE_BASE_KEY, "snapshot"),
        )


@dataclass(frozen=True)
class CommitSummary:
    """Everything a CDC commit writes into its sink snapshot's summary; see the module's key table.

    ``figures`` are summed task figures by name (``inserts``, ``carryover_rows``,
    ``shuffle_bytes``, ...), ``seconds`` seconds per phase, ``rows`` the
    conservation rows by stage. ``None`` and empty mean "not recorded".
    """

    source_table: str | None = None
    source_snapshot_id: int | None = None
    source_uuid: str | None = None
    change_ordinal: int | None = None
    operation: str | None = None
    initial_load: bool | None = None
    replace: bool = False
    replaced_snapshot_id: int | None = None
    figures: Mapping[str, int] = field(default_factory=dict)
    seconds: Mapping[str, float] = field(default_factory=dict)
    rows: Mapping[str, int] = field(default_factory=dict)
    skew: Skew | None = None
    bridge: Bridge | None = None

    # -- the figures the CDC view shows (updates: UPDATE_BEFORE/UPDATE_AFTER pairs)

    inserts = _figure("inserts")
    deletes = _figure("deletes")
    updates = _figure("updates")
    carryover_rows = _figure("carryover_rows")
    shuffle_bytes = _figure("shuffle_bytes")

    # -- writing and reading -----------------------------------------------------------------

    def to_summary(self) -> dict[str, str]:
        """The snapshot summary properties, every value a string."""
        out = {figure_key(name): str(value) for name, value in self.figures.items()}
        out.update({SECONDS_PREFIX + phase: str(value) for phase, value in self.seconds.items()})
        if self.skew is not None:
            out.update(self.skew.to_summary())
        out.update({ROWS_PREFIX + stage: str(value) for stage, value in self.rows.items()})
        if self.operation is not None:
            out[OPERATION_KEY] = self.operation
        if self.initial_load is not None:
            out[INITIAL_LOAD_KEY] = "true" if self.initial_load else "false"
        if self.replace:
            out[REPLACE_KEY] = "true"
        if self.replaced_snapshot_id is not None:
            out[REPLACED_SNAPSHOT_ID_KEY] = str(self.replaced_snapshot_id)
        if self.bridge is not None:
            out.update(self.bridge.to_summary())
        marker = {
            SOURCE_TABLE_KEY: self.source_table,
            SOURCE_SNAPSHOT_ID_KEY: self.source_snapshot_id,
            SOURCE_UUID_KEY: self.source_uuid,
            CHANGE_ORDINAL_KEY: self.change_ordinal,
        }
        out.update({key: str(value) for key, value in marker.items() if value is not None})
        return out

    @classmethod
    def from_summary(cls, summary: Mapping[str, str]) -> CommitSummary:
        """The record a snapshot summary holds; keys that are not ``cdc.*`` are ignored."""
        figures: dict[str, int] = {}
        seconds: dict[str, float] = {}
        rows: dict[str, int] = {}
        for key, value in summary.items():
            if key.startswith(SECONDS_PREFIX):
                number: Any = _float(value)
                if number is not None:
                    seconds[key.removeprefix(SECONDS_PREFIX)] = number
            elif key.startswith(ROWS_PREFIX):
                number = int_value(value)
                if number is not None:
                    rows[key.removeprefix(ROWS_PREFIX)] = number
            elif key.startswith(PREFIX) and key not in _NAMED_KEYS and "." not in key[len(PREFIX) :]:
                number = int_value(value)
                if number is not None:
                    figures[key.removeprefix(PREFIX).replace("-", "_")] = number
        initial_load = summary.get(INITIAL_LOAD_KEY)
        return cls(
            source_table=summary.get(SOURCE_TABLE_KEY),
            source_snapshot_id=int_value(summary.get(SOURCE_SNAPSHOT_ID_KEY)),
            source_uuid=summary.get(SOURCE_UUID_KEY),
            change_ordinal=int_value(summary.get(CHANGE_ORDINAL_KEY)),
            operation=summary.get(OPERATION_KEY),
            initial_load=None if initial_load is None else initial_load == "true",
            replace=summary.get(REPLACE_KEY) == "true",
            replaced_snapshot_id=int_value(summary.get(REPLACED_SNAPSHOT_ID_KEY)),
            figures=figures,
            seconds=seconds,
            rows=rows,
            skew=Skew.from_summary(summary),
            bridge=Bridge.from_summary(summary),
        )

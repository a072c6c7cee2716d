"""What a mirror has not applied yet, read from the changelog (sink) table.

**Marks.** The changelog's state is one metadata version of the sink table:
its current snapshot and the watermark properties committed with it
(:mod:`iceberg_cdc.sink.commit` writes both in one commit). A mirror's
watermark is that pair as a :class:`~.net_changes.ChangelogMark`; the mirror
then holds exactly the source's rows at the mark's source snapshot.

**Pending rows.** Changelog snapshots after the mirror's mark are the rows
with ``_change_ordinal`` in ``(mark.ordinal, through.ordinal]`` at the
changelog's current snapshot: one scan, pruned by the files' ordinal bounds
(every changelog file holds one source snapshot), however many snapshots are
pending. Source snapshots that changed nothing (carryover only, ``replace``)
move the changelog's watermark without rows: the mirror's mark moves too.

**Reprocessed snapshots.** A manual reprocess replaces one source snapshot's
rows in the changelog (a delete snapshot marked ``cdc.replaced-snapshot-id``,
then an append marked ``cdc.replace``). When it replaced a snapshot the mirror
had already applied, its old rows (at the mirror's changelog snapshot) and its
new rows are compared as multisets: equal -- the usual case, a reprocess of
correct output -- means nothing is re-applied. Different rows mean the mirror
was built from rows that are now corrected: every key of the old or new rows
is recomputed from the whole changelog up to the target mark (its last version
there, or removed if it has none).

**History.** The mirror's changelog snapshot must still be in the changelog's
current history; if the changelog was rolled back, dropped and recreated, or
the snapshot expired while a reprocess needs it, :class:`MirrorHistoryError`
names the rebuild command.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import (
    AlwaysTrue,
    And,
    BooleanExpression,
    EqualTo,
    GreaterThan,
    In,
    LessThanOrEqual,
)
from pyiceberg.table import Table
from pyiceberg.table.snapshots import ancestors_of

from iceberg_cdc.changelog.merge import group_ids
from iceberg_cdc.errors import MirrorHistoryError
from iceberg_cdc.mirror.net_changes import ChangelogMark, NetChanges, net_changes
from iceberg_cdc.sink.schema import CHANGE_COLUMNS, CHANGE_ORDINAL, COMMIT_SNAPSHOT_ID
from iceberg_cdc.sink.summary import CommitSummary
from iceberg_cdc.sink.table import read_watermark, summary_properties

NO_SNAPSHOT = 0  # a changelog that has a watermark but no snapshot yet (nothing but skipped snapshots)


def changelog_mark(changelog: Table, source: str) -> ChangelogMark | None:
    """The changelog's state as a mark (its current snapshot and watermark), or None before its first run."""
    watermark = read_watermark(changelog, source)
    if watermark is None:
        return None
    head = changelog.current_snapshot()
    return ChangelogMark(
        head.snapshot_id if head is not None else NO_SNAPSHOT, watermark.snapshot_id, watermark.ordinal
    )


@dataclass(frozen=True)
class Pending:
    """What lies between a mirror's mark and the changelog's current state."""

    base: ChangelogMark | None
    through: ChangelogMark
    snapshots: int  # source snapshots after the base (each one ordinal)
    reprocessed: list[int] = field(default_factory=list)  # applied source snapshots replaced since the base

    @property
    def caught_up(self) -> bool:
        return self.base == self.through


def rebuild_hint(source: str, mirror_name: str) -> str:
    return (
        f"rebuild the mirror: iceberg-cdc rebuild --config <cdc.yaml> --table {source} "
        f"--mirror {mirror_name} (from the changelog, or --from source)"
    )


def pending(
    changelog: Table, source: str, base: ChangelogMark | None, mirror_name: str = "?"
) -> Pending | None:
    """The changelog's state after ``base``, or None when the changelog has no watermark yet."""
    through = changelog_mark(changelog, source)
    if through is None:
        if base is not None:
            raise MirrorHistoryError(
                f"the mirror is at source snapshot {base.source_snapshot_id} but the changelog of {source} has no "
                f"watermark: it was dropped and recreated; {rebuild_hint(source, mirror_name)}"
            )
        return None
    if base is None:
        return Pending(None, through, through.ordinal)
    if base.ordinal > through.ordinal:
        raise MirrorHistoryError(
            f"the mirror is at ordinal {base.ordinal} (source snapshot {base.source_snapshot_id}), past the "
            f"changelog's watermark at ordinal {through.ordinal}: the changelog was reset; "
            f"{rebuild_hint(source, mirror_name)}"
        )
    replaced = _replaced_since(changelog, source, base, mirror_name)
    return Pending(base, through, through.ordinal - base.ordinal, replaced)


def _replaced_since(changelog: Table, source: str, base: ChangelogMark, mirror_name: str) -> list[int]:
    """Source snapshots whose changelog rows were replaced after the base changelog snapshot, oldest first."""
    head = changelog.current_snapshot()
    head_id = head.snapshot_id if head is not None else NO_SNAPSHOT
    if head_id == base.changelog_snapshot_id:
        return []
    replaced: list[int] = []  # newest first, as the history is walked
    for snapshot in ancestors_of(head, changelog.metadata):
        if snapshot.snapshot_id == base.changelog_snapshot_id:
            return list(dict.fromkeys(reversed(replaced)))
        record = CommitSummary.from_summary(summary_properties(snapshot))
        if record.source_table == source and record.replaced_snapshot_id is not None:
            replaced.append(record.replaced_snapshot_id)
    if base.changelog_snapshot_id == NO_SNAPSHOT:
        return list(dict.fromkeys(reversed(replaced)))
    raise MirrorHistoryError(
        f"the changelog snapshot {base.changelog_snapshot_id} the mirror last applied is not in the current "
        f"history of the changelog of {source} (rolled back, expired, or the table was recreated), so what "
        f"changed since cannot be known; {rebuild_hint(source, mirror_name)}"
    )


def _scan(
    changelog: Table, snapshot_id: int, row_filter: BooleanExpression, columns: Sequence[str]
) -> pa.Table:
    """``columns`` (the changelog's current names) of the rows at ``snapshot_id``, in the current types.

    pyiceberg reads data files by field id, so rows written before a rename
    come back under the new name -- but a scan *at an older snapshot* uses
    that snapshot's schema, where the column still has its old name (and its
    narrower type). Those columns are selected by id under their old names,
    then renamed and cast to the current schema; columns added since are null.
    """
    current = changelog.schema()
    wanted = pa.schema([current.as_arrow().field(c) for c in columns])
    if snapshot_id == NO_SNAPSHOT:
        return wanted.empty_table()
    snapshot = changelog.snapshot_by_id(snapshot_id)
    at = changelog.schemas().get(snapshot.schema_id) if snapshot and snapshot.schema_id is not None else None
    if at is None or at.schema_id == current.schema_id:
        return changelog.scan(
            row_filter=row_filter, snapshot_id=snapshot_id, selected_fields=tuple(columns)
        ).to_arrow()
    old_names = {c: at.find_column_name(current.find_field(c).field_id) for c in columns}
    present = [old for old in old_names.values() if old is not None]
    rows = changelog.scan(
        row_filter=row_filter, snapshot_id=snapshot_id, selected_fields=tuple(present)
    ).to_arrow()
    arrays = [
        rows.column(old).cast(wanted.field(c).type)
        if old is not None
        else pa.nulls(rows.num_rows, wanted.field(c).type)
        for c, old in old_names.items()
    ]
    return pa.Table.from_arrays(arrays, schema=wanted)


def _same_multiset(a: pa.Table, b: pa.Table) -> bool:
    if a.num_rows != b.num_rows:
        return False
    if a.num_rows == 0:
        return True
    both = pa.concat_tables([a, b.select(a.column_names).cast(a.schema)]).combine_chunks()
    gid, groups = group_ids([both.column(i) for i in range(both.num_columns)])
    n = a.num_rows
    return bool(
        np.array_equal(np.bincount(gid[:n], minlength=groups), np.bincount(gid[n:], minlength=groups))
    )


def _key_filter(keys: pa.Table) -> BooleanExpression:
    """A scan filter for rows whose key is in ``keys`` (exact for one column, pruning only otherwise)."""
    if keys.num_columns == 1 and keys.num_rows:
        return In(keys.column_names[0], pc.unique(keys.column(0)).drop_null().to_pylist())
    return AlwaysTrue()


def read_net_changes(
    changelog: Table,
    source: str,
    pend: Pending,
    key_columns: Sequence[str],
    columns: Sequence[str],
    mirror_name: str = "?",
) -> NetChanges:
    """The net changes that take a mirror from ``pend.base`` to ``pend.through`` (see the module doc)."""
    keys = list(key_columns)
    wanted = [*columns, *[c for c in CHANGE_COLUMNS if c not in columns]]
    through, base = pend.through, pend.base
    lower = base.ordinal if base is not None else None
    window: BooleanExpression = LessThanOrEqual(CHANGE_ORDINAL, through.ordinal)
    if lower is not None:
        window = And(GreaterThan(CHANGE_ORDINAL, lower), window)
    rows = _scan(changelog, through.changelog_snapshot_id, window, wanted)
    affected = _corrected_keys(changelog, source, pend, keys, list(columns), mirror_name)
    if affected is not None and affected.num_rows:
        again = _scan(
            changelog,
            through.changelog_snapshot_id,
            And(LessThanOrEqual(CHANGE_ORDINAL, through.ordinal), _key_filter(affected)),
            wanted,
        )
        again = again.join(affected, keys, join_type="left semi")
        rows = pa.concat_tables(
            [rows.join(affected, keys, join_type="left anti"), again.select(rows.column_names)]
        )
    upserts, deletes = net_changes(rows, keys)
    if affected is not None and affected.num_rows:
        gone = affected.join(upserts.select(keys), keys, join_type="left anti")
        gone = gone.join(deletes, keys, join_type="left anti")
        deletes = pa.concat_tables([deletes, gone.select(keys).cast(deletes.schema)])
    return NetChanges(upserts.select(list(columns)), deletes, tuple(keys), through)


def _corrected_keys(
    changelog: Table, source: str, pend: Pending, keys: list[str], columns: list[str], mirror_name: str
) -> pa.Table | None:
    """Keys of applied snapshots whose rows a reprocess changed (None when every reprocess was a no-op)."""
    base = pend.base
    if base is None or not pend.reprocessed:
        return None
    compared = [*columns, *CHANGE_COLUMNS]
    found: list[pa.Table] = []
    for snapshot_id in pend.reprocessed:
        old = _scan(changelog, base.changelog_snapshot_id, EqualTo(COMMIT_SNAPSHOT_ID, snapshot_id), compared)
        if old.num_rows == 0 and not _known(changelog, base.changelog_snapshot_id):
            raise MirrorHistoryError(
                f"source snapshot {snapshot_id} of {source} was reprocessed, but the changelog snapshot "
                f"{base.changelog_snapshot_id} the mirror was built from has expired, so its old rows cannot be "
                f"compared; {rebuild_hint(source, mirror_name)}"
            )
        new = _scan(
            changelog,
            pend.through.changelog_snapshot_id,
            And(EqualTo(COMMIT_SNAPSHOT_ID, snapshot_id), LessThanOrEqual(CHANGE_ORDINAL, base.ordinal)),
            compared,
        )
        if not _same_multiset(old, new):
            found.append(pa.concat_tables([old.select(keys), new.select(keys).cast(old.select(keys).schema)]))
    if not found:
        return None
    every = pa.concat_tables(found).combine_chunks()
    return every.group_by(keys).aggregate([])


def _known(changelog: Table, snapshot_id: int) -> bool:
    return snapshot_id == NO_SNAPSHOT or changelog.snapshot_by_id(snapshot_id) is not None

"""Turn the DELETE/INSERT rows of one snapshot's read range into true changes.

The semantics follow Iceberg Spark's ``create_changelog_view`` with
``compute_updates`` (``RemoveCarryoverIterator`` then ``ComputeUpdateIterator``):

1. **Carryover removal by multiplicity.** A DELETE and an INSERT of identical
   rows (every column equal, null equal to null, nested values by value,
   floats as Spark compares them: every NaN equals every NaN, ``-0.0`` differs
   from ``0.0``; see :mod:`iceberg_cdc.canonical`) cancel one for one:
   2 D + 2 I -> nothing, 2 D + 1 I -> one DELETE, 3 D + 4 I -> one INSERT.
2. **Update merge.** With identifier columns, a remaining DELETE and INSERT of
   one key become UPDATE_BEFORE + UPDATE_AFTER. A key left with two DELETEs or
   two INSERTs cannot be paired: that fails with :class:`AmbiguousUpdateError`
   naming the key, unless ``emit_unpaired`` is set, in which case its rows are
   emitted as plain DELETEs and INSERTs.
3. Without identifier columns the whole row is the key: only DELETE / INSERT.

Everything is computed a column at a time: rows get dense group ids from
Arrow's hash kernel (``dictionary_encode``), counts come from ``bincount``.
The common case -- a key with one DELETE and one INSERT, as every rewritten or
updated row of a copy-on-write snapshot is -- needs no full-row grouping: the
two rows are compared column by column, equal means carryover. Only keys with
several rows of one kind go through full-row grouping.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from iceberg_cdc import canonical
from iceberg_cdc.changelog.change_types import CHANGE_TYPE_COLUMN, ChangeType
from iceberg_cdc.errors import AmbiguousUpdateError
from iceberg_cdc.shuffle.partitioner import key_columns
from iceberg_cdc.shuffle.rows import OP_COLUMN, Op

_CHANGE_NAMES = pa.array([t.name for t in ChangeType], pa.string())


@dataclass
class MergeStats:
    input_rows: int = 0
    deletes: int = 0
    inserts: int = 0
    updates: int = 0  # pairs: each is one UPDATE_BEFORE and one UPDATE_AFTER row
    carryover_rows: int = 0  # input rows that cancelled out

    def add(self, other: MergeStats) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


def group_ids(columns: Sequence[pa.Array]) -> tuple[np.ndarray, int]:
    """Dense ids (int64) such that rows get equal ids iff their tuples are equal.

    Null equals null; each column is first put into its comparable form.
    """
    gid: np.ndarray | None = None
    count = 1
    for column in columns:
        encoded = pc.dictionary_encode(canonical.comparable(column), null_encoding="encode")
        ids = encoded.indices.to_numpy().astype(np.int64)
        size = len(encoded.dictionary)
        if gid is None:
            gid, count = ids, size
        else:
            combined = pc.dictionary_encode(pa.array(gid * size + ids))
            gid, count = combined.indices.to_numpy().astype(np.int64), len(combined.dictionary)
    assert gid is not None
    return gid, count


def rows_equal(table: pa.Table, names: Sequence[str], left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """For each i, whether rows ``left[i]`` and ``right[i]`` agree on every column in ``names``."""
    equal = np.ones(len(left), dtype=bool)
    left_idx, right_idx = pa.array(left), pa.array(right)
    for name in names:
        if not equal.any():
            break
        column = table.column(name)
        a = canonical.comparable(column.take(left_idx))
        b = canonical.comparable(column.take(right_idx))
        same = pc.fill_null(pc.equal(a, b), False)
        if a.null_count or b.null_count:
            same = pc.or_(same, pc.and_(a.is_null(), b.is_null()))
        equal &= same.to_numpy(zero_copy_only=False)
    return equal


def _counts(gids: np.ndarray, inserts: np.ndarray, groups: int) -> tuple[np.ndarray, np.ndarray]:
    return (
        np.bincount(gids[~inserts], minlength=groups),
        np.bincount(gids[inserts], minlength=groups),
    )


def _one_row(gids: np.ndarray, rows: np.ndarray, groups: int) -> np.ndarray:
    """Some row of each group (-1 for groups without rows); exact for one-row groups."""
    chosen = np.full(groups, -1, dtype=np.int64)
    chosen[gids] = rows
    return chosen


def _describe_key(names: Sequence[str], columns: Sequence[pa.Array | pa.ChunkedArray], row: int) -> str:
    values = [f"{name}={column[row].as_py()!r}" for name, column in zip(names, columns, strict=True)]
    return ", ".join(values)


class _Output:
    """Accumulates (row index, change type) pairs in output order."""

    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []
        self.types: list[np.ndarray] = []

    def add(self, rows: np.ndarray, change: ChangeType) -> None:
        if len(rows):
            self.rows.append(rows.astype(np.int64))
            self.types.append(np.full(len(rows), int(change), dtype=np.int8))

    def add_updates(self, before: np.ndarray, after: np.ndarray) -> None:
        if len(before):
            self.rows.append(np.column_stack([before, after]).ravel().astype(np.int64))
            pair = np.array([ChangeType.UPDATE_BEFORE, ChangeType.UPDATE_AFTER], dtype=np.int8)
            self.types.append(np.tile(pair, len(before)))

    def build(self, data: pa.Table) -> pa.Table:
        rows = np.concatenate(self.rows) if self.rows else np.zeros(0, dtype=np.int64)
        types = np.concatenate(self.types) if self.types else np.zeros(0, dtype=np.int8)
        result = data.take(pa.array(rows))
        return result.append_column(
            pa.field(CHANGE_TYPE_COLUMN, pa.string(), nullable=False), _CHANGE_NAMES.take(pa.array(types))
        )


def _cancel_carryover(data: pa.Table, rows: np.ndarray, inserts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Carryover removal by multiplicity over ``rows``: the rows left and whether each inserts."""
    sub = data.take(pa.array(rows))
    gids, groups = group_ids([sub.column(i) for i in range(sub.num_columns)])
    deletes, adds = _counts(gids, inserts, groups)
    net = adds - deletes
    representative = _one_row(gids, rows, groups)
    grow, shrink = np.flatnonzero(net > 0), np.flatnonzero(net < 0)
    kept_inserts = np.repeat(representative[grow], net[grow])
    kept_deletes = np.repeat(representative[shrink], -net[shrink])
    kept = np.concatenate([kept_deletes, kept_inserts])
    kinds = np.concatenate([np.zeros(len(kept_deletes), bool), np.ones(len(kept_inserts), bool)])
    return kept, kinds


def merge_changes(
    table: pa.Table,
    identifier_columns: Sequence[str] | None = None,
    *,
    emit_unpaired: bool = False,
    where: str = "",
) -> tuple[pa.Table, MergeStats]:
    """Compute the changes of one read range.

    ``table`` holds every shuffled row of the range: the data columns and the
    ``__cdc_op`` tag. ``identifier_columns`` are top-level column names or
    dotted paths to struct fields (``k.a``). Returns the data columns plus
    ``_change_type``: DELETEs first, then UPDATE_BEFORE/UPDATE_AFTER pairs
    side by side, then INSERTs.

    ``where`` says what the rows are, e.g. ``"table shop.orders, snapshot 123"``;
    errors start with it, because a read task only sees rows and an operator
    needs to know which table and snapshot to look at.
    """
    data_names = [name for name in table.schema.names if name != OP_COLUMN]
    data = table.select(data_names).combine_chunks()
    stats = MergeStats(input_rows=table.num_rows)
    out = _Output()
    if table.num_rows == 0:
        return out.build(data), stats
    inserts = table.column(OP_COLUMN).to_numpy() == Op.INSERT
    all_rows = np.arange(table.num_rows, dtype=np.int64)

    if not identifier_columns:
        kept, kinds = _cancel_carryover(data, all_rows, inserts)
        out.add(kept[~kinds], ChangeType.DELETE)
        out.add(kept[kinds], ChangeType.INSERT)
        stats.deletes, stats.inserts = int((~kinds).sum()), int(kinds.sum())
        stats.carryover_rows = table.num_rows - len(kept)
        return out.build(data), stats

    keys = key_columns(data, identifier_columns)  # resolved as the partitioner resolves them
    key_gids, groups = group_ids(keys)
    deletes, adds = _counts(key_gids, inserts, groups)
    simple = (deletes <= 1) & (adds <= 1)

    # Keys with at most one DELETE and one INSERT: the common case, no full-row grouping.
    delete_row = _one_row(key_gids[~inserts], all_rows[~inserts], groups)
    insert_row = _one_row(key_gids[inserts], all_rows[inserts], groups)
    pairs = np.flatnonzero(simple & (deletes == 1) & (adds == 1))
    same = rows_equal(data, data_names, delete_row[pairs], insert_row[pairs])
    updates = pairs[~same]
    out.add(delete_row[simple & (deletes == 1) & (adds == 0)], ChangeType.DELETE)
    out.add_updates(delete_row[updates], insert_row[updates])
    out.add(insert_row[simple & (deletes == 0) & (adds == 1)], ChangeType.INSERT)
    stats.carryover_rows = 2 * int(same.sum())
    stats.updates = len(updates)
    stats.deletes = int((simple & (deletes == 1) & (adds == 0)).sum())
    stats.inserts = int((simple & (deletes == 0) & (adds == 1)).sum())

    # Keys with several rows of one kind: cancel carryover on whole rows, then pair what is left.
    if not simple.all():
        rows = np.flatnonzero(~simple[key_gids])
        kept, kinds = _cancel_carryover(data, rows, inserts[rows])
        stats.carryover_rows += len(rows) - len(kept)
        kept_gids = key_gids[kept]
        left_deletes, left_adds = _counts(kept_gids, kinds, groups)
        ambiguous = (left_deletes > 1) | (left_adds > 1)
        if ambiguous.any():
            if not emit_unpaired:
                group = int(np.flatnonzero(ambiguous)[0])
                row = int(kept[np.flatnonzero(kept_gids == group)[0]])
                raise AmbiguousUpdateError(
                    f"{where + ': ' if where else ''}cannot pair updates for identifier "
                    f"({_describe_key(identifier_columns, keys, row)}): "
                    f"after carryover removal it has {left_deletes[group]} DELETE and "
                    f"{left_adds[group]} INSERT rows in this snapshot "
                    f"({int(ambiguous.sum())} such key(s) in this read range). The identifier columns "
                    f"{list(identifier_columns)} are not unique in the source table: fix the data or the "
                    "configured identifier_columns, or set `duplicate_keys: emit_unpaired` for the "
                    "table to emit such rows as plain DELETE/INSERT."
                )
            loose = ambiguous[kept_gids]
            out.add(kept[loose & ~kinds], ChangeType.DELETE)
            out.add(kept[loose & kinds], ChangeType.INSERT)
            stats.deletes += int((loose & ~kinds).sum())
            stats.inserts += int((loose & kinds).sum())
            kept, kinds, kept_gids = kept[~loose], kinds[~loose], kept_gids[~loose]
        left_deletes, left_adds = _counts(kept_gids, kinds, groups)
        before = _one_row(kept_gids[~kinds], kept[~kinds], groups)
        after = _one_row(kept_gids[kinds], kept[kinds], groups)
        paired = np.flatnonzero((left_deletes == 1) & (left_adds == 1))
        lone_deletes = np.flatnonzero((left_deletes == 1) & (left_adds == 0))
        lone_inserts = np.flatnonzero((left_deletes == 0) & (left_adds == 1))
        out.add(before[lone_deletes], ChangeType.DELETE)
        out.add_updates(before[paired], after[paired])
        out.add(after[lone_inserts], ChangeType.INSERT)
        stats.deletes += len(lone_deletes)
        stats.inserts += len(lone_inserts)
        stats.updates += len(paired)
    return out.build(data), stats

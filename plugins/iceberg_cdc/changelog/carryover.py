"""Carryover cancellation before the shuffle: identical removed and added rows cancel one for one.

A copy-on-write rewrite copies most rows of the files it replaces unchanged
into new files of the same partition. Such a row is a DELETE (from the removed
file) and an INSERT (from the added file) of one identical row: carryover. The
read side's merge (:mod:`iceberg_cdc.changelog.merge`) cancels it by
multiplicity; this module applies the *same* multiset rule earlier, in a write
task holding both sides of one partition, so carryover never reaches the
shuffle. Cancelling any DELETE/INSERT pair of identical rows anywhere keeps
each distinct row's net count (INSERTs minus DELETEs) and therefore the result
of rule 1 of the design notes; what is not cancelled here is cancelled after
the shuffle, so cancelling less is never wrong -- cancelling one copy too many
is, and the property tests check exactly that.

Equality is exact, on the comparable forms the merge uses
(:mod:`iceberg_cdc.canonical`: null equals null, every NaN equals every NaN,
``-0.0`` differs from ``0.0``, nested values by value). A hash only *finds
candidates*: rows are grouped by their identifier columns (or, without any,
by a hash of the whole row), and a candidate DELETE/INSERT pair cancels only
when every column compares equal. Groups holding several rows of one kind
(duplicate keys, whole-row tables with duplicate rows) cancel by exact
full-row grouping with counts, as the merge does.

**Row lineage** (format v3): a row a writer copied unchanged keeps its
``_row_id`` and ``_last_updated_sequence_number``, and a modified row gets a
new sequence number (spec, "Row Lineage"). A DELETE and an INSERT with equal
lineage are therefore carryover without comparing a value; rows whose lineage
is unknown (files written before the upgrade, rows an equality delete
replaced) go through the value comparison. Without identifier columns a
known ``_row_id`` is also the candidate key (a modified row meets its old
version by id, then compares by value), so whole-row tables need no row hash
for such rows. Every carried-over or modified row is found either way; the
shuffle key stays the identifier columns (or the whole row), so identical
rows with different ids still meet after the shuffle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from iceberg_cdc.changelog.merge import group_ids, rows_equal
from iceberg_cdc.shuffle.partitioner import combined_hash, key_columns


@dataclass(frozen=True)
class Lineage:
    """Row lineage of each row: ``_row_id`` and ``_last_updated_sequence_number`` (int64, nullable).

    Nulls mean unknown (a file without lineage); such rows are compared by value.
    """

    row_id: pa.Array | pa.ChunkedArray
    sequence_number: pa.Array | pa.ChunkedArray

    def known(self) -> np.ndarray:
        return _valid(self.row_id) & _valid(self.sequence_number)


def _valid(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    if array.null_count == 0:
        return np.ones(len(array), dtype=bool)
    return np.asarray(array.is_valid())


def _ints(array: pa.Array | pa.ChunkedArray, rows: np.ndarray) -> np.ndarray:
    taken = array.take(pa.array(rows))
    return np.asarray(taken.fill_null(0).to_numpy(), dtype=np.int64) if len(rows) else np.zeros(0, np.int64)


@dataclass(frozen=True)
class Cancellation:
    """What survived: ``kept`` row indices (ascending), and how many rows cancelled, by which rule."""

    kept: np.ndarray
    by_lineage: int  # rows (both sides) cancelled because their lineage matched
    by_value: int  # rows (both sides) cancelled because every column compared equal

    @property
    def cancelled(self) -> int:
        return self.by_lineage + self.by_value


def _integer_key(keys: Sequence[pa.Array | pa.ChunkedArray]) -> np.ndarray | None:
    """The one key column as int64 when it is a plain integer column without nulls, else None."""
    if len(keys) != 1:
        return None
    column = keys[0]
    typ = column.type
    if (
        not (pa.types.is_integer(typ) and typ.bit_width <= 64 and not pa.types.is_uint64(typ))
        or column.null_count
    ):
        return None
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    if not chunks:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.asarray(c.to_numpy(), dtype=np.int64) for c in chunks])


@dataclass(frozen=True)
class Pairs:
    """Rows grouped by key: keys with one DELETE and one INSERT, and rows of keys that need counting.

    ``delete_rows[k]`` and ``insert_rows[k]`` are the two rows of the k-th
    key with exactly one of each; ``several`` (ascending) are the rows of
    keys with both kinds and more than one of some kind. Positions index the
    keys given to :func:`candidate_pairs`.
    """

    delete_rows: np.ndarray
    insert_rows: np.ndarray
    several: np.ndarray


def candidate_pairs(keys: Sequence[pa.Array | pa.ChunkedArray], inserts: np.ndarray) -> Pairs:
    """Group rows by their key tuples (null equals null) into :class:`Pairs`.

    One integer column without nulls (an ``id``, a row id, a row hash) is
    grouped by one stable sort, the pairs read off adjacent sorted rows: linear
    on the sorted runs copy-on-write files usually are, and a fifth of the
    cancellation's time less than dense group ids and counts. Anything else goes
    through :func:`~iceberg_cdc.changelog.merge.group_ids`.
    """
    values = _integer_key(keys)
    if values is None:
        return _grouped_pairs(*group_ids(keys), inserts)
    n = len(values)
    if not n:
        empty = np.zeros(0, dtype=np.int64)
        return Pairs(empty, empty, empty)
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts = np.empty(n, dtype=bool)
    starts[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=starts[1:])
    first = np.flatnonzero(starts)
    sizes = np.diff(np.append(first, n))
    adds = np.add.reduceat(inserts[order].astype(np.int64), first)
    pair = (sizes == 2) & (adds == 1)
    a, b = order[first[pair]], order[first[pair] + 1]
    a_inserts = inserts[a]
    several = (adds >= 1) & (adds < sizes) & ~pair
    members = np.sort(order[np.repeat(several, sizes)])
    return Pairs(np.where(a_inserts, b, a), np.where(a_inserts, a, b), members)


def _grouped_pairs(gids: np.ndarray, groups: int, inserts: np.ndarray) -> Pairs:
    """:class:`Pairs` from dense group ids, by counting each group's DELETEs and INSERTs."""
    deletes = np.bincount(gids[~inserts], minlength=groups)
    adds = np.bincount(gids[inserts], minlength=groups)
    positions = np.arange(len(gids), dtype=np.int64)
    delete_row = np.full(groups, -1, dtype=np.int64)
    insert_row = np.full(groups, -1, dtype=np.int64)
    delete_row[gids[~inserts]] = positions[~inserts]
    insert_row[gids[inserts]] = positions[inserts]
    single = (deletes == 1) & (adds == 1)
    several = (deletes >= 1) & (adds >= 1) & ~single
    return Pairs(delete_row[single], insert_row[single], np.flatnonzero(several[gids]))


def cancel_by_multiplicity(data: pa.Table, rows: np.ndarray, inserts: np.ndarray) -> np.ndarray:
    """Which of ``rows`` cancel: per distinct full row, ``min(DELETEs, INSERTs)`` copies of each side.

    Exact full-row grouping (:func:`~iceberg_cdc.changelog.merge.group_ids`
    over every column's comparable form); within a distinct row, the first
    copies of each side (in ``rows`` order) are the ones cancelled.
    """
    if not len(rows):
        return np.zeros(0, dtype=bool)
    sub = data.take(pa.array(rows))
    gids, groups = group_ids([sub.column(i) for i in range(sub.num_columns)])
    cancels = np.minimum(
        np.bincount(gids[~inserts], minlength=groups), np.bincount(gids[inserts], minlength=groups)
    )
    order = np.lexsort((np.arange(len(rows)), inserts, gids))
    run_key = gids[order] * 2 + inserts[order]
    starts = np.flatnonzero(np.r_[True, run_key[1:] != run_key[:-1]])
    rank = np.arange(len(rows)) - np.repeat(starts, np.diff(np.r_[starts, len(rows)]))
    cancelled = np.zeros(len(rows), dtype=bool)
    cancelled[order] = rank < cancels[gids[order]]
    return cancelled


def _candidate_keys(
    data: pa.Table,
    rows: np.ndarray,
    identifier_columns: Sequence[str] | None,
    lineage: Lineage | None,
) -> tuple[list[pa.Array | pa.ChunkedArray], list[str]]:
    """The columns rows are paired on, and the top-level columns they make equal (not compared again).

    Identifier columns when there are any; otherwise a known ``_row_id``, else
    a 32-bit hash of the whole row (only to find candidates: a pair still
    compares every column).
    """
    sub = data.take(pa.array(rows)) if len(rows) != data.num_rows else data
    if identifier_columns:
        equal = [name for name in identifier_columns if name in sub.schema.names]
        return key_columns(sub, identifier_columns), equal
    hashes = combined_hash([sub.column(i) for i in range(sub.num_columns)]).astype(np.int64)
    if lineage is None:
        return [pa.array(hashes)], []
    known = _valid(lineage.row_id.take(pa.array(rows)))
    ids = _ints(lineage.row_id, rows)
    # Two key spaces: (0, row id) for rows with lineage, (1, row hash) for the others.
    return [pa.array((~known).astype(np.int8)), pa.array(np.where(known, ids, hashes))], []


def cancel_carryover(
    data: pa.Table,
    inserts: np.ndarray,
    identifier_columns: Sequence[str] | None = None,
    lineage: Lineage | None = None,
) -> Cancellation:
    """Cancel identical DELETE/INSERT rows of ``data`` by multiplicity; return the rows that stay.

    ``data`` holds only the table's columns (no operation tag);
    ``inserts[i]`` says whether row i is an INSERT. ``identifier_columns``
    choose the candidate pairs (top-level names or dotted paths, as the
    partitioner resolves them); ``None`` pairs by the whole row.
    """
    n = data.num_rows
    inserts = np.asarray(inserts, dtype=bool)
    if len(inserts) != n:
        raise ValueError(f"{len(inserts)} operation flags for {n} rows")
    alive = np.ones(n, dtype=bool)
    if n == 0 or inserts.all() or not inserts.any():
        return Cancellation(np.flatnonzero(alive), 0, 0)

    by_lineage = 0
    if lineage is not None:
        known = np.flatnonzero(lineage.known())
        if len(known):
            # Pair by _row_id (one DELETE and one INSERT of an id: the row moved), then the pair is
            # carryover when the sequence numbers are equal too (the writer did not modify it).
            row_ids, sequence = _ints(lineage.row_id, known), _ints(lineage.sequence_number, known)
            pairs = candidate_pairs([pa.array(row_ids)], inserts[known])
            same = sequence[pairs.delete_rows] == sequence[pairs.insert_rows]
            matched = known[np.concatenate([pairs.delete_rows[same], pairs.insert_rows[same]])]
            alive[matched] = False
            by_lineage = len(matched)

    rows = np.flatnonzero(alive)
    row_inserts = inserts[rows]
    if not len(rows) or row_inserts.all() or not row_inserts.any():
        return Cancellation(rows, by_lineage, 0)
    keys, equal_columns = _candidate_keys(data, rows, identifier_columns, lineage)
    pairs = candidate_pairs(keys, row_inserts)
    compare = [name for name in data.schema.names if name not in equal_columns]
    same = rows_equal(data, compare, rows[pairs.delete_rows], rows[pairs.insert_rows])
    alive[rows[pairs.delete_rows[same]]] = False
    alive[rows[pairs.insert_rows[same]]] = False
    by_value = 2 * int(same.sum())

    if len(pairs.several):
        members = pairs.several
        cancelled = cancel_by_multiplicity(data, rows[members], row_inserts[members])
        alive[rows[members[cancelled]]] = False
        by_value += int(cancelled.sum())
    return Cancellation(np.flatnonzero(alive), by_lineage, by_value)

"""Apply merge-on-read delete files to a data file's rows, batch by batch, on executors.

The planner (:mod:`iceberg_cdc.source.changes`) hands each input file two sets
of delete files: ``deletes`` (a row they name is not live) and, for a data
file the snapshot kept, ``require`` (a row must be named by one of them to be
part of the change: the rows the snapshot's new deletes removed). This module
turns both into one boolean mask per batch:

    emit = not named_by(deletes) and (named_by(require) if require else True)

* **Position deletes** name ``(file_path, pos)`` pairs. A position delete file
  often covers many data files (Spark writes one per task and partition), so
  each is read once per task (columns ``file_path`` and ``pos`` only) and its
  positions grouped by data file in one Arrow ``group_by``; a batch's
  positions are matched with one ``searchsorted`` over the sorted positions.
* **Deletion vectors** (format v3) name positions of one data file; each is
  one ranged read of its blob (:mod:`iceberg_cdc.source.deletion_vectors`)
  and is matched like a position delete file.
* **Equality deletes** name rows by the values of their ``equality_ids``
  columns. The delete rows are read once per task, projected by field id onto
  the snapshot's schema like the data (so a renamed or widened key column
  still matches), and a data row matches when its key tuple equals one of
  them, null equal to null and floats by :mod:`iceberg_cdc.canonical`'s
  comparable form (NaN equals NaN, -0.0 differs from 0.0: the equality of
  Iceberg's Java readers). Delete files with the same key columns are matched
  together: one ``is_in`` (one key column) or one dense-id pass (several).

This is the join Iceberg's own readers do (a delete set per task); the delete
files of one data file's scope are small next to its data in every workload
that keeps up with compaction, and each task loads only the files its inputs
name, pruned by partition and column bounds at planning.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.schema import Schema

from iceberg_cdc import canonical
from iceberg_cdc.changelog.merge import group_ids
from iceberg_cdc.errors import UnsupportedSnapshotError
from iceberg_cdc.pyiceberg_internals.arrow_schema import select_columns
from iceberg_cdc.source.deletes import DeleteFileRef
from iceberg_cdc.source.deletion_vectors import read_deletion_vector
from iceberg_cdc.source.reading import output_schema, read_data_file

_EMPTY = np.zeros(0, dtype=np.int64)


def _column_names(schema: Schema, field_ids: Sequence[int], delete_path: str) -> list[str]:
    names = []
    for field_id in field_ids:
        name = schema.find_column_name(field_id)
        if name is None:
            raise UnsupportedSnapshotError(
                f"equality delete file {delete_path} matches on field id {field_id}, which the "
                "snapshot's schema no longer has (the column was dropped): its rows cannot be "
                "matched. Compact the table (rewrite_data_files) so the delete file no longer applies."
            )
        names.append(name)
    return names


@dataclass
class _EqualitySet:
    """The keys of the equality delete files that share one tuple of key columns."""

    names: list[str]
    keys: list[pa.Array]  # one comparable column per key column

    def matches(self, batch: pa.RecordBatch) -> np.ndarray:
        n = batch.num_rows
        if not len(self.keys[0]):
            return np.zeros(n, dtype=bool)
        columns = [canonical.comparable(canonical.column_at(batch, name)) for name in self.names]
        if len(columns) == 1:
            found = pc.is_in(columns[0], value_set=self.keys[0], skip_nulls=False)
            return found.to_numpy(zero_copy_only=False).astype(bool, copy=False)
        gids, _ = group_ids(
            [pa.concat_arrays([key, column]) for key, column in zip(self.keys, columns, strict=True)]
        )
        known = len(self.keys[0])
        return np.isin(gids[known:], gids[:known])


class DeleteLoader:
    """Reads each delete file at most once per task and keeps what it holds."""

    def __init__(self, io: FileIO, schema: Schema, refs: Mapping[str, DeleteFileRef]) -> None:
        self._io = io
        self._schema = schema
        self._refs = refs
        self._positions: dict[str, dict[str, np.ndarray]] = {}
        self._equality: dict[tuple[str, ...], _EqualitySet] = {}

    def ref(self, path: str) -> DeleteFileRef:
        try:
            return self._refs[path]
        except KeyError:
            raise KeyError(f"delete file {path} is not in the plan's delete files") from None

    def positions(self, paths: Sequence[str], data_path: str) -> np.ndarray:
        """Sorted distinct positions of ``data_path`` that the position delete files name."""
        found = [hits for path in paths if len(hits := self._by_data_file(path).get(data_path, _EMPTY))]
        if not found:
            return _EMPTY
        return np.unique(np.concatenate(found))

    def _by_data_file(self, path: str) -> dict[str, np.ndarray]:
        """A position delete file's positions, grouped by the data file they name (read and grouped once)."""
        grouped = self._positions.get(path)
        if grouped is None and (ref := self.ref(path)).kind == "dv":
            assert ref.referenced_data_file is not None
            assert ref.content_offset is not None and ref.content_size is not None
            positions = read_deletion_vector(
                self._io, ref.path, ref.content_offset, ref.content_size, ref.record_count
            )
            grouped = self._positions[path] = {ref.referenced_data_file: positions}
        if grouped is None:
            with self._io.new_input(path).open() as stream:
                table = pq.read_table(stream, columns=["file_path", "pos"])
            table = table.cast(pa.schema([("file_path", pa.large_string()), ("pos", pa.int64())]))
            lists = table.group_by("file_path").aggregate([("pos", "list")])
            positions = lists.column("pos_list").combine_chunks()
            offsets, values = positions.offsets.to_numpy(), positions.values.to_numpy()
            grouped = {
                data_path: values[offsets[i] : offsets[i + 1]]
                for i, data_path in enumerate(lists.column("file_path").to_pylist())
            }
            self._positions[path] = grouped
        return grouped

    def equality(self, paths: Sequence[str]) -> list[_EqualitySet]:
        """The key sets of these equality delete files, one per distinct tuple of key columns."""
        by_ids: dict[tuple[int, ...], list[str]] = {}
        for path in paths:
            by_ids.setdefault(self.ref(path).equality_ids, []).append(path)
        sets = []
        for field_ids, group in sorted(by_ids.items()):
            cache_key = tuple(sorted(group))
            matcher = self._equality.get(cache_key)
            if matcher is None:
                matcher = self._load_equality(field_ids, sorted(group))
                self._equality[cache_key] = matcher
            sets.append(matcher)
        return sets

    def _load_equality(self, field_ids: tuple[int, ...], paths: list[str]) -> _EqualitySet:
        names = _column_names(self._schema, field_ids, paths[0])
        key_schema = select_columns(self._schema, set(field_ids))
        batches = [batch for path in paths for batch in read_data_file(self._io, path, key_schema)]
        rows = pa.Table.from_batches(batches, schema=output_schema(key_schema))
        keys = [canonical.comparable(canonical.column_at(rows, name)) for name in names]
        if len(keys) == 1:
            keys = [pc.unique(keys[0])]
        return _EqualitySet(names, keys)


class LiveRows:
    """The rows of one data file that a change consists of, by the rule in the module doc."""

    def __init__(
        self, loader: DeleteLoader, data_path: str, deletes: Sequence[str], require: Sequence[str]
    ) -> None:
        self._deleted_positions = loader.positions(
            [p for p in deletes if loader.ref(p).kind != "equality"], data_path
        )
        self._deleted_keys = loader.equality([p for p in deletes if loader.ref(p).kind == "equality"])
        self._require = bool(require)
        self._required_positions = loader.positions(
            [p for p in require if loader.ref(p).kind != "equality"], data_path
        )
        self._required_keys = loader.equality([p for p in require if loader.ref(p).kind == "equality"])
        self.masked = 0  # rows read but not emitted

    @staticmethod
    def _at(positions: np.ndarray, offset: int, n: int) -> np.ndarray:
        mask = np.zeros(n, dtype=bool)
        if len(positions):
            lo, hi = np.searchsorted(positions, [offset, offset + n])
            mask[positions[lo:hi] - offset] = True
        return mask

    def _named(self, batch: pa.RecordBatch, offset: int, positions: np.ndarray, keys) -> np.ndarray:
        named = self._at(positions, offset, batch.num_rows)
        for key_set in keys:
            named |= key_set.matches(batch)
        return named

    def emitted(self, batch: pa.RecordBatch, offset: int) -> np.ndarray:
        """Which rows of ``batch`` (the file's rows from position ``offset``) are part of the change."""
        emit = ~self._named(batch, offset, self._deleted_positions, self._deleted_keys)
        if self._require:
            emit &= self._named(batch, offset, self._required_positions, self._required_keys)
        return emit

    def selected_positions(self) -> np.ndarray | None:
        """The only positions that can be part of the change, when position deletes alone require them.

        A kept file whose change is named by new position deletes or a new
        DV: only those positions (less the ones deleted before) can be
        emitted, so only the row groups holding them need reading. None when
        the whole file must be read (no ``require``, or equality deletes in it).
        """
        if not self._require or self._required_keys:
            return None
        return np.setdiff1d(self._required_positions, self._deleted_positions, assume_unique=True)

    def filter_selected(
        self, batches: Generator[pa.RecordBatch, None, int]
    ) -> Generator[pa.RecordBatch, None, None]:
        """The rows read at :meth:`selected_positions`, less those equality deletes remove.

        ``batches`` returns the file's row count; every row not emitted,
        read or not, is counted in ``masked``.
        """
        emitted = 0
        while True:
            try:
                batch = next(batches)
            except StopIteration as done:
                file_rows = int(done.value)
                break
            emit = np.ones(batch.num_rows, dtype=bool)
            for key_set in self._deleted_keys:
                emit &= ~key_set.matches(batch)
            kept = int(emit.sum())
            emitted += kept
            if kept == batch.num_rows:
                yield batch
            elif kept:
                yield batch.filter(pa.array(emit))
        self.masked = file_rows - emitted

    def filter(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The batches with only the emitted rows (empty batches left out); counts the rest."""
        offset = 0
        for batch in batches:
            n = batch.num_rows
            emit = self.emitted(batch, offset)
            offset += n
            kept = int(emit.sum())
            self.masked += n - kept
            if kept == n:
                yield batch
            elif kept:
                yield batch.filter(pa.array(emit))

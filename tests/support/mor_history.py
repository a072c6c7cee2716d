"""Random merge-on-read histories: snapshots as Spark (merge-on-read) and Flink (upserts) commit them.

A :class:`MorHistory` owns a source table keyed by ``id`` and applies:

* ``append`` — a fast append;
* ``spark_delete`` — position delete files for some live rows (one per data
  file touched), sometimes naming a row an earlier delete already removed;
* ``spark_update`` — position deletes of the old rows and their new versions
  (some moved to another region) in one ``overwrite`` snapshot;
* ``flink_upsert`` — equality deletes of keys (some absent from the table),
  scoped to the partition of the row they replace, plus the new rows in the
  same commit (same sequence number: the delete never hits them), and
  sometimes a row inserted and deleted by position in that same commit;
* ``cow_merge`` — a copy-on-write rewrite of files that have live deletes (the
  rewrite keeps their live rows only; the old delete files stay, dangling);
* ``compact`` — a ``replace`` that rewrites every live row and drops every
  delete file;
* ``reinsert`` — keys deleted earlier come back;
* ``upgrade_to_v3`` — the table becomes format v3: from then on a position
  delete is a deletion vector that merges the file's earlier position deletes
  and replaces its earlier DV (as Spark writes them), old position delete
  files stay live, and every commit is a v3 row delta.

Which rows are live comes from :mod:`cdc_devtools.mor_state`, the tests' own
reader, never from the pipeline.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.table.snapshots import Operation

from cdc_devtools import format_v3, mor
from cdc_devtools.mor_state import live_files, position_deletes, snapshot_entries
from tests.support.history import REGIONS, HistoryTable


class MorHistory(HistoryTable):
    """A :class:`HistoryTable` whose row-level changes are merge-on-read."""

    deletion_vectors = 0  # DVs written so far

    def _files(self):
        current = self._current()
        return live_files(self.table, current) if current is not None else []

    def state(self) -> pa.Table:
        parts = [rows.filter(pa.array(live, pa.bool_())) for _, rows, live in self._files()]
        return pa.concat_tables(parts).cast(self.arrow_schema) if parts else self.arrow_schema.empty_table()

    def _live_rows_of(self, ids: set[int]) -> list[tuple]:
        """(entry, position, row) of every live row whose id is in ``ids``."""
        found = []
        for entry, rows, live in self._files():
            for pos, (row, is_live) in enumerate(zip(rows.to_pylist(), live, strict=True)):
                if is_live and row["id"] in ids:
                    found.append((entry, pos, row))
        return found

    def _dead_position(self, rng: random.Random) -> tuple | None:
        dead = [(entry, pos) for entry, _, live in self._files() for pos, ok in enumerate(live) if not ok]
        return rng.choice(dead) if dead else None

    @property
    def v3(self) -> bool:
        return format_v3.is_v3(self.table)

    def _position_deletes(self, hits: list[tuple], current: int | None) -> tuple[list, list]:
        """Delete files naming the (entry, position) ``hits``, and the delete files they replace.

        Before v3: one position delete file per data file, replacing nothing.
        On v3: one Puffin file with a DV per data file, each holding the file's
        earlier deleted positions too, and replacing the file's earlier DV.
        """
        by_file: dict[str, tuple] = {}
        for entry, pos, *_ in hits:
            by_file.setdefault(entry.data_file.file_path, (entry.data_file, []))[1].append(pos)
        if not self.v3:
            files = [mor.position_delete_file(self.table, f, positions) for f, positions in by_file.values()]
            return files, []
        earlier = position_deletes(self.table, current) if current is not None else {}
        vectors, replaced = {}, []
        for path, (data_file, positions) in by_file.items():
            deleted, dv_entry = earlier.get(path, (set(), None))
            vectors[path] = (data_file, sorted(deleted | set(positions)))
            if dv_entry is not None:
                replaced.append(dv_entry.data_file)
        self.deletion_vectors += len(vectors)
        return format_v3.deletion_vector_files(self.table, vectors), replaced

    def _fast_append(self, rows: pa.Table) -> None:
        if self.v3:  # pyiceberg cannot commit to a v3 table
            mor.commit_row_delta(
                self.table, add=mor.write_data_files(self.table, rows), operation=Operation.APPEND
            )
        else:
            self.table.append(rows)

    def _pick(self, rng: random.Random, fraction: float) -> set[int]:
        ids = self.live_ids()
        return set(rng.sample(ids, int(len(ids) * fraction))) if ids else set()

    # -- operations: each returns the snapshot ids it created -------------------------------------

    def spark_delete(self, rng: random.Random, fraction: float, again: bool) -> list[int]:
        before = self._current()
        victims = self._pick(rng, fraction)
        hits: list[tuple] = [(e, p) for e, p, _ in self._live_rows_of(victims)]
        if again and (dead := self._dead_position(rng)) is not None:
            hits.append(dead)  # a position delete of a row that is already deleted
        if not hits:
            return []
        add, remove = self._position_deletes(hits, before)
        mor.commit_row_delta(self.table, add=add, remove=remove, operation=Operation.DELETE)
        self.deleted_ids.extend(sorted(victims))
        return self._snapshots_since(before)

    def spark_update(self, rng: random.Random, fraction: float, move: float) -> list[int]:
        before = self._current()
        hits = self._live_rows_of(self._pick(rng, fraction))
        if not hits:
            return []
        old = pa.Table.from_pylist([row for _, _, row in hits], schema=self.arrow_schema)
        moved = {row["id"] for _, _, row in hits if rng.random() < move}
        new = self._updated(rng, old, moved, set())
        deletes, remove = self._position_deletes(hits, before)
        add = [*deletes, *mor.write_data_files(self.table, new)]
        mor.commit_row_delta(self.table, add=add, remove=remove, operation=Operation.OVERWRITE)
        return self._snapshots_since(before)

    def flink_upsert(
        self, rng: random.Random, updates: int, absent: int, inserts: int, transient: bool
    ) -> list[int]:
        before = self._current()
        live = self.live_ids()
        keys = set(rng.sample(live, min(updates, len(live))))
        hits = self._live_rows_of(keys)
        add = []
        spec = self.table.spec()
        # One equality delete file per partition of the rows it replaces; absent keys go in any of them.
        by_partition: dict[tuple, tuple] = {}
        for entry, _, row in hits:
            part = entry.data_file.partition
            key = tuple(part[i] for i in range(len(part)))
            by_partition.setdefault(key, (part, []))[1].append(row["id"])
        missing = [10_000_000 + rng.randint(0, 1000) for _ in range(absent)]
        if missing:
            if by_partition:
                target, (_, ids) = next(iter(by_partition.items()))
                ids.extend(missing)
                # Keys live in *other* partitions: a partition-scoped delete must not touch them.
                elsewhere = [
                    row["id"]
                    for entry, rows, live in self._files()
                    if tuple(entry.data_file.partition[i] for i in range(len(entry.data_file.partition)))
                    != target
                    for row, ok in zip(rows.to_pylist(), live, strict=True)
                    if ok and row["id"] not in keys
                ]
                ids.extend(rng.sample(elsewhere, min(absent, len(elsewhere))))
            elif not spec.fields:
                by_partition[()] = (None, missing)
        for partition, ids in by_partition.values():
            keys_table = pa.table({"id": pa.array(ids, pa.int64())})
            scope = {"spec_id": spec.spec_id, "partition": partition} if spec.fields else {}
            add.append(mor.equality_delete_file(self.table, keys_table, **scope))
        old = pa.Table.from_pylist([row for _, _, row in hits], schema=self.arrow_schema)
        new_rows = [self._updated(rng, old, set(), set())] if hits else []
        fresh = self.new_ids(inserts + (1 if transient else 0))
        if fresh:
            new_rows.append(self.rows(rng, fresh))
        if not add and not new_rows:
            return []
        data_files = mor.write_data_files(self.table, pa.concat_tables(new_rows)) if new_rows else []
        add.extend(data_files)
        if transient and data_files:
            # Inserted and deleted again within the same commit: a position delete of the new file.
            target = fresh[-1]
            for data_file in data_files:
                with self.table.io.new_input(data_file.file_path).open() as stream:
                    ids = pa.parquet.read_table(stream, columns=["id"]).column("id").to_pylist()
                if target in ids:
                    new_row = (SimpleNamespace(data_file=data_file), ids.index(target))
                    add.extend(self._position_deletes([new_row], before)[0])
        mor.commit_row_delta(self.table, add=add, operation=Operation.OVERWRITE)
        return self._snapshots_since(before)

    def cow_merge(self, rng: random.Random, fraction: float, drop_dvs: bool = False) -> list[int]:
        """Copy-on-write over a merge-on-read table: files with a touched row rewritten, live rows only.

        ``drop_dvs``: the rewritten files' DVs are removed too (as Iceberg
        1.8+ does); otherwise they stay, dangling, like old position deletes.
        """
        before = self._current()
        touched = self._pick(rng, fraction)
        removed, kept = [], []
        for entry, rows, live in self._files():
            mask = pa.array(live, pa.bool_())
            live_rows = rows.filter(mask)
            hit = pc.is_in(live_rows.column("id"), value_set=pa.array(sorted(touched), pa.int64()))
            if pc.any(hit).as_py():
                removed.append(entry.data_file)
                kept.append(live_rows.filter(pc.invert(hit)))
                kept.append(self._updated(rng, live_rows.filter(hit).cast(self.arrow_schema), set(), set()))
        if not removed:
            return []
        if drop_dvs and self.v3:
            earlier = position_deletes(self.table, before)
            rewritten = {f.file_path for f in removed}
            removed += [
                dv.data_file for path, (_, dv) in earlier.items() if path in rewritten and dv is not None
            ]
        add = mor.write_data_files(self.table, pa.concat_tables([k.cast(self.arrow_schema) for k in kept]))
        mor.commit_row_delta(self.table, add=add, remove=removed, operation=Operation.OVERWRITE)
        return self._snapshots_since(before)

    def compact(self) -> list[int]:
        """A ``replace``: every live row into new files, every data and delete file dropped."""
        current = self._current()
        if current is None:
            return []
        entries = snapshot_entries(self.table, current)
        if len(entries) < 2:
            return []
        add = mor.write_data_files(self.table, self.state())
        mor.commit_row_delta(
            self.table, add=add, remove=[e.data_file for e in entries], operation=Operation.REPLACE
        )
        return self._snapshots_since(current)

    def reinsert(self, rng: random.Random, count: int) -> list[int]:
        back = rng.sample(self.deleted_ids, min(count, len(self.deleted_ids)))
        if not back:
            return []
        before = self._current()
        self._fast_append(self.rows(rng, back, [rng.choice(REGIONS) for _ in back]))
        self.deleted_ids = [i for i in self.deleted_ids if i not in back]
        return self._snapshots_since(before)

    def upgrade_to_v3(self) -> None:
        """Format v3 from now on (a metadata change: no snapshot, nothing for the pipeline to capture)."""
        self.table = format_v3.upgrade_to_v3(self.table)

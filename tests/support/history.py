"""Random copy-on-write histories of a real Iceberg table, written the way engines write them.

A :class:`HistoryTable` owns one source table with a random schema
(:class:`HistoryShape`) and applies the operations that produce snapshots in
production:

* ``merge`` — ONE ``overwrite`` snapshot as Spark's MERGE / UPDATE / DELETE
  commit it: every data file holding a touched row is removed and rewritten
  (its untouched rows become real carryover), with value updates, partition
  moves, updates that change nothing, deletes, new inserts and re-inserts of
  keys deleted earlier;
* ``append`` — a fast append (insert-only snapshot);
* ``noop_rewrite`` — files rewritten with their own rows (all carryover);
* ``dedupe`` — whole-row tables: files rewritten with one copy of each row
  (k DELETEs + 1 INSERT of a row: carryover by multiplicity);
* ``upsert`` / ``overwrite_where`` / ``delete_where`` — pyiceberg's own
  operations, which spread one change over several snapshots;
* ``compact`` — a ``replace`` snapshot (no logical change);
* ``rollback`` — a change that is then rolled back (never in the ancestry).

Values come from a seeded :class:`random.Random` per operation, so hypothesis
shrinks the operation sequence and its sizes while each step stays cheap.
"""

from __future__ import annotations

import datetime as dt
import decimal
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import In
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import BucketTransform, IdentityTransform
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)

from cdc_devtools.cow import cow_apply, read_task_rows, rewrite_files
from cdc_devtools.oracle import row_key
from tests.support.iceberg_tables import live_files, replace_files

REGIONS = ("us", "eu", "ap")
Values = Callable[[random.Random, int], list]


def _maybe_null(rng: random.Random, value):
    return None if rng.random() < 0.1 else value


def _longs(rng: random.Random, n: int) -> list:
    return [_maybe_null(rng, rng.choice([0, -1, 2**62, rng.randint(-1000, 1000)])) for _ in range(n)]


def _ints(rng: random.Random, n: int) -> list:
    return [_maybe_null(rng, rng.randint(-(2**31), 2**31 - 1)) for _ in range(n)]


def _strings(rng: random.Random, n: int) -> list:
    return [_maybe_null(rng, rng.choice(["", "a", "ü€", "x y", f"s{rng.randint(0, 50)}"])) for _ in range(n)]


def _doubles(rng: random.Random, n: int) -> list:
    return [
        _maybe_null(rng, rng.choice([0.0, -0.0, 1.5, float("inf"), float("nan"), rng.uniform(-1e9, 1e9)]))
        for _ in range(n)
    ]


def _decimals(rng: random.Random, n: int) -> list:
    return [_maybe_null(rng, decimal.Decimal(rng.randint(-(10**9), 10**9)).scaleb(-2)) for _ in range(n)]


def _bools(rng: random.Random, n: int) -> list:
    return [_maybe_null(rng, rng.random() < 0.5) for _ in range(n)]


def _dates(rng: random.Random, n: int) -> list:
    return [
        _maybe_null(rng, dt.date(1970, 1, 1) + dt.timedelta(days=rng.randint(-3000, 30000))) for _ in range(n)
    ]


def _timestamps(rng: random.Random, n: int) -> list:
    base = dt.datetime(2000, 1, 1)
    return [_maybe_null(rng, base + dt.timedelta(microseconds=rng.randint(0, 10**15))) for _ in range(n)]


def _timestamptzs(rng: random.Random, n: int) -> list:
    base = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
    return [_maybe_null(rng, base + dt.timedelta(microseconds=rng.randint(0, 10**15))) for _ in range(n)]


def _binaries(rng: random.Random, n: int) -> list:
    return [_maybe_null(rng, bytes(rng.randint(0, 255) for _ in range(rng.randint(0, 5)))) for _ in range(n)]


def _structs(rng: random.Random, n: int) -> list:
    return [_maybe_null(rng, {"a": _ints(rng, 1)[0], "b": _strings(rng, 1)[0]}) for _ in range(n)]


def _lists(rng: random.Random, n: int) -> list:
    return [_maybe_null(rng, _longs(rng, rng.randint(0, 3))) for _ in range(n)]


def _maps(rng: random.Random, n: int) -> list:
    return [
        _maybe_null(rng, [(f"k{i}", v) for i, v in enumerate(_longs(rng, rng.randint(0, 3)))])
        for _ in range(n)
    ]


@dataclass(frozen=True)
class ColumnKind:
    """A data column type the generator can fill with values (nulls included)."""

    name: str
    iceberg: Callable[[Callable[[], int]], IcebergType]
    values: Values


COLUMN_KINDS: dict[str, ColumnKind] = {
    kind.name: kind
    for kind in (
        ColumnKind("long", lambda _: LongType(), _longs),
        ColumnKind("int", lambda _: IntegerType(), _ints),
        ColumnKind("string", lambda _: StringType(), _strings),
        ColumnKind("double", lambda _: DoubleType(), _doubles),
        ColumnKind("decimal", lambda _: DecimalType(12, 2), _decimals),
        ColumnKind("boolean", lambda _: BooleanType(), _bools),
        ColumnKind("date", lambda _: DateType(), _dates),
        ColumnKind("timestamp", lambda _: TimestampType(), _timestamps),
        ColumnKind("timestamptz", lambda _: TimestamptzType(), _timestamptzs),
        ColumnKind("binary", lambda _: BinaryType(), _binaries),
        ColumnKind(
            "struct",
            lambda ids: StructType(
                NestedField(ids(), "a", IntegerType(), required=False),
                NestedField(ids(), "b", StringType(), required=False),
            ),
            _structs,
        ),
        ColumnKind("list", lambda ids: ListType(ids(), LongType(), element_required=False), _lists),
        ColumnKind(
            "map",
            lambda ids: MapType(ids(), StringType(), ids(), LongType(), value_required=False),
            _maps,
        ),
    )
}


@dataclass(frozen=True)
class HistoryShape:
    """A random table layout: data columns, identifier mode and partitioning.

    ``identifier`` is ``("id",)``, ``("id", "region")`` (a partition move then
    changes the key: DELETE + INSERT) or ``()`` (whole-row mode, where equal
    rows may repeat and only multiplicity tells changes apart).
    """

    columns: tuple[str, ...]
    identifier: tuple[str, ...]
    partitioning: str  # "region" (identity), "bucket" (bucket[4](id)) or "none"

    def schema(self) -> Schema:
        counter = iter(range(1, 10_000))

        def ids() -> int:
            return next(counter)

        fields = [NestedField(ids(), "id", LongType(), required=True)]
        fields.append(NestedField(ids(), "region", StringType(), required=True))
        for i, kind in enumerate(self.columns):
            field_id = ids()
            fields.append(
                NestedField(field_id, f"c{i}_{kind}", COLUMN_KINDS[kind].iceberg(ids), required=False)
            )
        by_name = {f.name: f.field_id for f in fields}
        return Schema(*fields, identifier_field_ids=[by_name[n] for n in self.identifier])

    def spec(self) -> PartitionSpec:
        if self.partitioning == "region":
            return PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "region"))
        if self.partitioning == "bucket":
            return PartitionSpec(PartitionField(1, 1000, BucketTransform(4), "id_bucket"))
        return UNPARTITIONED_PARTITION_SPEC


class HistoryTable:
    """One source table and the operations that give it a history."""

    def __init__(self, table: Table, shape: HistoryShape) -> None:
        self.table = table
        self.shape = shape
        self.arrow_schema = table.schema().as_arrow()
        self.next_id = 0
        self.deleted_ids: list[int] = []

    # -- rows ------------------------------------------------------------------------------------

    def rows(self, rng: random.Random, ids: list[int], regions: list[str] | None = None) -> pa.Table:
        """Rows for ``ids`` with random values in every data column."""
        n = len(ids)
        columns = {
            "id": ids,
            "region": regions if regions is not None else [rng.choice(REGIONS) for _ in range(n)],
        }
        for i, kind in enumerate(self.shape.columns):
            columns[f"c{i}_{kind}"] = COLUMN_KINDS[kind].values(rng, n)
        return pa.Table.from_pydict(columns, schema=self.arrow_schema)

    def new_ids(self, n: int) -> list[int]:
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        return ids

    def state(self) -> pa.Table:
        self.table.refresh()
        if self.table.current_snapshot() is None:
            return self.arrow_schema.empty_table()
        return self.table.scan().to_arrow()

    def live_ids(self) -> list[int]:
        return sorted(set(self.state().column("id").to_pylist()))

    def _updated(self, rng: random.Random, rows: pa.Table, move: set[int], noop: set[int]) -> pa.Table:
        """New versions of ``rows``: fresh values; region changed for ``move``; ``noop`` ids unchanged.

        Half of the other rows get a fresh value in one data column only (``UPDATE ... SET c = ...``),
        the rest in every column.
        """
        ids = rows.column("id").to_pylist()
        regions = rows.column("region").to_pylist()
        new_regions = [
            rng.choice([r for r in REGIONS if r != region]) if i in move else region
            for i, region in zip(ids, regions, strict=True)
        ]
        fresh = self.rows(rng, ids, new_regions)
        data_columns = [n for n in self.arrow_schema.names if n not in ("id", "region")]
        only = [rng.choice(data_columns) if data_columns and rng.random() < 0.5 else None for _ in ids]
        columns = []
        for name in self.arrow_schema.names:
            keep = [
                i in noop or (column is not None and column != name)
                for i, column in zip(ids, only, strict=True)
            ]
            if name in ("id", "region"):
                keep = [i in noop for i in ids]
            columns.append(pc.if_else(pa.array(keep, pa.bool_()), rows.column(name), fresh.column(name)))
        return pa.Table.from_arrays(columns, schema=self.arrow_schema)

    # -- operations: each returns the snapshot ids it created ------------------------------------

    def _snapshots_since(self, before: int | None) -> list[int]:
        self.table.refresh()
        out = []
        snapshot = self.table.current_snapshot()
        while snapshot is not None and snapshot.snapshot_id != before:
            out.append(snapshot.snapshot_id)
            parent = snapshot.parent_snapshot_id
            snapshot = self.table.snapshot_by_id(parent) if parent is not None else None
        return out[::-1]

    def _current(self) -> int | None:
        self.table.refresh()
        snapshot = self.table.current_snapshot()
        return snapshot.snapshot_id if snapshot else None

    def append(self, rng: random.Random, n: int, duplicates: int = 0) -> list[int]:
        """A fast append of ``n`` new keys, plus (whole-row mode) exact copies of existing rows."""
        before = self._current()
        parts = [self.rows(rng, self.new_ids(n))]
        if duplicates and not self.shape.identifier:
            state = self.state()
            if state.num_rows:
                picks = [rng.randrange(state.num_rows) for _ in range(duplicates)]
                parts.append(state.take(picks).cast(self.arrow_schema))
        batch = pa.concat_tables(parts)
        if batch.num_rows:
            self._fast_append(batch)
        return self._snapshots_since(before)

    def _fast_append(self, rows: pa.Table) -> None:
        self.table.append(rows)

    def merge(
        self,
        rng: random.Random,
        *,
        update: float,
        move: float,
        noop: float,
        delete: float,
        inserts: int,
        reinserts: int,
    ) -> list[int]:
        """One copy-on-write MERGE snapshot over fractions of the live keys."""
        before = self._current()
        ids = self.live_ids()
        rng.shuffle(ids)
        n_update, n_delete = int(len(ids) * update), int(len(ids) * delete)
        updated = set(ids[:n_update])
        deleted = set(ids[n_update : n_update + n_delete])
        moved = {i for i in updated if rng.random() < move}
        unchanged = {i for i in updated - moved if rng.random() < noop}
        reinserted = rng.sample(self.deleted_ids, min(reinserts, len(self.deleted_ids)))
        new_rows = self.rows(rng, self.new_ids(inserts) + reinserted)
        touched_ids = pa.array(sorted(updated | deleted), pa.int64())
        snapshot = cow_apply(
            self.table,
            touched=lambda rows: pc.is_in(rows.column("id"), value_set=touched_ids),
            rewrite=lambda rows: self._updated(
                rng,
                rows.filter(pc.is_in(rows.column("id"), value_set=pa.array(sorted(updated), pa.int64()))),
                moved,
                unchanged,
            ),
            inserts=new_rows,
        )
        self.deleted_ids = [i for i in self.deleted_ids if i not in reinserted] + sorted(deleted)
        return self._snapshots_since(before) if snapshot is not None else []

    def noop_rewrite(self, rng: random.Random) -> list[int]:
        """Some files rewritten with exactly their rows: an overwrite that is all carryover."""
        files = live_files(self.table)
        if not files:
            return []
        before = self._current()
        chosen = {f.file_path for f in rng.sample(files, rng.randint(1, len(files)))}
        tasks = [t for t in self.table.scan().plan_files() if t.file.file_path in chosen]
        content = pa.concat_tables([read_task_rows(self.table, t) for t in tasks])
        rewrite_files(self.table, [t.file for t in tasks], content)
        return self._snapshots_since(before)

    def dedupe(self, rng: random.Random) -> list[int]:
        """Whole-row tables: a dedup job (``INSERT OVERWRITE ... SELECT DISTINCT``) rewrites every file.

        A row with k copies is removed k times and added once (k DELETE +
        1 INSERT of one row): carryover by multiplicity. Half the time one
        extra copy of a duplicated row is kept (2 DELETE + 2 INSERT of it).
        """
        if self.shape.identifier:
            return []
        files = live_files(self.table)
        if not files:
            return []
        before = self._current()
        chosen = {f.file_path for f in files}
        tasks = [t for t in self.table.scan().plan_files() if t.file.file_path in chosen]
        content = pa.concat_tables([read_task_rows(self.table, t) for t in tasks])
        names = content.schema.names
        seen: Counter = Counter()
        allowed = 2 if rng.random() < 0.5 else 1
        keep = []
        for row in content.to_pylist():
            key = row_key(row, names)
            seen[key] += 1
            keep.append(seen[key] <= allowed)
        if all(keep):
            return []
        rewrite_files(self.table, [t.file for t in tasks], content.filter(pa.array(keep, pa.bool_())))
        return self._snapshots_since(before)

    def upsert(self, rng: random.Random, updates: int, inserts: int) -> list[int]:
        """pyiceberg's upsert (update matched keys, insert the rest): several snapshots."""
        if not self.shape.identifier:
            return []
        before = self._current()
        state = self.state()
        live = state.column("id").to_pylist()
        picks = rng.sample(range(len(live)), min(updates, len(live)))
        changed = (
            self._updated(rng, state.take(picks).cast(self.arrow_schema), set(), set()) if picks else None
        )
        parts = [p for p in (changed, self.rows(rng, self.new_ids(inserts))) if p is not None and p.num_rows]
        if not parts:
            return []
        self.table.upsert(pa.concat_tables(parts), join_cols=list(self.shape.identifier))
        return self._snapshots_since(before)

    def overwrite_where(self, rng: random.Random, count: int, inserts: int) -> list[int]:
        """pyiceberg's overwrite with a filter: delete some keys, append new rows (two snapshots)."""
        ids = self.live_ids()
        if not ids:
            return []
        before = self._current()
        victims = rng.sample(ids, min(count, len(ids)))
        self.table.overwrite(self.rows(rng, self.new_ids(inserts)), overwrite_filter=In("id", victims))
        self.deleted_ids.extend(victims)
        return self._snapshots_since(before)

    def delete_where(self, rng: random.Random, count: int) -> list[int]:
        """pyiceberg's delete by filter: whole-file drops and/or copy-on-write rewrites."""
        ids = self.live_ids()
        if not ids:
            return []
        before = self._current()
        victims = rng.sample(ids, min(count, len(ids)))
        self.table.delete(In("id", victims))
        self.deleted_ids.extend(victims)
        return self._snapshots_since(before)

    def compact(self) -> list[int]:
        """A ``replace`` snapshot: every live file rewritten into one, same rows."""
        before = self._current()  # refreshes the table first: the files listed must be the current ones
        files = live_files(self.table)
        if len(files) < 2:
            return []
        replace_files(self.table, files, self.state())
        return self._snapshots_since(before)

    def rollback(self, rng: random.Random) -> int | None:
        """A MERGE that is rolled back at once: returns the id that must never be processed."""
        parent = self._current()
        if parent is None:
            return None
        deleted_before = list(self.deleted_ids)
        created = self.merge(rng, update=0.3, move=0.5, noop=0.0, delete=0.1, inserts=2, reinserts=0)
        self.deleted_ids = deleted_before
        if not created:
            return None
        self.table.manage_snapshots().rollback_to_snapshot(parent).commit()
        self.table.refresh()
        return created[-1]

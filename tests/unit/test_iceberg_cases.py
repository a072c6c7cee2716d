"""Apache Iceberg's own changelog test cases, ported as data, run through the merge and the real shuffle.

The cases live in ``tests/cases/iceberg_changelog_cases.yaml`` (its header says where each comes
from, what was skipped and why). Every case runs three ways:

* the data itself is checked against the plain-Python oracle (:mod:`cdc_devtools.oracle`), so a
  typo in an expected row cannot make the other two tests pass or fail for the wrong reason;
* the rows go straight into :func:`~iceberg_cdc.changelog.merge.merge_changes`, in the file's order
  and reversed (rows reach a read task in no fixed order);
* the rows go through the real shuffle: DELETEs and INSERTs written by different map tasks (as rows of
  removed and added files are) with :class:`MapOutputWriter` into a local object store, read back
  per partition and as one coalesced range with ``fetch_range``, and merged per range, as SHUFFLE_READ
  tasks do.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from cdc_devtools.oracle import Ambiguous, expected_changes, row_key
from iceberg_cdc.changelog.merge import merge_changes
from iceberg_cdc.errors import AmbiguousUpdateError
from iceberg_cdc.shuffle.fetch import fetch_range
from iceberg_cdc.shuffle.partitioner import HashPartitioner
from iceberg_cdc.shuffle.reader import read_index
from iceberg_cdc.shuffle.rows import OP_COLUMN, Op, shuffle_schema
from iceberg_cdc.shuffle.writer import MapOutputWriter
from iceberg_cdc.storage import LocalObjectStore
from tests.cases import MERGE_CASES, arrow_rows, arrow_type, load, split_change

REMOVED = ("DELETE", "UPDATE_BEFORE")  # change types that take a row out of the table
SHUFFLE_PARTITIONS = (3, 8)
MAP_TASKS_PER_SIDE = 2  # removed files and added files are read by different write tasks


@dataclass(frozen=True)
class MergeCase:
    """One case of the YAML file: the rows one snapshot removed and added, and what it must emit."""

    name: str
    schema: pa.Schema
    identifier_columns: list[str]
    deleted: list[list[Any]]
    inserted: list[list[Any]]
    expected: list[list[Any]] | None
    error: str | None
    unpaired_expected: list[list[Any]] | None
    iceberg_expected: list[list[Any]] | None
    provenance: str

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> MergeCase:
        schema = pa.schema([pa.field(c["name"], arrow_type(c["type"])) for c in doc["columns"]])
        sources = doc.get("iceberg") or []
        provenance = (
            "; ".join(f"{s['class']}.{s['method']}" for s in sources) or f"design: {doc.get('design')}"
        )
        return cls(
            name=doc["name"],
            schema=schema,
            identifier_columns=list(doc.get("identifier_columns") or []),
            deleted=doc["deleted"],
            inserted=doc["inserted"],
            expected=doc.get("expected"),
            error=doc.get("error"),
            unpaired_expected=doc.get("unpaired_expected"),
            iceberg_expected=doc.get("iceberg_expected"),
            provenance=provenance,
        )

    @property
    def names(self) -> list[str]:
        return self.schema.names

    @property
    def ids(self) -> list[str] | None:
        return self.identifier_columns or None

    def table(self, rows: Sequence[Sequence[Any]]) -> pa.Table:
        """``rows`` (values in column order) as an Arrow table of the case's schema."""
        return arrow_rows(self.schema, [list(row) for row in rows])

    def dicts(self, rows: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
        """Rows as ``to_pylist`` gives them back, so they compare like the merge's output."""
        return self.table(rows).to_pylist()

    def changes(self, rows: Sequence[Sequence[Any]]) -> Counter:
        """Expected change rows (values, then the change type) as a multiset of (frozen row, type)."""
        split = [split_change(row) for row in rows]
        values = self.dicts([v for v, _ in split])
        return Counter((row_key(v, self.names), kind) for v, (_, kind) in zip(values, split, strict=True))

    def shuffled(self, *, reverse: bool = False) -> pa.Table:
        """All rows of the snapshot tagged with their operation, as a read task receives them."""
        parts = [self.tagged(self.deleted, Op.DELETE), self.tagged(self.inserted, Op.INSERT)]
        table = pa.concat_tables(parts)
        if reverse and table.num_rows:
            table = table.take(pa.array(range(table.num_rows - 1, -1, -1)))
        return table

    def tagged(self, rows: Sequence[Sequence[Any]], op: Op) -> pa.Table:
        data = self.table(rows)
        tag = pa.array([int(op)] * data.num_rows, pa.int8())
        return pa.Table.from_arrays([*data.columns, tag], schema=shuffle_schema(self.schema))


def load_cases() -> list[MergeCase]:
    return [MergeCase.from_doc(doc) for doc in load(MERGE_CASES)]


CASES = load_cases()


def by_name(cases: list[MergeCase]) -> dict[str, Any]:
    return {"argvalues": cases, "ids": [case.name for case in cases]}


def emitted(case: MergeCase, table: pa.Table) -> Counter:
    return Counter((row_key(row, case.names), row["_change_type"]) for row in table.to_pylist())


def assert_updates_pair(case: MergeCase, table: pa.Table) -> None:
    """Each UPDATE_BEFORE is immediately followed by the UPDATE_AFTER of the same key."""
    rows = table.to_pylist()
    for position, row in enumerate(rows):
        if row["_change_type"] == "UPDATE_BEFORE":
            after = rows[position + 1] if position + 1 < len(rows) else None
            assert after is not None and after["_change_type"] == "UPDATE_AFTER", (
                f"{case.name}: unpaired {row}"
            )
            assert row_key(row, case.identifier_columns) == row_key(after, case.identifier_columns)
    kinds = Counter(row["_change_type"] for row in rows)
    assert kinds["UPDATE_BEFORE"] == kinds["UPDATE_AFTER"]


def assert_replays(case: MergeCase, changes: Counter, label: str) -> None:
    """deleted - removed + added == inserted as multisets, with removed rows among the deleted ones."""
    before = Counter(row_key(r, case.names) for r in case.dicts(case.deleted))
    after = Counter(row_key(r, case.names) for r in case.dicts(case.inserted))
    removed: Counter = Counter()
    added: Counter = Counter()
    for (row, kind), count in changes.items():
        (removed if kind in REMOVED else added)[row] += count
    assert not removed - before, f"{case.name} ({label}): removes rows the snapshot did not delete"
    assert (before - removed) + added == after, f"{case.name} ({label}): does not replay to the inserted rows"


# -- the data ----------------------------------------------------------------------------------------


def test_every_case_is_well_formed():
    names = [case.name for case in CASES]
    assert len(names) == len(set(names)), "case names must be unique (they are the test ids)"
    assert len(CASES) >= 60
    for case in CASES:
        assert (case.expected is None) != (case.error is None), f"{case.name}: give expected or error"
        assert case.error in (None, "ambiguous"), f"{case.name}: unknown error {case.error!r}"
        assert set(case.identifier_columns) <= set(case.names), f"{case.name}: unknown identifier column"
        assert "None" not in case.provenance, f"{case.name}: say which Iceberg test or design rule it is"
    ported = {s for case in CASES for s in case.provenance.split("; ") if not s.startswith("design")}
    # Every TestChangelogIterator test that applies per snapshot, and the procedure/table tests.
    for method in (
        "TestChangelogIterator.testIterator",
        "TestChangelogIterator.testRowsWithNullValue",
        "TestChangelogIterator.testUpdatedRowsWithDuplication",
        "TestChangelogIterator.testCarryRowsRemoveWithDuplicates",
        "TestChangelogIterator.testCarryRowsRemoveLessInsertRows",
        "TestChangelogIterator.testCarryRowsRemoveMoreInsertRows",
        "TestChangelogIterator.testCarryRowsRemoveNoInsertRows",
        "TestChangelogIterator.testRemoveNetCarryovers",
        "TestCreateChangelogViewProcedure.testUpdateWithMultipleIdentifierColumns",
        "TestCreateChangelogViewProcedure.testRemoveCarryOvers",
        "TestCreateChangelogViewProcedure.testNonStandardColumnNames",
    ):
        assert method in ported, f"{method} is not ported"
    assert sum(case.provenance == "TestChangelogIterator.testIterator" for case in CASES) == 24


@pytest.mark.parametrize("case", **by_name(CASES))
def test_case_data_agrees_with_the_oracle(case: MergeCase):
    deleted, inserted = case.dicts(case.deleted), case.dicts(case.inserted)
    if case.error:
        with pytest.raises(Ambiguous):
            expected_changes(deleted, inserted, case.names, case.ids)
        assert case.unpaired_expected is not None, f"{case.name}: say what emit_unpaired gives"
        unpaired = case.changes(case.unpaired_expected)
        assert_replays(case, unpaired, "unpaired_expected")
        assert {kind for _, kind in unpaired} <= {"DELETE", "INSERT"}
    else:
        assert case.expected is not None
        assert case.changes(case.expected) == expected_changes(deleted, inserted, case.names, case.ids)
        assert_replays(case, case.changes(case.expected), "expected")
    if case.iceberg_expected is not None:
        assert_replays(case, case.changes(case.iceberg_expected), "iceberg_expected")


# -- the vectorized merge ----------------------------------------------------------------------------


@pytest.mark.parametrize("case", **by_name(CASES))
def test_vectorized_merge(case: MergeCase):
    for reverse in (False, True):
        rows = case.shuffled(reverse=reverse)
        if case.error:
            with pytest.raises(AmbiguousUpdateError, match="cannot pair updates for identifier"):
                merge_changes(rows, case.ids)
            out, _ = merge_changes(rows, case.ids, emit_unpaired=True)
            assert emitted(case, out) == case.changes(case.unpaired_expected or [])
            continue
        out, stats = merge_changes(rows, case.ids)
        assert out.schema.names == [*case.names, "_change_type"]
        assert emitted(case, out) == case.changes(case.expected or []), f"reverse={reverse}"
        assert_updates_pair(case, out)
        assert stats.carryover_rows + out.num_rows == rows.num_rows


# -- through the real shuffle --------------------------------------------------------------------------


def write_map_outputs(
    case: MergeCase, store: LocalObjectStore, partitions: int, spill_dir: Path
) -> list[str]:
    """Deleted and inserted rows spread over separate map tasks, as rows of removed and added files are."""
    partitioner = HashPartitioner(partitions, case.ids)
    names = []
    for side, rows, op in (("removed", case.deleted, Op.DELETE), ("added", case.inserted, Op.INSERT)):
        for task in range(MAP_TASKS_PER_SIDE):
            name = f"map/{side}-{task}"
            with MapOutputWriter(store, name, case.schema, partitioner, spill_dir=str(spill_dir)) as writer:
                writer.write(case.table(rows[task::MAP_TASKS_PER_SIDE]), op)
                writer.commit()
            names.append(name)
    return names


def read_and_merge(
    case: MergeCase, store: LocalObjectStore, names: list[str], partitions: int, ranges: list[tuple[int, int]]
) -> tuple[Counter, Counter, int, bool]:
    """Merge each read range as a SHUFFLE_READ task does: (changes, unpaired changes, rows read, ambiguous?)."""
    indexes = [read_index(store, name, partitions) for name in names]
    schema = shuffle_schema(case.schema)
    changes: Counter = Counter()
    unpaired: Counter = Counter()
    rows_read = 0
    ambiguous = False
    for start, end in ranges:
        rows = fetch_range(store, indexes, start, end, schema, threads=1)
        assert rows.schema.names == [*case.names, OP_COLUMN]
        rows_read += rows.num_rows
        try:
            out, _ = merge_changes(rows, case.ids)
        except AmbiguousUpdateError:
            ambiguous = True
        else:
            assert_updates_pair(case, out)
            changes += emitted(case, out)
        loose, _ = merge_changes(rows, case.ids, emit_unpaired=True)
        unpaired += emitted(case, loose)
    return changes, unpaired, rows_read, ambiguous


@pytest.mark.parametrize("case", **by_name(CASES))
def test_through_the_shuffle(case: MergeCase, tmp_path: Path):
    for partitions in SHUFFLE_PARTITIONS:
        store = LocalObjectStore(tmp_path / f"p{partitions}")
        names = write_map_outputs(case, store, partitions, tmp_path)
        layouts = {
            "one range per partition": [(p, p + 1) for p in range(partitions)],
            "one coalesced range": [(0, partitions)],
        }
        for layout, ranges in layouts.items():
            label = f"P={partitions}, {layout}"
            changes, unpaired, rows_read, ambiguous = read_and_merge(case, store, names, partitions, ranges)
            assert rows_read == len(case.deleted) + len(case.inserted), f"{label}: rows lost in the shuffle"
            if case.error:
                assert ambiguous, f"{label}: the duplicate key must fail its read range"
                assert unpaired == case.changes(case.unpaired_expected or []), label
            else:
                assert not ambiguous, label
                assert changes == case.changes(case.expected or []), label
                assert unpaired == changes, f"{label}: emit_unpaired changes nothing without duplicates"

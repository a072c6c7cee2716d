"""A table's rows at a snapshot with every delete file applied: a reference reader for replay checks.

pyiceberg 0.12 applies position deletes in its scans but refuses equality
deletes, so replay checks on merge-on-read tables (the tests, the demo, the
bench) need another way to read a snapshot's state. This one shares no code
with the pipeline's delete handling, so the two can disagree: the manifests
are read by :mod:`cdc_devtools.reference_manifests` (fastavro, the
spec's inheritance rules), and the deletes are applied row by row with Python
sets, by the spec's rules stated plainly. It is for small tables only:

* a position delete ``(file_path, pos)`` with data sequence number >= the
  data file's removes that row;
* a deletion vector (format v3) with data sequence number >= the data
  file's removes the positions it holds from its referenced data file, and
  then no position delete file applies to that data file (the DV holds them
  all); its blob is found through pyiceberg's own Puffin reader and Roaring
  decoder, not the pipeline's;
* an equality delete with a data sequence number > the data file's, in an
  unpartitioned spec or in the data file's spec and partition, removes every
  row whose values in its ``equality_ids`` columns (matched by field id)
  equal one of its rows: None equals None, NaN equals NaN, -0.0 differs
  from 0.0 (the equality of Iceberg's Java readers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.deletion_vector import deletion_vectors_from_puffin_file
from pyiceberg.table.puffin import PuffinFile

from cdc_devtools.reference_manifests import (
    DATA,
    EQUALITY_DELETES,
    POSITION_DELETES,
    RefEntry,
    snapshot_entries,
)

__all__ = ["live_files", "live_state", "needs_reference_reader", "position_deletes", "snapshot_entries"]


def _deletion_vector(table: Table, entry: RefEntry) -> tuple[str, set[int]]:
    """(referenced data file, positions) of a DV entry, read with pyiceberg's Puffin reader."""
    with table.io.new_input(entry.file_path).open() as stream:
        puffin = PuffinFile(stream.read())
    (vector,) = [
        dv
        for blob, dv in zip(puffin.footer.blobs, deletion_vectors_from_puffin_file(puffin), strict=True)
        if blob.offset == entry.content_offset
    ]
    assert vector.referenced_data_file == entry.referenced_data_file
    return vector.referenced_data_file, set(vector.to_vector().to_pylist())


def _file_rows(table: Table, entry: RefEntry) -> pa.Table:
    """Every row of one data file, in the table's current schema (pyiceberg's reader, no delete applied)."""
    return ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue()).to_table(
        [FileScanTask(entry.data_file)]
    )


def _comparable(value: Any) -> Any:
    """A value as equality deletes compare it: NaN equals NaN, -0.0 differs from 0.0."""
    if isinstance(value, float):
        return ("nan",) if math.isnan(value) else ("float", value, math.copysign(1.0, value))
    return value


def needs_reference_reader(table: Table, snapshot_id: int) -> bool:
    """Whether pyiceberg's scan cannot be trusted for the snapshot: equality deletes, or deletion vectors.

    pyiceberg 0.12 refuses equality deletes, and applies every blob of a
    Puffin file it reads, including DVs the table has since replaced.
    """
    return any(
        e.content == EQUALITY_DELETES or e.is_deletion_vector for e in snapshot_entries(table, snapshot_id)
    )


@dataclass
class _EqualityDelete:
    sequence_number: int
    spec_id: int
    partition: tuple
    unpartitioned: bool
    names: list[str]  # the key columns' names in the table's current schema
    keys: set[tuple]


@dataclass
class _Deletes:
    """Every delete of one snapshot, as plain Python collections."""

    positions: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # data path -> (seq, pos)
    vectors: dict[str, tuple[int, set[int], RefEntry]] = field(default_factory=dict)  # data path -> DV
    equality: list[_EqualityDelete] = field(default_factory=list)

    def positions_of(self, entry: RefEntry) -> tuple[set[int], RefEntry | None]:
        """Positions of the data file deleted by a DV or position deletes, and the DV entry if one applies."""
        dv_seq, dv, dv_entry = self.vectors.get(entry.file_path, (-1, set(), None))
        if dv_seq >= entry.sequence_number:
            return dv, dv_entry
        return {
            pos
            for delete_seq, pos in self.positions.get(entry.file_path, ())
            if delete_seq >= entry.sequence_number
        }, None

    def equality_for(self, entry: RefEntry) -> list[_EqualityDelete]:
        return [
            d
            for d in self.equality
            if d.sequence_number > entry.sequence_number
            and (d.unpartitioned or (d.spec_id, d.partition) == (entry.spec_id, entry.partition))
        ]


def _equality_keys(table: Table, entry: RefEntry) -> tuple[list[str], set[tuple]]:
    """The key columns (current names) and key tuples of an equality delete file, matched by field id."""
    with table.io.new_input(entry.file_path).open() as stream:
        rows = pq.read_table(stream)
    by_id = {
        int(f.metadata[b"PARQUET:field_id"]): f.name
        for f in rows.schema
        if f.metadata and b"PARQUET:field_id" in f.metadata
    }
    schema = table.schema()
    names = []
    for field_id in entry.equality_ids:
        name = schema.find_column_name(field_id)
        assert name is not None and field_id in by_id, (
            f"{entry.file_path}: no column with field id {field_id}"
        )
        names.append(name)
    columns = [rows.column(by_id[i]).to_pylist() for i in entry.equality_ids]
    return names, {tuple(_comparable(v) for v in key) for key in zip(*columns, strict=True)}


def _deletes(table: Table, entries: list[RefEntry]) -> _Deletes:
    deletes = _Deletes()
    specs = table.specs()
    for entry in entries:
        if entry.content == DATA:
            continue
        if entry.is_deletion_vector:
            data_path, deleted = _deletion_vector(table, entry)
            assert data_path not in deletes.vectors, f"two deletion vectors for {data_path}"
            deletes.vectors[data_path] = (entry.sequence_number, deleted, entry)
        elif entry.content == POSITION_DELETES:
            with table.io.new_input(entry.file_path).open() as stream:
                for row in pq.read_table(stream, columns=["file_path", "pos"]).to_pylist():
                    deletes.positions.setdefault(row["file_path"], []).append(
                        (entry.sequence_number, row["pos"])
                    )
        else:
            names, keys = _equality_keys(table, entry)
            deletes.equality.append(
                _EqualityDelete(
                    entry.sequence_number,
                    entry.spec_id,
                    entry.partition,
                    not specs[entry.spec_id].fields,
                    names,
                    keys,
                )
            )
    return deletes


def position_deletes(table: Table, snapshot_id: int) -> dict[str, tuple[set[int], RefEntry | None]]:
    """For each live data file: the positions a DV or position deletes delete, and its DV's entry.

    What a format-v3 writer merges into the file's next deletion vector.
    """
    entries = snapshot_entries(table, snapshot_id)
    deletes = _deletes(table, entries)
    return {e.file_path: deletes.positions_of(e) for e in entries if e.content == DATA}


def live_files(table: Table, snapshot_id: int) -> list[tuple[RefEntry, pa.Table, list[bool]]]:
    """Each live data file of the snapshot: its entry, all its rows (current schema), which are live."""
    entries = snapshot_entries(table, snapshot_id)
    deletes = _deletes(table, entries)
    out = []
    for entry in entries:
        if entry.content != DATA:
            continue
        rows = _file_rows(table, entry)
        gone, _ = deletes.positions_of(entry)
        scope = deletes.equality_for(entry)
        live = [
            i not in gone and not any(tuple(_comparable(row[n]) for n in d.names) in d.keys for d in scope)
            for i, row in enumerate(rows.to_pylist())
        ]
        out.append((entry, rows, live))
    return out


def live_state(table: Table, snapshot_id: int) -> pa.Table:
    """The snapshot's live rows, in the table's current schema."""
    schema = table.schema().as_arrow()
    parts = [rows.filter(pa.array(live, pa.bool_())) for _, rows, live in live_files(table, snapshot_id)]
    return pa.concat_tables([p.cast(schema) for p in parts]) if parts else schema.empty_table()

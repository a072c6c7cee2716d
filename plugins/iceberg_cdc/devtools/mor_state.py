"""A table's rows at a snapshot with every delete file applied: a reference reader for replay checks.

pyiceberg 0.12 applies position deletes in its scans but refuses equality
deletes, so replay checks on merge-on-read tables (the tests, the demo, the
bench) need another way to read a snapshot's state. This one is written apart
from the pipeline's own delete handling (row by row, Python sets, the spec's
rules stated plainly), so the two can disagree; it is for small tables only:

* a position delete ``(file_path, pos)`` with data sequence number >= the
  data file's removes that row;
* an equality delete with a data sequence number > the data file's, in an
  unpartitioned spec or in the data file's spec and partition, removes every
  row whose key columns equal one of its rows (None equals None).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.manifest import DataFileContent, ManifestEntry
from pyiceberg.table import FileScanTask, Table

from iceberg_cdc.devtools.cow import read_task_rows


def snapshot_entries(table: Table, snapshot_id: int) -> list[ManifestEntry]:
    """Every live manifest entry of the snapshot, data and delete files alike."""
    snapshot = table.snapshot_by_id(snapshot_id)
    assert snapshot is not None, f"snapshot {snapshot_id} not in {table.name()}"
    return [
        e
        for m in snapshot.manifests(table.io)
        for e in m.fetch_manifest_entry(table.io, discard_deleted=True)
    ]


def _partition(entry: ManifestEntry) -> tuple:
    partition = entry.data_file.partition
    return tuple(partition[i] for i in range(len(partition)))


def has_equality_deletes(table: Table, snapshot_id: int) -> bool:
    return any(
        e.data_file.content == DataFileContent.EQUALITY_DELETES for e in snapshot_entries(table, snapshot_id)
    )


def live_files(table: Table, snapshot_id: int) -> list[tuple[ManifestEntry, pa.Table, list[bool]]]:
    """Each live data file of the snapshot: its entry, all its rows (current schema), which are live."""
    entries = snapshot_entries(table, snapshot_id)
    positions: dict[str, list[tuple[int, int]]] = {}  # data file path -> (delete seq, pos)
    equality = []  # (seq, spec id, partition, global, column names, key set)
    schema = table.schema()
    specs = table.specs()
    for entry in entries:
        delete_file, seq = entry.data_file, int(entry.sequence_number or 0)
        if delete_file.content == DataFileContent.DATA:
            continue
        with table.io.new_input(delete_file.file_path).open() as stream:
            if delete_file.content == DataFileContent.POSITION_DELETES:
                for row in pq.read_table(stream, columns=["file_path", "pos"]).to_pylist():
                    positions.setdefault(row["file_path"], []).append((seq, row["pos"]))
            else:
                names = [schema.find_column_name(i) for i in delete_file.equality_ids]
                keys = {tuple(r[n] for n in names) for r in pq.read_table(stream).to_pylist()}
                unpartitioned = not specs[delete_file.spec_id].fields
                equality.append((seq, delete_file.spec_id, _partition(entry), unpartitioned, names, keys))
    out = []
    for entry in entries:
        data_file, seq = entry.data_file, int(entry.sequence_number or 0)
        if data_file.content != DataFileContent.DATA:
            continue
        rows = read_task_rows(table, FileScanTask(data_file))
        gone = {pos for delete_seq, pos in positions.get(data_file.file_path, ()) if delete_seq >= seq}
        scope = [
            (names, keys)
            for delete_seq, spec_id, partition, unpartitioned, names, keys in equality
            if delete_seq > seq
            and (unpartitioned or (spec_id, partition) == (data_file.spec_id, _partition(entry)))
        ]
        live = [
            not (i in gone or any(tuple(row[n] for n in names) in keys for names, keys in scope))
            for i, row in enumerate(rows.to_pylist())
        ]
        out.append((entry, rows, live))
    return out


def live_state(table: Table, snapshot_id: int) -> pa.Table:
    """The snapshot's live rows, in the table's current schema."""
    parts = [rows.filter(pa.array(live, pa.bool_())) for _, rows, live in live_files(table, snapshot_id)]
    if not parts:
        return table.schema().as_arrow().empty_table()
    return pa.concat_tables(parts)

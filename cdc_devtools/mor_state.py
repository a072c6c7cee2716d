"""A table's rows at a snapshot with every delete file applied: a reference reader for replay checks.

pyiceberg 0.12 applies position deletes in its scans but refuses equality
deletes, so replay checks on merge-on-read tables (the tests, the demo, the
bench) need another way to read a snapshot's state. This one is written apart
from the pipeline's own delete handling (row by row, Python sets, the spec's
rules stated plainly), so the two can disagree; it is for small tables only:

* a position delete ``(file_path, pos)`` with data sequence number >= the
  data file's removes that row;
* a deletion vector (format v3) with data sequence number >= the data
  file's removes the positions it holds from its referenced data file, and
  then no position delete file applies to that data file (the DV holds them
  all); its blob is found through pyiceberg's own Puffin reader and Roaring
  decoder, not the pipeline's;
* an equality delete with a data sequence number > the data file's, in an
  unpartitioned spec or in the data file's spec and partition, removes every
  row whose key columns equal one of its rows (None equals None).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.manifest import DataFileContent, FileFormat, ManifestEntry
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.deletion_vector import deletion_vectors_from_puffin_file
from pyiceberg.table.puffin import PuffinFile

from cdc_devtools.cow import read_task_rows
from iceberg_cdc.source.manifests import manifest_entries, v3_field


def snapshot_entries(table: Table, snapshot_id: int) -> list[ManifestEntry]:
    """Every live manifest entry of the snapshot, data and delete files alike."""
    snapshot = table.snapshot_by_id(snapshot_id)
    assert snapshot is not None, f"snapshot {snapshot_id} not in {table.name()}"
    version = table.metadata.format_version
    return [e for m in snapshot.manifests(table.io) for e in manifest_entries(table.io, m, version)]


def _deletion_vector(table: Table, entry: ManifestEntry) -> tuple[str, set[int]]:
    """(referenced data file, positions) of a DV entry, read with pyiceberg's Puffin reader."""
    delete_file = entry.data_file
    with table.io.new_input(delete_file.file_path).open() as stream:
        puffin = PuffinFile(stream.read())
    (vector,) = [
        dv
        for blob, dv in zip(puffin.footer.blobs, deletion_vectors_from_puffin_file(puffin), strict=True)
        if blob.offset == v3_field(delete_file, "content_offset")
    ]
    assert vector.referenced_data_file == v3_field(delete_file, "referenced_data_file")
    return vector.referenced_data_file, set(vector.to_vector().to_pylist())


def _partition(entry: ManifestEntry) -> tuple:
    partition = entry.data_file.partition
    return tuple(partition[i] for i in range(len(partition)))


def needs_reference_reader(table: Table, snapshot_id: int) -> bool:
    """Whether pyiceberg's scan cannot be trusted for the snapshot: equality deletes, or deletion vectors.

    pyiceberg 0.12 refuses equality deletes, and applies every blob of a
    Puffin file it reads, including DVs the table has since replaced.
    """
    return any(
        e.data_file.content == DataFileContent.EQUALITY_DELETES
        or e.data_file.file_format == FileFormat.PUFFIN
        for e in snapshot_entries(table, snapshot_id)
    )


@dataclass
class _Deletes:
    """Every delete of one snapshot, as plain Python collections."""

    positions: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # data path -> (seq, pos)
    vectors: dict[str, tuple[int, set[int], ManifestEntry]] = field(default_factory=dict)  # data path -> DV
    equality: list[tuple] = field(default_factory=list)  # (seq, spec id, partition, global, names, keys)

    def positions_of(self, entry: ManifestEntry) -> tuple[set[int], ManifestEntry | None]:
        """Positions of the data file deleted by a DV or position deletes, and the DV entry if one applies."""
        data_file, seq = entry.data_file, int(entry.sequence_number or 0)
        dv_seq, dv, dv_entry = self.vectors.get(data_file.file_path, (-1, set(), None))
        if dv_seq >= seq:
            return dv, dv_entry
        return {
            pos for delete_seq, pos in self.positions.get(data_file.file_path, ()) if delete_seq >= seq
        }, None


def _deletes(table: Table, entries: list[ManifestEntry]) -> _Deletes:
    deletes = _Deletes()
    schema = table.schema()
    specs = table.specs()
    for entry in entries:
        delete_file, seq = entry.data_file, int(entry.sequence_number or 0)
        if delete_file.content == DataFileContent.DATA:
            continue
        if delete_file.file_format == FileFormat.PUFFIN:
            data_path, deleted = _deletion_vector(table, entry)
            assert data_path not in deletes.vectors, f"two deletion vectors for {data_path}"
            deletes.vectors[data_path] = (seq, deleted, entry)
            continue
        with table.io.new_input(delete_file.file_path).open() as stream:
            if delete_file.content == DataFileContent.POSITION_DELETES:
                for row in pq.read_table(stream, columns=["file_path", "pos"]).to_pylist():
                    deletes.positions.setdefault(row["file_path"], []).append((seq, row["pos"]))
            else:
                names = [schema.find_column_name(i) for i in delete_file.equality_ids]
                keys = {tuple(r[n] for n in names) for r in pq.read_table(stream).to_pylist()}
                unpartitioned = not specs[delete_file.spec_id].fields
                deletes.equality.append(
                    (seq, delete_file.spec_id, _partition(entry), unpartitioned, names, keys)
                )
    return deletes


def position_deletes(table: Table, snapshot_id: int) -> dict[str, tuple[set[int], ManifestEntry | None]]:
    """For each live data file: the positions a DV or position deletes delete, and its DV's entry.

    What a format-v3 writer merges into the file's next deletion vector.
    """
    entries = snapshot_entries(table, snapshot_id)
    deletes = _deletes(table, entries)
    return {
        e.data_file.file_path: deletes.positions_of(e)
        for e in entries
        if e.data_file.content == DataFileContent.DATA
    }


def live_files(table: Table, snapshot_id: int) -> list[tuple[ManifestEntry, pa.Table, list[bool]]]:
    """Each live data file of the snapshot: its entry, all its rows (current schema), which are live."""
    entries = snapshot_entries(table, snapshot_id)
    deletes = _deletes(table, entries)
    out = []
    for entry in entries:
        data_file, seq = entry.data_file, int(entry.sequence_number or 0)
        if data_file.content != DataFileContent.DATA:
            continue
        rows = read_task_rows(table, FileScanTask(data_file))
        gone, _ = deletes.positions_of(entry)
        scope = [
            (names, keys)
            for delete_seq, spec_id, partition, unpartitioned, names, keys in deletes.equality
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
    schema = table.schema().as_arrow()
    parts = [rows.filter(pa.array(live, pa.bool_())) for _, rows, live in live_files(table, snapshot_id)]
    return pa.concat_tables([p.cast(schema) for p in parts]) if parts else schema.empty_table()

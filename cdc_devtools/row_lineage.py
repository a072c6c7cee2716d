"""Row lineage on the test writers' format-v3 tables, written and read as the spec says.

pyiceberg 0.12 writes no v3 table and knows nothing of row lineage, so the
tests' writers (:mod:`cdc_devtools.mor`, :mod:`cdc_devtools.format_v3`)
do what a v3 engine does:

* every snapshot assigns ``first_row_id`` to the data manifests it writes
  (from the table's ``next-row-id``, advancing by each manifest's added and
  existing rows) and keeps the ids of the manifests it carries over; a
  manifest it rewrites writes the inherited ``first_row_id`` of its
  EXISTING and DELETED entries explicitly (as Iceberg's Java writer does),
  so rows keep their ids;
* a row moved to a new file (a copy-on-write rewrite, a compaction) is
  written with its ``_row_id`` and ``_last_updated_sequence_number`` as
  columns (field ids 2147483540 and 2147483539); a modified row keeps its
  ``_row_id`` and gets a null sequence number (the new commit's); new rows
  get nulls in both (:func:`write_data_files_with_lineage`).

:func:`row_lineage` reads every live row's lineage back row by row with the
spec's inheritance rules, apart from the pipeline's own reader
(:mod:`iceberg_cdc.source.lineage`), so tests can compare the two.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.avro.file import AvroFile
from pyiceberg.io.pyarrow import _dataframe_to_data_files
from pyiceberg.manifest import (
    MANIFEST_LIST_FILE_SCHEMAS,
    DataFile,
    DataFileContent,
    ManifestContent,
    ManifestFile,
    PartitionFieldSummary,
)
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import LongType, NestedField

from cdc_devtools.format_v3 import v3_value
from cdc_devtools.reference_manifests import manifest_file_entries

ROW_ID = NestedField(2147483540, "_row_id", LongType(), required=False)
LAST_UPDATED = NestedField(2147483539, "_last_updated_sequence_number", LongType(), required=False)
Lineage = tuple[int | None, int | None]  # (_row_id, _last_updated_sequence_number) of one row
_FIRST_ROW_ID = [f.field_id for f in MANIFEST_LIST_FILE_SCHEMAS[3].fields].index(520)


def manifest_first_row_ids(table: Table, snapshot_id: int) -> dict[str, int | None]:
    """Manifest path -> ``first_row_id`` in the snapshot's (v3) manifest list."""
    snapshot = table.snapshot_by_id(snapshot_id)
    assert snapshot is not None
    with AvroFile[ManifestFile](
        table.io.new_input(snapshot.manifest_list),
        MANIFEST_LIST_FILE_SCHEMAS[3],
        read_types={-1: ManifestFile, 508: PartitionFieldSummary},
        read_enums={517: ManifestContent},
    ) as reader:
        return {m.manifest_path: m[_FIRST_ROW_ID] if len(m) > _FIRST_ROW_ID else None for m in reader}


def inherited_first_row_ids(table: Table, snapshot_id: int) -> dict[str, int | None]:
    """Live data file path -> its ``first_row_id``, explicit or inherited from its manifest."""
    snapshot = table.snapshot_by_id(snapshot_id)
    assert snapshot is not None
    firsts = manifest_first_row_ids(table, snapshot_id) if table.metadata.format_version >= 3 else {}
    out: dict[str, int | None] = {}
    for manifest in snapshot.manifests(table.io):
        if manifest.content != ManifestContent.DATA:
            continue
        next_id = firsts.get(manifest.manifest_path)
        for entry in manifest_file_entries(table.io, manifest, table.metadata.format_version):
            explicit = v3_value(entry.data_file, "first_row_id")
            if explicit is not None:
                out[entry.data_file.file_path] = int(explicit)
            else:
                out[entry.data_file.file_path] = next_id
                if next_id is not None:
                    next_id += int(entry.data_file.record_count)
    return out


def _physical(table: Table, path: str, field_id: int) -> list[int | None] | None:
    """The column with ``field_id`` in the Parquet file, or None when the file has no such column."""
    with table.io.new_input(path).open() as stream:
        parquet = pq.ParquetFile(stream)
        for index, field in enumerate(parquet.schema_arrow):
            if (field.metadata or {}).get(b"PARQUET:field_id") == str(field_id).encode():
                return parquet.read(columns=[parquet.schema_arrow.names[index]]).column(0).to_pylist()
    return None


def row_lineage(table: Table, snapshot_id: int) -> dict[str, list[Lineage]]:
    """Data file path -> the lineage of each of its rows (by position), every row, live or not."""
    snapshot = table.snapshot_by_id(snapshot_id)
    assert snapshot is not None
    firsts = inherited_first_row_ids(table, snapshot_id)
    out: dict[str, list[Lineage]] = {}
    for manifest in snapshot.manifests(table.io):
        if manifest.content != ManifestContent.DATA:
            continue
        for entry in manifest_file_entries(table.io, manifest, table.metadata.format_version):
            data_file = entry.data_file
            path, rows = data_file.file_path, int(data_file.record_count)
            ids = _physical(table, path, ROW_ID.field_id) or [None] * rows
            seqs = _physical(table, path, LAST_UPDATED.field_id) or [None] * rows
            first = firsts.get(path)
            out[path] = [
                (
                    row_id if row_id is not None else (None if first is None else first + pos),
                    seq if seq is not None else entry.sequence_number,
                )
                for pos, (row_id, seq) in enumerate(zip(ids, seqs, strict=True))
            ]
    return out


def write_data_files_with_lineage(table: Table, rows: pa.Table, lineage: Sequence[Lineage]) -> list[DataFile]:
    """``rows`` as new data files (partitioned by the spec) carrying their ``_row_id`` and sequence number.

    Written by pyiceberg's own writer against the table's schema with the two
    lineage fields added, so their field ids, statistics and partitioning are
    pyiceberg's.
    """
    if not rows.num_rows:
        return []
    schema = table.schema()
    extended = Schema(*schema.fields, ROW_ID, LAST_UPDATED, schema_id=schema.schema_id)
    schemas = [extended if s.schema_id == schema.schema_id else s for s in table.metadata.schemas]
    metadata = table.metadata.model_copy(update={"schemas": schemas})
    data = rows.cast(schema.as_arrow())
    data = data.append_column(ROW_ID.name, pa.array([lin[0] for lin in lineage], pa.int64()))
    data = data.append_column(LAST_UPDATED.name, pa.array([lin[1] for lin in lineage], pa.int64()))
    files = list(_dataframe_to_data_files(metadata, data.cast(extended.as_arrow()), table.io))
    for data_file in files:
        data_file.spec_id = table.metadata.default_spec_id
        assert data_file.content == DataFileContent.DATA
    return files

"""Merge-on-read changes to an Iceberg table, committed the way Spark and Flink commit them.

pyiceberg 0.12 writes no delete files, yet the pipeline must be tested (and
demonstrated, and benchmarked) on tables written by engines that do. This
module writes them with the spec's layouts and commits them through
manifests, as a ``RowDelta`` does:

* **position delete files** (Spark ``MERGE``/``UPDATE``/``DELETE`` in
  merge-on-read mode): Parquet with ``file_path`` (field id 2147483546) and
  ``pos`` (2147483545), sorted by path and position, in the partition of the
  data files they name, with bounds on ``file_path`` as Spark writes them;
* **equality delete files** (Flink upserts): Parquet with the key columns
  (their field ids), ``equality_ids`` in the manifest entry, column bounds
  and null counts computed like pyiceberg's data files;
* :func:`commit_row_delta`: ONE snapshot that adds data and delete files and
  removes data and delete files, rewriting only the manifests that held a
  removed file (kept entries become EXISTING, removed ones DELETED in a
  manifest of the same content). New entries inherit the commit's sequence
  number, so an equality delete committed together with new rows does not
  apply to them, as in a Flink checkpoint. On a format-v3 table the manifests,
  manifest list and metadata are v3 (:mod:`cdc_devtools.format_v3`),
  and a removed file is named by path and blob offset, since one Puffin file
  holds many deletion vectors.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.conversions import to_bytes
from pyiceberg.io.pyarrow import (
    _dataframe_to_data_files,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
    prune_columns,
    schema_to_pyarrow,
)
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriterV2,
)
from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.update import AddSnapshotUpdate, AssertRefSnapshotId, SetSnapshotRefUpdate
from pyiceberg.table.update.snapshot import _new_manifest_list_file_name, _SnapshotProducer
from pyiceberg.typedef import EMPTY_DICT, Record
from pyiceberg.types import LongType

from cdc_devtools.format_v3 import (
    ManifestListWriterV3,
    ManifestWriterV3,
    as_v3,
    deletion_vector_files,
    is_v3,
    v3_value,
    writing_v3_metadata,
)
from cdc_devtools.mor_state import live_files, position_deletes
from cdc_devtools.reference_manifests import manifest_file_entries
from cdc_devtools.row_lineage import inherited_first_row_ids, manifest_first_row_ids

# The spec's reserved field ids of a position delete file's columns.
POSITION_PATH_FIELD_ID = 2147483546
POSITION_POS_FIELD_ID = 2147483545
_POSITION_SCHEMA = pa.schema(
    [
        pa.field(
            "file_path",
            pa.string(),
            nullable=False,
            metadata={"PARQUET:field_id": str(POSITION_PATH_FIELD_ID)},
        ),
        pa.field(
            "pos", pa.int64(), nullable=False, metadata={"PARQUET:field_id": str(POSITION_POS_FIELD_ID)}
        ),
    ]
)


def write_data_files(table: Table, rows: pa.Table) -> list[DataFile]:
    """``rows`` as new data files of the table (partitioned by its spec), not yet committed."""
    if not rows.num_rows:
        return []
    files = list(_dataframe_to_data_files(table.metadata, rows.cast(table.schema().as_arrow()), table.io))
    for data_file in files:
        data_file.spec_id = table.metadata.default_spec_id
    return files


def _write_parquet(table: Table, prefix: str, rows: pa.Table) -> tuple[str, pq.FileMetaData, int]:
    path = f"{table.location()}/data/{prefix}-{uuid.uuid4().hex}.parquet"
    with (
        table.io.new_output(path).create(overwrite=False) as stream,
        pq.ParquetWriter(stream, rows.schema) as writer,
    ):
        writer.write_table(rows)
    written = table.io.new_input(path)
    with written.open() as stream:
        metadata = pq.ParquetFile(stream).metadata
    return path, metadata, len(written)


def position_delete_file(table: Table, data_file: DataFile, positions: Sequence[int]) -> DataFile:
    """A position delete file naming ``positions`` of one data file, in that file's partition."""
    ordered = sorted(set(int(p) for p in positions))
    rows = pa.Table.from_arrays(
        [pa.array([data_file.file_path] * len(ordered), pa.string()), pa.array(ordered, pa.int64())],
        schema=_POSITION_SCHEMA,
    )
    path, _, size = _write_parquet(table, "pos-deletes", rows)
    encoded = data_file.file_path.encode()
    delete_file = DataFile.from_args(
        _table_format_version=table.metadata.format_version,
        content=DataFileContent.POSITION_DELETES,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=data_file.partition,
        record_count=len(ordered),
        file_size_in_bytes=size,
        value_counts={POSITION_PATH_FIELD_ID: len(ordered), POSITION_POS_FIELD_ID: len(ordered)},
        null_value_counts={POSITION_PATH_FIELD_ID: 0, POSITION_POS_FIELD_ID: 0},
        lower_bounds={
            POSITION_PATH_FIELD_ID: encoded,
            POSITION_POS_FIELD_ID: to_bytes(LongType(), ordered[0]),
        }
        if ordered
        else {},
        upper_bounds={
            POSITION_PATH_FIELD_ID: encoded,
            POSITION_POS_FIELD_ID: to_bytes(LongType(), ordered[-1]),
        }
        if ordered
        else {},
    )
    delete_file.spec_id = data_file.spec_id
    return delete_file


def equality_delete_file(
    table: Table,
    keys: pa.Table,
    *,
    spec_id: int | None = None,
    partition: Record | None = None,
) -> DataFile:
    """An equality delete file on the columns of ``keys`` (named as in the table's schema).

    ``spec_id``/``partition``: the partition it is scoped to (default: the
    table's default spec with an empty partition, i.e. global when that spec
    is unpartitioned, as Flink writes an unpartitioned table's deletes).
    """
    schema = table.schema()
    field_ids = [schema.find_field(name).field_id for name in keys.column_names]
    key_schema = prune_columns(schema, set(field_ids), select_full_types=False)
    rows = keys.cast(schema_to_pyarrow(key_schema))
    path, metadata, size = _write_parquet(table, "eq-deletes", rows)
    stats = data_file_statistics_from_parquet_metadata(
        metadata,
        compute_statistics_plan(key_schema, table.properties),
        parquet_path_to_id_mapping(key_schema),
    )
    spec = table.specs()[spec_id if spec_id is not None else table.metadata.default_spec_id]
    delete_file = DataFile.from_args(
        _table_format_version=table.metadata.format_version,
        content=DataFileContent.EQUALITY_DELETES,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=partition if partition is not None else Record(*([None] * len(spec.fields))),
        file_size_in_bytes=size,
        equality_ids=field_ids,
        **stats.to_serialized_dict(),
    )
    delete_file.spec_id = spec.spec_id
    return delete_file


class _DeleteManifestWriter(ManifestWriterV2):
    """pyiceberg's v2 manifest writer, writing a delete manifest (content = deletes)."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


class _RowDelta(_SnapshotProducer["_RowDelta"]):
    """One snapshot adding and removing data and delete files (see the module doc)."""

    def __init__(
        self,
        *,
        add: Sequence[DataFile],
        remove: Sequence[DataFile],
        operation: Operation,
        transaction,
        io,
    ) -> None:
        super().__init__(operation=operation, transaction=transaction, io=io)
        self._v3 = transaction.table_metadata.format_version >= 3
        self._add = [as_v3(f) for f in add] if self._v3 else list(add)
        self._remove = {_file_key(f) for f in remove}

    def _deleted_entries(self) -> list[ManifestEntry]:
        return []

    def _existing_manifests(self) -> list[ManifestFile]:
        return []

    def _writer(self, content: ManifestContent, spec_id: int):
        spec = self._transaction.table_metadata.specs()[spec_id]
        if self._v3:
            return ManifestWriterV3(
                spec,
                self.schema(),
                self.new_manifest_output(),
                self._snapshot_id,
                self._compression,
                content=content,
            )
        if content == ManifestContent.DELETES:
            return _DeleteManifestWriter(
                spec, self.schema(), self.new_manifest_output(), self._snapshot_id, self._compression
            )
        return self.new_manifest_writer(spec)

    def _manifests(self) -> list[ManifestFile]:
        manifests: list[ManifestFile] = []
        removed: set[tuple[str, int | None]] = set()
        metadata = self._transaction.table_metadata
        parent = metadata.snapshot_by_id(self._parent_snapshot_id) if self._parent_snapshot_id else None
        # Rows keep their ids: a rewritten manifest writes its files' inherited first_row_id.
        first_ids = (
            inherited_first_row_ids(self._transaction._table, parent.snapshot_id)
            if self._v3 and parent
            else {}
        )
        for manifest in parent.manifests(self._io) if parent else ():
            entries = manifest_file_entries(self._io, manifest, metadata.format_version)
            hit = [e for e in entries if _file_key(e.data_file) in self._remove]
            if not hit:
                manifests.append(manifest)
                continue
            with self._writer(manifest.content, manifest.partition_spec_id) as writer:
                for entry in entries:
                    gone = _file_key(entry.data_file) in self._remove
                    first = (
                        first_ids.get(entry.data_file.file_path)
                        if manifest.content == ManifestContent.DATA
                        else None
                    )
                    writer.add_entry(
                        ManifestEntry.from_args(
                            status=ManifestEntryStatus.DELETED if gone else ManifestEntryStatus.EXISTING,
                            snapshot_id=self._snapshot_id if gone else entry.snapshot_id,
                            sequence_number=entry.sequence_number,
                            file_sequence_number=entry.file_sequence_number,
                            data_file=as_v3(entry.data_file, first) if self._v3 else entry.data_file,
                        )
                    )
                    if gone:
                        removed.add(_file_key(entry.data_file))
            manifests.append(writer.to_manifest_file())
        missing = self._remove - removed
        if missing:
            raise ValueError(f"cannot remove files that are not live: {sorted(missing)[:3]}")
        groups: dict[tuple[ManifestContent, int], list[DataFile]] = {}
        for data_file in self._add:
            content = (
                ManifestContent.DATA if data_file.content == DataFileContent.DATA else ManifestContent.DELETES
            )
            groups.setdefault((content, data_file.spec_id), []).append(data_file)
        for (content, spec_id), files in sorted(groups.items(), key=lambda kv: (kv[0][0].value, kv[0][1])):
            with self._writer(content, spec_id) as writer:
                for data_file in files:
                    writer.add(
                        ManifestEntry.from_args(
                            status=ManifestEntryStatus.ADDED,
                            snapshot_id=self._snapshot_id,
                            sequence_number=None,
                            file_sequence_number=None,
                            data_file=data_file,
                        )
                    )
            manifests.append(writer.to_manifest_file())
        return manifests

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        return Summary(operation=self._operation, **snapshot_properties)

    def _commit(self):
        """pyiceberg's commit, with a v3 manifest list and row-lineage fields on v3 tables."""
        if not self._v3:
            return super()._commit()
        metadata = self._transaction.table_metadata
        manifests = self._manifests()
        sequence_number = metadata.next_sequence_number()
        name = _new_manifest_list_file_name(
            snapshot_id=self._snapshot_id, attempt=0, commit_uuid=self.commit_uuid
        )
        path = self._transaction._table.location_provider().new_metadata_location(name)
        parent = self._parent_snapshot_id
        table = self._transaction._table
        with ManifestListWriterV3(
            self._io.new_output(path),
            self._snapshot_id,
            self._parent_snapshot_id,
            sequence_number,
            self._compression,
            next_row_id=metadata.next_row_id or 0,
            first_row_ids=manifest_first_row_ids(table, parent) if parent is not None else {},
        ) as writer:
            writer.add_manifests(manifests)
        added_rows = writer.assigned_rows
        snapshot = Snapshot(
            snapshot_id=self._snapshot_id,
            parent_snapshot_id=self._parent_snapshot_id,
            manifest_list=path,
            sequence_number=sequence_number,
            summary=self._summary(self.snapshot_properties),
            schema_id=metadata.current_schema_id,
            first_row_id=metadata.next_row_id or 0,
            added_rows=added_rows,
        )
        main = metadata.refs.get(MAIN_BRANCH)
        return (
            (
                AddSnapshotUpdate(snapshot=snapshot),
                SetSnapshotRefUpdate(
                    snapshot_id=self._snapshot_id,
                    parent_snapshot_id=self._parent_snapshot_id,
                    ref_name=MAIN_BRANCH,
                    type=SnapshotRefType.BRANCH,
                ),
            ),
            (AssertRefSnapshotId(snapshot_id=main.snapshot_id if main else None, ref=MAIN_BRANCH),),
        )


def _file_key(data_file: DataFile) -> tuple[str, int | None]:
    """A file in a manifest: its path, and for a deletion vector its blob's offset in the Puffin file."""
    return data_file.file_path, v3_value(data_file, "content_offset")


def commit_row_delta(
    table: Table,
    *,
    add: Sequence[DataFile] = (),
    remove: Sequence[DataFile] = (),
    operation: Operation = Operation.OVERWRITE,
) -> int:
    """Commit one snapshot that adds ``add`` and removes ``remove`` (data and delete files alike).

    Returns the new snapshot id. ``operation``: ``delete`` for deletes only,
    ``overwrite`` for a row delta with data (Spark and Flink), ``replace``
    for a compaction, ``append`` for data only.
    """
    with (
        writing_v3_metadata() if is_v3(table) else contextlib.nullcontext(),
        table.transaction() as tx,
        _RowDelta(add=add, remove=remove, operation=operation, transaction=tx, io=table.io),
    ):
        pass
    table.refresh()
    return table.current_snapshot().snapshot_id


@dataclass
class _LiveFile:
    data_file: DataFile
    rows: pa.Table  # every row of the file, current schema
    live: np.ndarray  # which rows are live
    deleted_positions: np.ndarray  # positions a DV or position deletes delete (not equality deletes)
    vector: DataFile | None  # the file's deletion vector entry, if it has one


def _live_files(table: Table) -> list[_LiveFile]:
    """Each live data file with its rows and which of them are live (the reference reader's rules).

    Never the pipeline's delete handling: a bug there must not shape the histories it is tested on.
    """
    snapshot = table.current_snapshot()
    if snapshot is None:
        return []
    deleted = position_deletes(table, snapshot.snapshot_id)
    out = []
    for entry, rows, live in live_files(table, snapshot.snapshot_id):
        positions, vector = deleted[entry.file_path]
        out.append(
            _LiveFile(
                entry.data_file,
                rows,
                np.asarray(live, dtype=bool),
                np.asarray(sorted(positions), dtype=np.int64),
                vector.data_file if vector is not None else None,
            )
        )
    return out


def _partition_key(data_file: DataFile) -> tuple:
    return tuple(data_file.partition[i] for i in range(len(data_file.partition)))


def mor_merge(
    table: Table,
    *,
    upserts: pa.Table | None = None,
    delete_keys: Sequence = (),
    key: str = "id",
    deletes: str = "position",
) -> int | None:
    """Apply upserts and deletes by ``key`` as ONE merge-on-read snapshot.

    ``deletes="position"``: as Spark's MERGE / UPDATE / DELETE with
    ``write.*.mode=merge-on-read`` (position deletes of the old rows, one file
    per data file touched; on a format-v3 table, one Puffin file with a
    deletion vector per data file touched, each merging the file's earlier
    deletes and replacing its earlier DV). ``"equality"``: as a Flink upsert (equality
    deletes on ``key``, one file per partition of the rows replaced). The new
    rows join the same commit. Returns the new snapshot id, or None.
    """
    schema = table.schema().as_arrow()
    upserts = upserts.cast(schema) if upserts is not None else schema.empty_table()
    affected = pa.concat_arrays(
        [upserts.column(key).combine_chunks(), pa.array(list(delete_keys), schema.field(key).type)]
    )
    if not len(affected):
        return None
    add: list[DataFile] = []
    remove: list[DataFile] = []
    vectors: dict[str, tuple[DataFile, np.ndarray]] = {}
    by_partition: dict[tuple, tuple[DataFile, list]] = {}
    for live_file in _live_files(table):
        data_file, rows = live_file.data_file, live_file.rows
        hit = pc.is_in(rows.column(key), value_set=affected).to_numpy(zero_copy_only=False) & live_file.live
        if not hit.any():
            continue
        if deletes == "position" and is_v3(table):
            # A v3 writer's DV holds the file's earlier deleted positions too and replaces its old DV.
            vectors[data_file.file_path] = (
                data_file,
                np.union1d(live_file.deleted_positions, np.flatnonzero(hit)),
            )
            if live_file.vector is not None:
                remove.append(live_file.vector)
        elif deletes == "position":
            add.append(position_delete_file(table, data_file, np.flatnonzero(hit).tolist()))
        else:
            slot = by_partition.setdefault((data_file.spec_id, _partition_key(data_file)), (data_file, []))
            slot[1].extend(rows.column(key).filter(pa.array(hit)).to_pylist())
    for data_file, keys in by_partition.values():
        add.append(
            equality_delete_file(
                table,
                pa.table({key: pa.array(keys, schema.field(key).type)}),
                spec_id=data_file.spec_id,
                partition=data_file.partition,
            )
        )
    add.extend(deletion_vector_files(table, vectors))
    add.extend(write_data_files(table, upserts))
    if not add:
        return None
    operation = Operation.OVERWRITE if upserts.num_rows else Operation.DELETE
    return commit_row_delta(table, add=add, remove=remove, operation=operation)

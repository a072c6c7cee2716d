"""Real Iceberg tables for tests: a SQLite catalog on local files, and snapshots made the way engines make them.

pyiceberg cannot write ``replace`` snapshots or delete files, and its own
``delete`` / ``overwrite`` spread one change over several snapshots. The
helpers here build those snapshots from pyiceberg's snapshot producers, so the
manifests are exactly what pyiceberg writes:

* :func:`cow_rewrite` — one copy-on-write snapshot that removes files and adds
  rewritten ones (what Spark's MERGE / UPDATE / DELETE commit);
* :func:`replace_files` — a compaction (operation ``replace``);
* :func:`add_position_deletes` — a merge-on-read position delete file in a
  delete manifest (what Spark commits with ``write.delete.mode=merge-on-read``).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import _dataframe_to_data_files
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
from pyiceberg.table.snapshots import Operation, Summary
from pyiceberg.table.update.snapshot import _FastAppendFiles, _OverwriteFiles
from pyiceberg.typedef import EMPTY_DICT, Record

from iceberg_cdc.devtools.cow import rewrite_files

NAMESPACE = "db"


def sql_catalog(tmp_path: Path, name: str = "test") -> SqlCatalog:
    """A SQLite catalog with its warehouse under ``tmp_path`` and the namespace ``db``."""
    catalog = SqlCatalog(name, uri=f"sqlite:///{tmp_path}/cat.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace(NAMESPACE)
    return catalog


def orders(ids: list[int], note: str = "v1") -> pa.Table:
    """A small two-column table: ``id`` (long) and ``note`` (string)."""
    return pa.table(
        {"id": pa.array(ids, pa.int64()), "note": pa.array([f"{note}-{i}" for i in ids], pa.string())}
    )


def create_table(
    catalog: SqlCatalog, name: str, schema: pa.Schema | None = None, properties: dict[str, str] | None = None
) -> Table:
    return catalog.create_table(
        f"{NAMESPACE}.{name}", schema=schema or orders([]).schema, properties=properties or {}
    )


def live_files(table: Table) -> list[DataFile]:
    """The current snapshot's live data files, in path order."""
    return sorted((task.file for task in table.scan().plan_files()), key=lambda f: f.file_path)


def current_id(table: Table) -> int:
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return snapshot.snapshot_id


def write_data_files(table: Table, df: pa.Table) -> list[DataFile]:
    """Write ``df`` as data files of ``table`` (not committed), as an engine would before a commit."""
    return list(_dataframe_to_data_files(table.metadata, df, table.io))


def cow_rewrite(table: Table, remove: list[DataFile], add: pa.Table | None) -> int:
    """One copy-on-write snapshot (operation ``overwrite``) that removes ``remove`` and adds ``add``'s rows."""
    rewrite_files(table, remove, add)
    return current_id(table)


class _ReplaceFiles(_OverwriteFiles):
    """An overwrite committed as operation ``replace``.

    pyiceberg's summary update rejects ``replace`` ("Operation not
    implemented"), so the summary is computed as for an overwrite and relabelled.
    """

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        self._operation = Operation.OVERWRITE
        try:
            summary = super()._summary(snapshot_properties)
        finally:
            self._operation = Operation.REPLACE
        return Summary(Operation.REPLACE, **summary.additional_properties)


def replace_files(table: Table, remove: list[DataFile], add: pa.Table) -> int:
    """A compaction: operation ``replace``, same rows in new files."""
    rewrite_files(
        table,
        remove,
        add,
        producer=lambda tx: _ReplaceFiles(operation=Operation.REPLACE, transaction=tx, io=table.io),
    )
    return current_id(table)


class _DeleteManifestWriter(ManifestWriterV2):
    """pyiceberg's v2 manifest writer, writing a delete manifest (content = deletes)."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


class _AddDeleteFiles(_FastAppendFiles):
    """A fast append that also adds delete files in a delete manifest."""

    def __init__(self, delete_files: list[DataFile], **kwargs) -> None:
        super().__init__(**kwargs)
        self._delete_files = delete_files

    def _manifests(self) -> list[ManifestFile]:
        manifests = super()._manifests()
        metadata = self._transaction.table_metadata
        writer = _DeleteManifestWriter(
            metadata.spec(),
            metadata.schema(),
            self.new_manifest_output(),
            self._snapshot_id,
            self._compression,
        )
        with writer:
            for delete_file in self._delete_files:
                writer.add(
                    ManifestEntry.from_args(
                        status=ManifestEntryStatus.ADDED,
                        snapshot_id=self._snapshot_id,
                        sequence_number=None,
                        file_sequence_number=None,
                        data_file=delete_file,
                    )
                )
        return [*manifests, writer.to_manifest_file()]


def _commit_delete_file(
    table: Table, prefix: str, rows: pa.Table, content: DataFileContent, **extra
) -> tuple[int, str]:
    """Write ``rows`` as one delete file and commit it in a delete manifest. Returns (snapshot id, path)."""
    path = f"{table.location()}/data/{prefix}-{uuid.uuid4().hex}.parquet"
    local = path.removeprefix("file://")
    pq.write_table(rows, local)
    delete_file = DataFile.from_args(
        content=content,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=rows.num_rows,
        file_size_in_bytes=Path(local).stat().st_size,
        **extra,
    )
    delete_file.spec_id = table.metadata.default_spec_id
    with table.transaction() as tx:
        producer = _AddDeleteFiles([delete_file], operation=Operation.DELETE, transaction=tx, io=table.io)
        with producer:
            pass
    return current_id(table), path


def add_position_deletes(table: Table, data_file_path: str, positions: list[int]) -> tuple[int, str]:
    """A merge-on-read DELETE: one position delete file for ``data_file_path``. Returns (snapshot id, path)."""
    deletes = pa.table(
        {
            "file_path": pa.array([data_file_path] * len(positions), pa.string()),
            "pos": pa.array(positions, pa.int64()),
        }
    )
    return _commit_delete_file(table, "pos-deletes", deletes, DataFileContent.POSITION_DELETES)


def add_equality_deletes(table: Table, ids: list[int], column: str = "id") -> tuple[int, str]:
    """A merge-on-read DELETE by key: one equality delete file on ``column``, as Flink or Spark write it."""
    return _commit_delete_file(
        table,
        "eq-deletes",
        pa.table({column: pa.array(ids, pa.int64())}),
        DataFileContent.EQUALITY_DELETES,
        equality_ids=[table.schema().find_field(column).field_id],
    )

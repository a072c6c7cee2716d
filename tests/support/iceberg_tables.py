"""Real Iceberg tables for tests: a SQLite catalog on local files, and snapshots made the way engines make them.

pyiceberg cannot write ``replace`` snapshots or delete files, and its own
``delete`` / ``overwrite`` spread one change over several snapshots. The
helpers here build those snapshots from pyiceberg's snapshot producers, so the
manifests are exactly what pyiceberg writes:

* :func:`cow_rewrite` — one copy-on-write snapshot that removes files and adds
  rewritten ones (what Spark's MERGE / UPDATE / DELETE commit);
* :func:`replace_files` — a compaction (operation ``replace``);
* :func:`add_position_deletes` / :func:`add_equality_deletes` — merge-on-read
  delete files (what Spark commits with ``write.delete.mode=merge-on-read``,
  and Flink upserts), through :mod:`cdc_devtools.mor`;
* :func:`add_deletion_vector` — a format-v3 deletion vector (the table is
  upgraded to v3 first), through :mod:`cdc_devtools.format_v3`;
* :func:`add_orc_position_deletes` — an ORC delete file entry (refused).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import _dataframe_to_data_files
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
)
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation, Summary
from pyiceberg.table.update.snapshot import _OverwriteFiles
from pyiceberg.typedef import EMPTY_DICT

from cdc_devtools import format_v3, mor
from cdc_devtools.cow import rewrite_files

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


def add_position_deletes(table: Table, data_file_path: str, positions: list[int]) -> tuple[int, str]:
    """A merge-on-read DELETE: one position delete file for ``data_file_path``. Returns (snapshot id, path)."""
    (data_file,) = [f for f in live_files(table) if f.file_path == data_file_path]
    delete_file = mor.position_delete_file(table, data_file, positions)
    return mor.commit_row_delta(table, add=[delete_file], operation=Operation.DELETE), delete_file.file_path


def add_equality_deletes(table: Table, ids: list[int], column: str = "id") -> tuple[int, str]:
    """A merge-on-read DELETE by key: one equality delete file on ``column``, as Flink or Spark write it."""
    keys = pa.table({column: pa.array(ids, pa.int64())})
    delete_file = mor.equality_delete_file(table, keys)
    return mor.commit_row_delta(table, add=[delete_file], operation=Operation.DELETE), delete_file.file_path


def add_deletion_vector(table: Table, data_file_path: str, positions: list[int]) -> tuple[Table, int, str]:
    """A merge-on-read DELETE on format v3: a DV for one data file, the table upgraded first if needed.

    Returns (the v3 table, snapshot id, Puffin path).
    """
    table = format_v3.upgrade_to_v3(table)
    (data_file,) = [f for f in live_files(table) if f.file_path == data_file_path]
    (dv,) = format_v3.deletion_vector_files(table, {data_file_path: (data_file, positions)})
    return table, mor.commit_row_delta(table, add=[dv], operation=Operation.DELETE), dv.file_path


def add_orc_position_deletes(table: Table, data_file: DataFile) -> tuple[int, str]:
    """An ORC position delete entry for ``data_file``: what the pipeline does not read.

    Only the manifest entry matters to the pipeline's planning, which refuses
    it before the file is read; the file holds a placeholder.
    """
    path = f"{table.location()}/data/pos-deletes-{uuid.uuid4().hex}.orc"
    with table.io.new_output(path).create() as stream:
        stream.write(b"ORC")
    delete_file = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=path,
        file_format=FileFormat.ORC,
        partition=data_file.partition,
        record_count=1,
        file_size_in_bytes=3,
    )
    delete_file.spec_id = data_file.spec_id
    return mor.commit_row_delta(table, add=[delete_file], operation=Operation.DELETE), path

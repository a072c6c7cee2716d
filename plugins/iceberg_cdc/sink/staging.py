"""Staged change files: Parquet written by read tasks, waiting for the commit.

Read tasks run on Spark executors that have FileIO properties but no catalog,
so a staged file is written through pyiceberg's ``FileIO`` (``s3://`` and
``file://`` alike) straight into the sink table's data location::

    <sink location>/data/_staged/snapshot=<source snapshot id>/<attempt>/<name>.parquet

The commit then adds these very files to the sink -- no copy. ``<attempt>`` is
the run's lease epoch and names are unique per task attempt: a committed file
must never be written again (Java readers locate the footer from the size the
manifest records), so no retry, cleared run or reprocess may reuse a name;
:func:`write_staged_file` refuses to overwrite. A retried task leaves its
earlier file behind unreferenced, and cleanup deletes it.

Cleanup (:func:`delete_uncommitted_staged`) deletes the staged files of a
snapshot that no sink snapshot references. Because they sit under the table's
location, Iceberg's own orphan-file removal is a second safety net for what a
crash leaves behind.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import IO, Any, cast

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.manifest import ManifestContent
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata

from iceberg_cdc.sink.table import SOURCE_SNAPSHOT_ID_KEY, summary_properties
from iceberg_cdc.storage import ObjectStore, open_store

STAGED_DIR = "data/_staged"
PARQUET_COMPRESSION = "zstd"
ROW_GROUP_ROWS = 1024 * 1024  # pyiceberg's write.parquet.row-group-limit default
DICTIONARY_SAMPLE_ROWS = 16384  # rows of the first batch that decide which columns get a dictionary


@dataclass(frozen=True)
class StagedFile:
    """A staged Parquet file as written: what the commit task needs to know about it."""

    path: str
    record_count: int
    file_size: int


def staging_root(sink_location: str) -> str:
    """``<sink location>/data/_staged``: every staged file of the sink lives below it."""
    return f"{sink_location.rstrip('/')}/{STAGED_DIR}"


def staged_prefix(sink_location: str, source_snapshot_id: int) -> str:
    """The directory of one source snapshot's staged files (ends with ``/``)."""
    return f"{staging_root(sink_location)}/snapshot={source_snapshot_id}/"


def staged_file_path(
    sink_location: str, source_snapshot_id: int, name: str, *, attempt: str | None = None
) -> str:
    """Where the staged file ``name`` of a source snapshot goes (in the run's ``attempt`` directory)."""
    for part in (name, attempt):
        if part is not None and (not part or "/" in part):
            raise ValueError(f"staged file name part {part!r} must be non-empty and contain no '/'")
    directory = f"{attempt}/" if attempt else ""
    return f"{staged_prefix(sink_location, source_snapshot_id)}{directory}{name}.parquet"


def dictionary_columns(batch: pa.RecordBatch) -> list[str]:
    """The top-level primitive columns worth a dictionary: at most half as many distinct values as rows.

    Decided on a sample of the first batch, as parquet-mr keeps a dictionary
    only where the first page shows it pays. Arrow otherwise hashes every
    value of every column (ids, timestamps, free text) into a dictionary it
    drops at 1 MiB: a third of the write's time for no smaller file. Nested
    columns are written plain.
    """
    sample = batch.slice(0, DICTIONARY_SAMPLE_ROWS)
    return [
        field.name
        for field, column in zip(sample.schema, sample.columns, strict=True)
        if not pa.types.is_nested(field.type) and _repeats(column)
    ]


def _repeats(column: pa.Array) -> bool:
    """At most half as many distinct values as rows (extension types, e.g. UUIDs, by their storage)."""
    if isinstance(column, pa.ExtensionArray):
        column = column.storage
    try:
        distinct = pc.count_distinct(column, mode="all").as_py()
    except pa.ArrowNotImplementedError:
        return False
    return 2 * distinct <= len(column)


def write_staged_file(
    io: FileIO,
    path: str,
    data: pa.Table | Iterable[pa.RecordBatch],
    schema: pa.Schema | None = None,
) -> StagedFile:
    """Write change rows (already in the sink's Arrow schema) as one zstd Parquet file.

    ``data`` is a table or an iterable of record batches; batches are written
    as they come, so a task never needs all its rows in memory (``schema`` is
    then required unless the first batch may define it). An existing file at
    ``path`` is an error: committed files must never be rewritten. The Arrow schema's field ids become the Parquet field ids, which the commit
    relies on.
    """
    if isinstance(data, pa.Table):
        schema = schema or data.schema
        batches: Iterable[pa.RecordBatch] = data.to_batches()
    else:
        batches = data
    iterator = iter(batches)
    first = next(iterator, None)
    if schema is None:
        if first is None:
            raise ValueError(f"nothing to write to {path}: no batches and no schema")
        schema = first.schema
    records = 0
    stream = io.new_output(path).create(overwrite=False)
    try:
        writer = pq.ParquetWriter(
            cast(IO[Any], stream),
            schema=schema,
            compression=PARQUET_COMPRESSION,
            use_dictionary=dictionary_columns(first) if first is not None else False,
            store_decimal_as_integer=True,  # as pyiceberg and Iceberg Java write decimals
        )
        try:
            for batch in _chain(first, iterator):
                if batch.num_rows:
                    writer.write_batch(batch, row_group_size=ROW_GROUP_ROWS)
                    records += batch.num_rows
        finally:
            writer.close()
        size = stream.tell()
    except BaseException:
        # A failed write publishes nothing where the stream can abort (the retrying FileIO's
        # spooled upload); elsewhere the partial file stays unreferenced and cleanup removes it.
        abort = getattr(stream, "abort", None)
        if callable(abort):
            abort()
        else:
            stream.close()
        raise
    stream.close()
    return StagedFile(path=path, record_count=records, file_size=size)


def _chain(first: pa.RecordBatch | None, rest: Iterable[pa.RecordBatch]) -> Iterable[pa.RecordBatch]:
    if first is not None:
        yield first
    yield from rest


# ----------------------------------------------------------------------------- cleanup


def _store_uri(location: str) -> str:
    """The object-store URI of a table location (bare paths are local; s3a/s3n are S3)."""
    if location.startswith("/"):
        return f"file://{location}"
    for scheme in ("s3a://", "s3n://"):
        if location.startswith(scheme):
            return "s3://" + location[len(scheme) :]
    return location


def staging_store(sink_location: str, properties: Mapping[str, str] | None = None) -> ObjectStore:
    """An object store rooted at the sink's staging directory.

    ``properties`` are pyiceberg-style ``s3.*`` keys; pass the sink table's
    ``io.properties`` to use the catalog's.
    """
    return open_store(_store_uri(staging_root(sink_location)), properties)


def list_staged(
    sink_location: str,
    source_snapshot_id: int,
    *,
    store: ObjectStore | None = None,
    properties: Mapping[str, str] | None = None,
    attempt: str | None = None,
) -> list[StagedFile]:
    """Every staged file of one source snapshot, as full paths in the table location's form.

    ``record_count`` is unknown from a listing and reported as -1. Only
    ``.parquet`` objects count: S3 "directory" marker objects (``.../``, which
    pyarrow's S3 file system leaves behind when it deletes a directory's last
    file) are not staged files.
    """
    store = store or staging_store(sink_location, properties)
    root = staging_root(sink_location)
    return [
        StagedFile(path=f"{root}/{info.key}", record_count=-1, file_size=info.size)
        for info in store.list(_snapshot_dir(source_snapshot_id, attempt))
        if info.key.endswith(".parquet")
    ]


def _snapshot_dir(source_snapshot_id: int, attempt: str | None = None) -> str:
    return f"snapshot={source_snapshot_id}/" + (f"{attempt}/" if attempt else "")


def delete_uncommitted_staged(
    sink_table: Table,
    source_snapshot_id: int,
    *,
    store: ObjectStore | None = None,
    properties: Mapping[str, str] | None = None,
    attempt: str | None = None,
) -> list[str]:
    """Delete the staged files of a snapshot (of one ``attempt``, or all) that no sink snapshot references.

    Files added by a sink commit are kept while any retained sink snapshot
    references them (time travel; Iceberg's snapshot expiry deletes them when
    the time comes). Must not run concurrently with a commit of the same
    snapshot -- the per-table lease guarantees that: a file committed between
    this function's look at the table and its delete would be lost.
    """
    location = sink_table.location()
    store = store or staging_store(
        location, properties if properties is not None else sink_table.io.properties
    )
    staged = list_staged(location, source_snapshot_id, store=store, attempt=attempt)
    if not staged:
        return []
    sink_table.refresh()  # after listing: any commit that made a listed file live is seen
    referenced = referenced_staged_paths(sink_table, source_snapshot_id, {f.path for f in staged})
    doomed = [f.path for f in staged if f.path not in referenced]
    if len(doomed) == len(staged):
        store.delete_prefix(_snapshot_dir(source_snapshot_id, attempt))  # the whole directory, markers too
        return doomed
    root_length = len(staging_root(location)) + 1
    keys = [f.path[root_length:] for f in staged]
    for path in doomed:
        key = path[root_length:]
        if any(other != key and other.startswith(key) for other in keys):
            # the store deletes by prefix; this key is a prefix of a file to keep
            sink_table.io.delete(path)
        else:
            store.delete_prefix(key)
    return doomed


def referenced_staged_paths(sink_table: Table, source_snapshot_id: int, candidates: set[str]) -> set[str]:
    """Which of ``candidates`` (staged paths of one snapshot) some retained sink snapshot references.

    Cheap in the usual case: only the sink commits marked with this source
    snapshot add its staged files, so reading the manifests those commits added
    settles it. When the sink's history has been expired, the commit that added
    a file may be gone while the file is still live, so the remaining
    candidates are then looked up in every manifest of every retained snapshot.
    """
    metadata = sink_table.metadata
    io = sink_table.io
    snapshots = metadata.snapshots
    referenced: set[str] = set()
    for snapshot in snapshots:
        if summary_properties(snapshot).get(SOURCE_SNAPSHOT_ID_KEY) != str(source_snapshot_id):
            continue
        for manifest in snapshot.manifests(io):
            if (
                manifest.added_snapshot_id == snapshot.snapshot_id
                and manifest.content == ManifestContent.DATA
            ):
                referenced.update(
                    _paths_in(manifest.fetch_manifest_entry(io, discard_deleted=False), candidates)
                )
    remaining = candidates - referenced
    if remaining and _history_truncated(metadata):
        seen: set[str] = set()
        for snapshot in snapshots:
            for manifest in snapshot.manifests(io):
                if manifest.manifest_path in seen or manifest.content != ManifestContent.DATA:
                    continue
                seen.add(manifest.manifest_path)
                referenced.update(
                    _paths_in(manifest.fetch_manifest_entry(io, discard_deleted=False), remaining)
                )
    return referenced


def _paths_in(entries: Iterable[Any], candidates: set[str]) -> set[str]:
    return {e.data_file.file_path for e in entries if e.data_file.file_path in candidates}


def _history_truncated(metadata: TableMetadata) -> bool:
    """True unless every snapshot the table ever committed is still in its metadata.

    A snapshot whose parent is gone gives expiry away, but pyiceberg's own
    ``expire_snapshots`` also clears the survivors' parent ids. Sequence
    numbers do not lie: a v2 table numbers its snapshots 1, 2, 3, ... so any
    missing number is an expired snapshot. v1 tables have none: assume expiry.
    """
    snapshots = metadata.snapshots
    ids = {s.snapshot_id for s in snapshots}
    if any(s.parent_snapshot_id is not None and s.parent_snapshot_id not in ids for s in snapshots):
        return True
    if metadata.format_version < 2:
        return bool(snapshots)
    numbers = {s.sequence_number for s in snapshots}
    return any(n not in numbers for n in range(1, metadata.last_sequence_number + 1))

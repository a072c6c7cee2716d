"""The two sides a verification reads, batch by batch, as canonical columns.

* the source table at the source snapshot the mirror's watermark names
  (pyiceberg scan, only the compared columns);
* the mirror: a PostgreSQL table (ADBC, one streamed ``SELECT`` of the
  compared columns in the forms :func:`.canonical.postgres_select` gives) or
  an Iceberg table (pyiceberg scan of its head snapshot).

Each batch comes back with its key hash, bucket and row hash (:mod:`.digest`),
so a side is read once per pass and never held whole.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.table import Table
from pyiceberg.types import IcebergType

from iceberg_cdc.mirror.postgres.connection import connect
from iceberg_cdc.mirror.postgres.types import qualified, quote
from iceberg_cdc.mirror.verify.canonical import canonical_column, is_json, json_column, postgres_select
from iceberg_cdc.mirror.verify.digest import bucket_of, fold_words, value_hashes


@dataclass(frozen=True)
class Columns:
    """What is compared: column names and Iceberg types (key columns first among ``names``' order)."""

    names: tuple[str, ...]
    types: dict[str, IcebergType]
    key: tuple[str, ...]
    json_nested: bool  # a PostgreSQL mirror: structs and maps compared as canonical JSON


@dataclass
class Hashed:
    """One batch of one side: its rows, their canonical keys, buckets and row hashes."""

    batch: pa.RecordBatch
    keys: list[pa.Array]
    buckets: np.ndarray
    row_hashes: np.ndarray


def hash_batch(batch: pa.RecordBatch, columns: Columns, buckets: int, *, from_postgres: bool) -> Hashed:
    canonical = {}
    for name in columns.names:
        typ = columns.types[name]
        if columns.json_nested and is_json(typ):
            canonical[name] = json_column(batch.column(name), typ, from_postgres=from_postgres)
        else:
            canonical[name] = canonical_column(batch.column(name), typ)
    words = {name: value_hashes(column) for name, column in canonical.items()}  # key columns hashed once
    return Hashed(
        batch,
        [canonical[k] for k in columns.key],
        bucket_of(fold_words([words[k] for k in columns.key], batch.num_rows), buckets),
        fold_words([words[n] for n in columns.names], batch.num_rows),
    )


# Hashing costs a few hundred NumPy calls per batch, each holding the GIL to start: scan batches are merged
# to this many rows first. At 262,144 (not 65,536) a side holds the GIL for about 5% of its hashing, not
# 20%, so the other side's thread runs meanwhile (measured with py-spy --gil).
MIN_BATCH_ROWS = 262_144


def rebatched(batches: Iterator[pa.RecordBatch], min_rows: int = MIN_BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """``batches`` merged into batches of at least ``min_rows`` rows (the last may be smaller)."""
    held: list[pa.RecordBatch] = []
    rows = 0
    for batch in batches:
        held.append(batch)
        rows += batch.num_rows
        if rows >= min_rows:
            yield _one(held)
            held, rows = [], 0
    if held:
        yield _one(held)


def _one(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    if len(batches) == 1:
        return batches[0]
    table = pa.Table.from_batches(batches).combine_chunks()
    return table.to_batches()[0] if table.num_rows else batches[0]


def iceberg_batches(table: Table, snapshot_id: int | None, names: Sequence[str]) -> Iterator[pa.RecordBatch]:
    """A pyiceberg table's rows at ``snapshot_id`` (None: its head), only ``names``, streamed."""
    if snapshot_id is None and table.current_snapshot() is None:
        return
    scan = table.scan(snapshot_id=snapshot_id, selected_fields=tuple(names))
    for batch in scan.to_arrow_batch_reader():
        if batch.num_rows:
            yield batch.select(list(names))


def postgres_batches(dsn: str, table: str, columns: Columns) -> Iterator[pa.RecordBatch]:
    """A PostgreSQL mirror's rows, only the compared columns, streamed from one ``SELECT``."""
    connection = connect(dsn)
    try:
        cursor = connection.cursor()
        select = ", ".join(
            f"{postgres_select(name, columns.types[name])} AS {quote(name)}" for name in columns.names
        )
        cursor.execute(f"SELECT {select} FROM {qualified(table)}")
        reader: Any = cursor.fetch_record_batch()
        for batch in reader:
            if batch.num_rows:
                yield batch
    finally:
        connection.close()


# ----------------------------------------------------------------------------- by key


def postgres_key(array: pa.Array | pa.ChunkedArray, typ: IcebergType) -> pa.Array:
    """A key column (as pyiceberg reads it) in the form :func:`.canonical.postgres_select` reads the mirror's."""
    from pyiceberg.types import DecimalType, UUIDType

    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if isinstance(array.type, pa.BaseExtensionType):
        array = array.storage
    if isinstance(typ, DecimalType) and pa.types.is_decimal(array.type):
        return pc.cast(array, pa.string())
    if isinstance(typ, UUIDType):
        return pc.cast(array, pa.binary())
    return array


def iceberg_rows_for_keys(
    table: Table, snapshot_id: int | None, columns: Columns, keys: pa.Table
) -> Iterator[pa.RecordBatch]:
    """The rows of ``table`` whose first key column is among ``keys``' (the scan prunes files by it)."""
    import uuid

    from pyiceberg.expressions import In
    from pyiceberg.types import UUIDType

    if snapshot_id is None and table.current_snapshot() is None:
        return
    first = columns.key[0]
    values = keys.column(first).unique().to_pylist()
    if isinstance(columns.types[first], UUIDType):
        values = [uuid.UUID(bytes=v) if isinstance(v, bytes) else v for v in values]
    scan = table.scan(snapshot_id=snapshot_id, selected_fields=columns.names, row_filter=In(first, values))
    for batch in scan.to_arrow_batch_reader():
        if batch.num_rows:
            yield batch


def postgres_rows_for_keys(
    dsn: str, table: str, columns: Columns, keys: pa.Table
) -> Iterator[pa.RecordBatch]:
    """A PostgreSQL mirror's rows whose key is among ``keys`` (in :func:`postgres_key` form), by one join."""
    connection = connect(dsn)
    try:
        cursor = connection.cursor()
        flat = pa.table({f"k{i}": keys.column(name) for i, name in enumerate(columns.key)})
        cursor.execute("DROP TABLE IF EXISTS pg_temp.cdc_verify_keys")
        cursor.adbc_ingest("cdc_verify_keys", flat, mode="create", temporary=True)
        select = ", ".join(
            f"{postgres_select(name, columns.types[name]).replace(quote(name), 'm.' + quote(name))} AS {quote(name)}"
            for name in columns.names
        )
        match = " AND ".join(
            f"{postgres_select(name, columns.types[name]).replace(quote(name), 'm.' + quote(name))} = k.k{i}"
            for i, name in enumerate(columns.key)
        )
        cursor.execute(
            f"SELECT {select} FROM {qualified(table)} AS m "
            f"JOIN (SELECT DISTINCT * FROM pg_temp.cdc_verify_keys) AS k ON {match}"
        )
        reader: Any = cursor.fetch_record_batch()
        for batch in reader:
            if batch.num_rows:
                yield batch
    finally:
        connection.close()

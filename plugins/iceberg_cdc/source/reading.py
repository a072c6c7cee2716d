"""Stream one data file's rows as Arrow batches in the shape of a snapshot's schema.

A snapshot's removed and added files were written under different schemas
(columns added, renamed, widened, dropped since), yet every row of a snapshot
must reach the shuffle in one shape, or the map tasks' outputs would not
agree. Iceberg resolves columns by *field id*, never by name, so this module
does what pyiceberg's own scan does: read the file's schema with its field ids
(``pyarrow_to_schema``, falling back to the table's name mapping for files
without ids), select the columns the target schema still has, and project
each batch with pyiceberg's projection visitor — renamed columns come out
under their new name, added columns as nulls (or their initial default),
promoted types (int -> long, float -> double, decimal precision) cast, dropped
columns gone.

**Null lists and maps stay null.** pyiceberg 0.12's projection rebuilds a
``list<struct>`` and a ``map<_, struct>`` from its offsets and children without
the validity bitmap, so a null list or map comes out as an empty one
(apache/iceberg-python#3833; the same loss hits pyiceberg's own scans and
writes). A change feed must not turn null into ``[]``: the projection here is
pyiceberg's visitor with the parent's nulls carried over
(:class:`~iceberg_cdc.pyiceberg_internals.projection.NullKeepingProjection`).

Why not ``ArrowScan`` / ``_task_to_record_batches`` as a whole: they need the
table metadata (absent on executors) and read through a dataset scanner that
has no batch-size setting and reads up to 16 batches ahead with whole row
groups pre-buffered, so memory follows the file, not the batch. Here the file
is read with ``pyarrow.parquet.ParquetFile.iter_batches`` (one row group's
selected columns decoded at a time, no pre-buffering of the whole file) and
the same pyiceberg projection is applied per batch.

**Output schema.** Every batch has exactly :func:`output_schema` — pyiceberg's
``schema_to_pyarrow(schema, include_field_ids=False)``: large string / binary /
list types, nullability from the Iceberg fields, no field-id metadata. A file
written with ``string`` comes out ``large_string``, so all files of a snapshot
give identical schemas. It is what pyiceberg's own ``to_table`` produces for
an empty scan, so downstream code sees one convention.

**Files without field ids** (tables migrated from Hive, files registered
with ``add_files``) are resolved by name through the table's name mapping
(``schema.name-mapping.default``: :func:`table_name_mapping_json` on the
planner, :func:`name_mapping_from_json` on executors), as pyiceberg's scan
does. Such files often lack their **identity-partition columns**: a Hive
layout keeps those only in the directory names. The spec's column projection
rule fills a column the file lacks with the file's identity-partition value
(pyiceberg: ``_get_column_projection_values``); here the planner carries each
file's values (:func:`partition_value_to_json`, keyed by source field id) and
:func:`read_data_file` hands them to pyiceberg's projection as constants.

Executors have no catalog: they get the path, the schema as JSON
(:func:`schema_to_json` / :func:`schema_from_json`), the name mapping and
partition values in JSON form, and FileIO properties (:func:`file_io`).
"""

from __future__ import annotations

import datetime as dt
import math
import uuid
from collections.abc import Collection, Generator, Iterator, Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO, load_file_io
from pyiceberg.schema import Schema
from pyiceberg.table.name_mapping import NameMapping, parse_mapping_from_json
from pyiceberg.types import (
    BinaryType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    ListType,
    MapType,
    TimestampNanoType,
    TimestamptzNanoType,
    UUIDType,
)
from pyiceberg.utils.datetime import date_to_days, time_to_micros

from iceberg_cdc.errors import ConfigError
from iceberg_cdc.pyiceberg_internals.arrow_schema import from_arrow_schema, select_columns, to_arrow_schema
from iceberg_cdc.pyiceberg_internals.projection import project_batch

if TYPE_CHECKING:
    from pyiceberg.table import Table

NAME_MAPPING_PROPERTY = "schema.name-mapping.default"

# Column chunks are read through a buffered stream of this size instead of
# being pre-buffered whole, which keeps memory near one row group's columns.
_READ_BUFFER_BYTES = 8 * 1024 * 1024

# A batch holds about this many bytes of the uncompressed data of the columns read (Arrow's decoded
# form is larger: strings from dictionaries, offsets). Each batch costs a pass of pyiceberg's
# projection in Python and a chunk for every later gather to walk; 64 k rows of a narrow table
# spent a tenth of the read on that (docs/benchmarks.md).
BATCH_BYTES = 16 * 1024 * 1024
MIN_BATCH_ROWS = 4096
MAX_BATCH_ROWS = 1 << 20


def schema_to_json(schema: Schema) -> str:
    """The schema in Iceberg's JSON form (field ids included), to ship to executors."""
    return schema.model_dump_json()


def schema_from_json(text: str) -> Schema:
    return Schema.model_validate_json(text)


def table_name_mapping_json(table: Table) -> str | None:
    """The table's name mapping (``schema.name-mapping.default``) as JSON, checked to parse; ``None`` without one.

    The planner puts it into the snapshot plan: executors need it to read
    files without field ids and have no catalog to look it up. A mapping that
    does not parse fails here, at planning, naming the table and the property,
    rather than in every write task.
    """
    text = table.properties.get(NAME_MAPPING_PROPERTY)
    if text is None:
        return None
    try:
        parse_mapping_from_json(text)
    except ValueError as error:
        raise ConfigError(
            f"table {'.'.join(table.name())}: property {NAME_MAPPING_PROPERTY} is not a valid Iceberg name "
            f"mapping ({error}). Fix the property (Spark: ALTER TABLE ... SET TBLPROPERTIES; pyiceberg: "
            "table.transaction().set_properties(...)), or remove it if every data file has field ids."
        ) from None
    return text


def name_mapping_from_json(text: str | None) -> NameMapping | None:
    """The :class:`NameMapping` from :func:`table_name_mapping_json`'s text (``None`` stays ``None``)."""
    return None if text is None else parse_mapping_from_json(text)


def partition_value_to_json(value: Any) -> Any:
    """A partition value from a manifest (pyiceberg's ``Record`` form) as a JSON value.

    Numbers, strings and booleans stay as they are (dates, times and
    timestamps are already ints there); decimals and UUIDs become strings,
    binary and fixed values hex strings, non-finite floats ``"NaN"`` /
    ``"Infinity"`` / ``"-Infinity"`` (strict JSON has no such numbers).
    :func:`partition_value_from_json` turns it back using the field's type.
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value).replace("inf", "Infinity").replace("nan", "NaN")
    if isinstance(value, Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dt.datetime):  # before date: a datetime is a date
        raise TypeError(
            f"partition value {value!r}: expected microseconds as int, as pyiceberg's manifests hold"
        )
    if isinstance(value, dt.date):
        return date_to_days(value)
    if isinstance(value, dt.time):
        return time_to_micros(value)
    raise TypeError(f"partition value {value!r} of type {type(value).__name__} has no JSON form here")


def partition_value_from_json(field_type: IcebergType, value: Any) -> Any:
    """The value :func:`partition_value_to_json` made, as pyiceberg's projection takes it for ``field_type``."""
    if value is None:
        return None
    if isinstance(field_type, DecimalType):
        return Decimal(value)
    if isinstance(field_type, BinaryType | FixedType):
        return bytes.fromhex(value)
    if isinstance(field_type, UUIDType):
        return uuid.UUID(value)
    if isinstance(field_type, FloatType | DoubleType):
        return float(value)
    return value


def _constant_columns(
    schema: Schema, file_schema: Schema, partition_values: Mapping[int, Any] | None
) -> dict[int, Any]:
    """Field id -> value for the identity-partition columns ``schema`` wants and the file lacks.

    The spec's column projection rule, as pyiceberg's ``_get_column_projection_values``:
    a column present in the file is always read from it.
    """
    if not partition_values:
        return {}
    wanted = set(schema.field_ids) - set(file_schema.field_ids)
    return {
        field_id: partition_value_from_json(schema.find_type(field_id), value)
        for field_id, value in partition_values.items()
        if field_id in wanted and value is not None
    }


def file_io(properties: Mapping[str, str], location: str | None = None) -> FileIO:
    """A pyiceberg FileIO from catalog-style properties (``s3.endpoint``, credentials, ``py-io-impl``)."""
    return load_file_io(dict(properties), location)


def output_schema(schema: Schema) -> pa.Schema:
    """The Arrow schema of every batch :func:`read_data_file` yields for ``schema``."""
    return to_arrow_schema(schema, include_field_ids=False)


def _has_nanosecond_timestamps(schema: Schema) -> bool:
    nanos = (TimestampNanoType, TimestamptzNanoType)
    return any(isinstance(schema.find_type(i), nanos) for i in schema.field_ids)


def _projected_field_ids(schema: Schema) -> set[int]:
    """Field ids to select from a file, as pyiceberg's ArrowScan does: map and list ids come with their parents."""
    return {i for i in schema.field_ids if not isinstance(schema.find_type(i), (MapType, ListType))}


def batch_rows(
    metadata: pq.FileMetaData, columns: Collection[str] | None = None, target_bytes: int | None = None
) -> int:
    """Rows per batch for a file: ``target_bytes`` (:data:`BATCH_BYTES`) of the uncompressed data
    of the top-level ``columns`` read (all by default), within bounds.

    Counting only what is read keeps a key-only read of a wide table from tiny batches.
    """
    target_bytes = BATCH_BYTES if target_bytes is None else target_bytes
    size = 0
    for i in range(metadata.num_row_groups):
        group = metadata.row_group(i)
        for j in range(group.num_columns):
            chunk = group.column(j)
            if columns is None or chunk.path_in_schema.split(".", 1)[0] in columns:
                size += chunk.total_uncompressed_size
    per_row = max(size / metadata.num_rows, 1.0) if metadata.num_rows else 1.0
    return int(min(MAX_BATCH_ROWS, max(MIN_BATCH_ROWS, target_bytes // per_row)))


def read_data_file(
    io: FileIO,
    path: str,
    schema: Schema,
    batch_size: int | None = None,
    *,
    name_mapping: NameMapping | None = None,
    partition_values: Mapping[int, Any] | None = None,
    positions: np.ndarray | None = None,
) -> Generator[pa.RecordBatch, None, int]:
    """Yield the rows of the Parquet data file at ``path`` projected onto ``schema``, at most ``batch_size`` rows each.

    ``batch_size`` ``None``: :func:`batch_rows` of the file (about :data:`BATCH_BYTES` a batch).

    ``positions`` (sorted, distinct): yield only the rows at those positions,
    reading only the row groups that hold one (a merge-on-read update of a
    few rows of a big file then decodes a fraction of it). Returns the
    file's row count from its footer, for conservation.

    ``schema`` is the snapshot's schema. ``name_mapping`` (the table's
    ``schema.name-mapping.default``) is needed only for files written without
    field ids (e.g. imported with ``add_files``). ``partition_values`` (the
    file's identity-partition values by source field id, in the JSON form of
    :func:`partition_value_to_json`) fill the columns the file lacks, as a
    Hive-layout file lacks its partition columns; without them such columns
    come out null. Delete files are not applied here
    (:mod:`iceberg_cdc.source.delete_filter` applies them).
    """
    if batch_size is not None and batch_size <= 0:
        raise ValueError(f"batch_size must be positive, not {batch_size}")
    target = output_schema(schema)
    # Iceberg v1/v2 timestamps are microseconds; files from other writers may hold nanoseconds.
    downcast_ns = not _has_nanosecond_timestamps(schema)
    with io.new_input(path).open() as stream:
        parquet = pq.ParquetFile(stream, buffer_size=_READ_BUFFER_BYTES, pre_buffer=False)
        try:
            file_schema = from_arrow_schema(
                parquet.schema_arrow, name_mapping, downcast_ns_timestamp_to_us=downcast_ns, format_version=3
            )
        except ValueError as error:
            if name_mapping is None:
                hint = (
                    "Files without Parquet field ids (migrated from Hive, registered with add_files) are "
                    f"matched by name through the table's {NAME_MAPPING_PROPERTY} property, and none was "
                    "given: set it on the table (Spark's migrate / add_files procedures and pyiceberg's "
                    "add_files set it) so the plan carries it."
                )
            else:
                hint = (
                    f"The table's {NAME_MAPPING_PROPERTY} property does not name every column of the file: "
                    "add the missing names to the mapping (under the field id of the column they stand for)."
                )
            raise ConfigError(f"cannot resolve the columns of data file {path}: {error}. {hint}") from error
        file_projection = select_columns(file_schema, _projected_field_ids(schema))
        columns = [field.name for field in file_projection.columns]
        constants = _constant_columns(schema, file_schema, partition_values)
        rows = batch_size or batch_rows(parquet.metadata, set(columns))
        for batch in _raw_batches(parquet, columns, rows, positions):
            if batch.num_rows == 0:
                continue
            projected = project_batch(
                schema, file_projection, batch, downcast_ns=downcast_ns, constants=constants
            )
            if not projected.schema.equals(target, check_metadata=True):
                projected = projected.cast(target)
            yield projected
        return parquet.metadata.num_rows


def _raw_batches(
    parquet: pq.ParquetFile, columns: list[str], batch_size: int, positions: np.ndarray | None
) -> Iterator[pa.RecordBatch]:
    """The file's batches (one decoding thread: a Spark task owns one core), or only rows at ``positions``."""
    if positions is None:
        yield from parquet.iter_batches(batch_size=batch_size, columns=columns, use_threads=False)
        return
    metadata = parquet.metadata
    starts = np.cumsum([0] + [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)])
    wanted = positions[(positions >= 0) & (positions < starts[-1])]
    groups = np.searchsorted(starts, wanted, side="right") - 1
    for group in np.unique(groups):
        offset = int(starts[group])
        in_group = wanted[groups == group]
        for batch in parquet.iter_batches(
            batch_size=batch_size, row_groups=[int(group)], columns=columns, use_threads=False
        ):
            lo, hi = np.searchsorted(in_group, [offset, offset + batch.num_rows])
            if hi > lo:
                yield batch.take(pa.array(in_group[lo:hi] - offset))
            offset += batch.num_rows

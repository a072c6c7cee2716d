"""Iceberg ``DataFile`` entries for staged Parquet files, from their footers.

pyiceberg's ``add_files`` is the obvious tool but does not fit. Older releases
refused any file carrying field ids; since apache/iceberg-python#2662 (in
0.12) it accepts them, but it still maps Parquet columns to ids through the table's *current*
column names, writes a name-mapping property into the table, and its
duplicate check reads every manifest of the table on each commit. Staged files
carry the sink's field ids, so this module does what
``parquet_file_to_data_file`` does, keyed by those ids instead:

1. read the footer through FileIO and turn its Arrow schema (field ids in the
   field metadata) into an Iceberg schema of the *file*;
2. check each file column against the sink column with the same id: same type
   (``fixed[16]`` also stands for ``uuid``: pyarrow may read Parquet's UUID back that way), no
   column the sink does not have, no required sink column missing;
3. map Parquet column paths to ids with the file's schema and compute the
   statistics with pyiceberg's ``data_file_statistics_from_parquet_metadata``,
   the collectors built from the *table's* schema so bounds are serialized in
   the table's types (exactly what pyiceberg's own writer produces;
   :mod:`iceberg_cdc.pyiceberg_internals.datafiles`).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.types import FixedType, IcebergType, UUIDType

from iceberg_cdc.errors import SinkSchemaError
from iceberg_cdc.pyiceberg_internals.arrow_schema import from_arrow_schema
from iceberg_cdc.pyiceberg_internals.datafiles import data_file_from_footer

_FOOTER_READERS = 8


def _same_type(file_type: IcebergType, table_type: IcebergType) -> bool:
    if file_type.is_primitive or table_type.is_primitive:
        if file_type == table_type:
            return True
        return isinstance(table_type, UUIDType) and isinstance(file_type, FixedType) and len(file_type) == 16
    return type(file_type) is type(table_type)  # nested: children are checked by id


def _check_file_schema(path: str, file_schema: Schema, table_schema: Schema) -> None:
    problems = []
    for field_id in sorted(file_schema.field_ids):
        file_field = file_schema.find_field(field_id)
        try:
            table_field = table_schema.find_field(field_id)
        except ValueError:
            problems.append(
                f"column '{file_field.name}' has field id {field_id}, which the sink does not have"
            )
            continue
        if not _same_type(file_field.field_type, table_field.field_type):
            name = table_schema.find_column_name(field_id)
            problems.append(
                f"column '{name}' is {file_field.field_type} in the file, {table_field.field_type} in the sink"
            )
    present = file_schema.field_ids
    for table_field in table_schema.fields:
        if table_field.required and table_field.field_id not in present:
            problems.append(f"required sink column '{table_field.name}' is missing")
    if problems:
        raise SinkSchemaError(
            f"staged file {path} does not match the sink table's schema: {'; '.join(problems)}. "
            "It was written for another schema version: rerun the snapshot's read tasks"
        )


def data_file_from_parquet(io: FileIO, table_metadata: TableMetadata, path: str) -> DataFile:
    """A ``DataFile`` for a Parquet file that carries the sink's field ids."""
    input_file = io.new_input(path)
    with input_file.open() as stream:
        parquet_metadata = pq.read_metadata(stream)
    try:
        file_schema = from_arrow_schema(parquet_metadata.schema.to_arrow_schema())
    except ValueError as exc:
        raise SinkSchemaError(
            f"staged file {path} has columns without Iceberg field ids ({exc}); write staged files "
            "from to_sink_arrow's schema"
        ) from None
    _check_file_schema(path, file_schema, table_metadata.schema())
    return data_file_from_footer(path, parquet_metadata, file_schema, table_metadata, len(input_file))


def data_files_from_parquet(
    io: FileIO, table_metadata: TableMetadata, paths: Sequence[str]
) -> list[DataFile]:
    """``DataFile`` entries for many files; footers are read a few at a time (S3 latency)."""
    if len(paths) <= 1:
        return [data_file_from_parquet(io, table_metadata, p) for p in paths]
    with ThreadPoolExecutor(max_workers=min(_FOOTER_READERS, len(paths))) as pool:
        return list(pool.map(lambda p: data_file_from_parquet(io, table_metadata, p), paths))

"""A ``DataFile`` for a Parquet file from its footer, with statistics as pyiceberg's own writer computes them.

pyiceberg's ``add_files`` does this through ``parquet_file_to_data_file``,
but maps columns to field ids through the table's current names
(:mod:`iceberg_cdc.sink.datafiles` says why that does not fit). This module
repeats its last step, keyed by the file's own field ids, with three
functions of ``pyiceberg.io.pyarrow`` that are importable but not documented
(pinned by tests):

* ``compute_statistics_plan(schema, table_properties)`` -- which columns get
  bounds and how they are truncated (``write.metadata.metrics.*``);
* ``parquet_path_to_id_mapping(schema)`` -- Parquet column path -> field id;
* ``data_file_statistics_from_parquet_metadata(parquet_metadata=,
  stats_columns=, parquet_column_mapping=)`` -- the statistics, whose
  ``partition(spec, schema)`` and ``to_serialized_dict()`` give the
  ``DataFile`` fields (``record_count``, sizes, counts, bounds, ``split_offsets``);
* ``DataFile.from_args`` ignores a ``spec_id`` argument (not a field of the
  record): the spec id is the ``spec_id`` attribute, set after.

It also owns the one way to build a format-v3 ``DataFile`` record
(:func:`v3_data_file`): ``DataFile.from_args`` takes the struct's format
version as a private keyword, ``_table_format_version``, and defaults to
the v2 struct, which has no ``first_row_id`` / ``referenced_data_file`` /
``content_offset`` / ``content_size_in_bytes`` (a deletion vector's fields).
"""

from __future__ import annotations

from typing import Any

import pyarrow.parquet as pq
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata


def data_file_from_footer(
    path: str,
    parquet_metadata: pq.FileMetaData,
    file_schema: Schema,
    table_metadata: TableMetadata,
    file_size: int,
) -> DataFile:
    """The ``DataFile`` entry of the Parquet file at ``path`` for the table's default spec.

    ``file_schema`` is the file's own schema (field ids from its footer, checked
    against the table's by the caller); the bounds are serialized in the
    *table's* types, exactly as pyiceberg's writer serializes them.
    """
    table_schema = table_metadata.schema()
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=parquet_metadata,
        stats_columns=compute_statistics_plan(table_schema, table_metadata.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(file_schema),
    )
    data_file = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=statistics.partition(table_metadata.spec(), table_schema),
        file_size_in_bytes=file_size,
        sort_order_id=None,
        equality_ids=None,
        key_metadata=None,
        **statistics.to_serialized_dict(),
    )
    # Not a field of the record (from_args drops a spec_id argument): pyiceberg keeps it as an attribute.
    data_file.spec_id = table_metadata.default_spec_id
    return data_file


def v3_data_file(**fields: Any) -> DataFile:
    """A ``DataFile`` record of the format-v3 ``data_file`` struct (``DataFile.from_args(_table_format_version=3)``).

    Fields the struct does not name are dropped by pyiceberg (``spec_id`` is an
    attribute, set by the caller).
    """
    return DataFile.from_args(_table_format_version=3, **fields)

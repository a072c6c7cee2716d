"""Iceberg <-> Arrow schema conversion and column pruning, from ``pyiceberg.io.pyarrow``.

pyiceberg documents ``PyArrowFileIO`` but not the module's helper functions;
the reader, the sink and the mirrors need three of them, so they are reached
only through the functions here (pinned by
``tests/unit/test_pyiceberg_internals_arrow_schema.py``):

* ``schema_to_pyarrow(schema_or_type, include_field_ids=)`` -- the Arrow
  schema (or type) pyiceberg's own reader and writer use for an Iceberg
  schema (or type); its large string / binary / list choices are what
  :func:`iceberg_cdc.source.reading.output_schema` promises;
* ``pyarrow_to_schema(arrow, name_mapping, downcast_ns_timestamp_to_us=,
  format_version=)`` -- an Iceberg schema from a Parquet file's Arrow schema,
  by its field ids or, without them, through the table's name mapping;
* ``prune_columns(schema, field_ids, select_full_types=False)`` -- the
  sub-schema of some columns, keeping their field ids.
"""

from __future__ import annotations

import pyarrow as pa
from pyiceberg.io.pyarrow import prune_columns, pyarrow_to_schema, schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.table.name_mapping import NameMapping
from pyiceberg.typedef import TableVersion
from pyiceberg.types import IcebergType


def to_arrow_schema(schema: Schema, *, include_field_ids: bool) -> pa.Schema:
    """The Arrow schema pyiceberg reads and writes ``schema`` with (field ids as Parquet metadata if asked)."""
    return schema_to_pyarrow(schema, include_field_ids=include_field_ids)


def to_arrow_type(field_type: IcebergType) -> pa.DataType:
    """The Arrow type pyiceberg reads and writes a column of ``field_type`` with."""
    return schema_to_pyarrow(field_type)


def from_arrow_schema(
    arrow: pa.Schema,
    name_mapping: NameMapping | None = None,
    *,
    downcast_ns_timestamp_to_us: bool = False,
    format_version: TableVersion = 2,
) -> Schema:
    """The Iceberg schema of a Parquet file's Arrow schema; ValueError if a column has no field id and no mapped name."""
    return pyarrow_to_schema(
        arrow,
        name_mapping,
        downcast_ns_timestamp_to_us=downcast_ns_timestamp_to_us,
        format_version=format_version,
    )


def select_columns(schema: Schema, field_ids: set[int]) -> Schema:
    """The sub-schema of ``schema`` holding the columns ``field_ids``, with their structs around them.

    Ids name leaf columns: a struct's own id selects none of its fields
    (``select_full_types=False``), a list's or map's raises ValueError.
    """
    return prune_columns(schema, field_ids, select_full_types=False)

"""Project a data file's Arrow batch onto a snapshot's schema with pyiceberg's projection visitor.

:mod:`iceberg_cdc.source.reading` reads files batch by batch (pyiceberg's
``ArrowScan`` needs table metadata and reads whole row groups ahead) and
projects each batch the way pyiceberg's own scan does, by field id. That uses
``ArrowProjectionVisitor`` and ``ArrowAccessor`` from ``pyiceberg.io.pyarrow``
(importable, not documented) with ``visit_with_partner``, and relies on:

* the visitor's keyword arguments ``downcast_ns_timestamp_to_us``,
  ``allow_timestamp_tz_mismatch`` and ``projected_missing_fields`` (field id
  -> constant for a column the file lacks: identity-partition values);
* its ``list(list_type, list_array, value_array)`` and
  ``map(map_type, map_array, key_result, value_result)`` hooks, overridden
  here because pyiceberg 0.12 rebuilds a ``list<struct>`` or ``map<_, struct>``
  without the parent's validity bitmap: a null list or map comes out empty
  (apache/iceberg-python#3833). A change feed must not turn null into ``[]``,
  so :class:`NullKeepingProjection` puts the parent's nulls back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa
from pyiceberg.io.pyarrow import ArrowAccessor, ArrowProjectionVisitor
from pyiceberg.schema import Schema, visit_with_partner
from pyiceberg.types import ListType, MapType


class NullKeepingProjection(ArrowProjectionVisitor):
    """pyiceberg's projection, except that null lists and maps stay null instead of becoming empty."""

    def list(
        self, list_type: ListType, list_array: pa.Array | None, value_array: pa.Array | None
    ) -> pa.Array | None:
        result = super().list(list_type, list_array, value_array)
        if result is None or list_array is None or list_array.null_count == result.null_count:
            return result
        return type(result).from_arrays(
            result.offsets, result.values, type=result.type, mask=list_array.is_null()
        )

    def map(
        self,
        map_type: MapType,
        map_array: pa.Array | None,
        key_result: pa.Array | None,
        value_result: pa.Array | None,
    ) -> pa.Array | None:
        result = super().map(map_type, map_array, key_result, value_result)
        if result is None or map_array is None or map_array.null_count == result.null_count:
            return result
        return pa.MapArray.from_arrays(
            result.offsets, result.keys, result.items, type=result.type, mask=map_array.is_null()
        )


def project_batch(
    schema: Schema,
    file_schema: Schema,
    batch: pa.RecordBatch,
    *,
    downcast_ns: bool,
    constants: Mapping[int, Any],
) -> pa.RecordBatch:
    """``batch`` (columns of ``file_schema``) in ``schema``'s shape, resolved by field id.

    Renamed columns come out under their new name, columns the file lacks as
    ``constants[field_id]`` or null, promoted types cast, dropped columns gone.
    ``downcast_ns``: nanosecond timestamps in the file become microseconds
    (Iceberg v1/v2 timestamps). A ``timestamptz`` (UTC) file column may be read
    as ``timestamp``, as Spark reads it.
    """
    visitor = NullKeepingProjection(
        file_schema,
        downcast_ns_timestamp_to_us=downcast_ns,
        allow_timestamp_tz_mismatch=True,
        projected_missing_fields=dict(constants),
    )
    return pa.RecordBatch.from_struct_array(
        visit_with_partner(schema, batch, visitor, ArrowAccessor(file_schema))
    )

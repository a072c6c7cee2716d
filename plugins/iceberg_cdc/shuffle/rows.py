"""The shape of rows inside the shuffle: the table's columns plus an operation tag."""

from __future__ import annotations

import enum

import pyarrow as pa

from iceberg_cdc.errors import SinkSchemaError

OP_COLUMN = "__cdc_op"


class Op(enum.IntEnum):
    """Operation of a shuffled row: rows of removed files are DELETEs, of added files INSERTs."""

    DELETE = 0
    INSERT = 1


def shuffle_schema(data_schema: pa.Schema) -> pa.Schema:
    """Schema of shuffled batches: the data columns, then the int8 operation tag."""
    if OP_COLUMN in data_schema.names:
        raise SinkSchemaError(
            f"the source has a column named {OP_COLUMN!r}, the name the shuffle reserves for its operation "
            "tag: rename the source column (ALTER TABLE ... RENAME COLUMN)"
        )
    return data_schema.append(pa.field(OP_COLUMN, pa.int8(), nullable=False))

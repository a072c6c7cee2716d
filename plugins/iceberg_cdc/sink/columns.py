"""The sink's change columns: names, Iceberg types, docs, and the names they reserve.

The sink contract is every source column, then, in this order:

* ``_change_type`` -- ``INSERT``, ``DELETE``, ``UPDATE_BEFORE`` or ``UPDATE_AFTER``;
* ``_change_ordinal`` -- one value per source snapshot, increasing along the
  source's history (consumers read "everything after ordinal N");
* ``_commit_snapshot_id`` -- the source snapshot the row comes from;
* ``_commit_timestamp`` -- when that source snapshot was committed (its
  ``timestamp-ms``, as a ``timestamptz``), so consumers can read a time range
  as Delta's change feed and Spark's changelog API allow.

A sink made before ``_commit_timestamp`` existed gains it on its next run
(:func:`iceberg_cdc.sink.schema.evolve_sink_schema`), as an optional column:
Iceberg cannot add a required column to a table that has rows, and the rows
written before it hold null there. New sinks have it required.

Shared by schema derivation/evolution (:mod:`iceberg_cdc.sink.schema`) and the
Arrow conversion of change rows (:mod:`iceberg_cdc.sink.rows`), which is why it
is a module of its own.
"""

from __future__ import annotations

from pyiceberg.schema import Schema
from pyiceberg.types import IcebergType, IntegerType, LongType, StringType, TimestamptzType

from iceberg_cdc.changelog.change_types import CHANGE_TYPE_COLUMN
from iceberg_cdc.changelog.change_types import CHANGE_TYPES as CHANGE_TYPES  # the sink checks these values
from iceberg_cdc.errors import SinkSchemaError

CHANGE_TYPE = CHANGE_TYPE_COLUMN
CHANGE_ORDINAL = "_change_ordinal"
COMMIT_SNAPSHOT_ID = "_commit_snapshot_id"
COMMIT_TIMESTAMP = "_commit_timestamp"
CHANGE_COLUMNS = (CHANGE_TYPE, CHANGE_ORDINAL, COMMIT_SNAPSHOT_ID, COMMIT_TIMESTAMP)
# Change columns an older sink may lack: evolution adds them (optional) instead of refusing the sink.
ADDED_LATER = (COMMIT_TIMESTAMP,)

CHANGE_COLUMN_TYPES: dict[str, IcebergType] = {
    CHANGE_TYPE: StringType(),
    CHANGE_ORDINAL: IntegerType(),
    COMMIT_SNAPSHOT_ID: LongType(),
    COMMIT_TIMESTAMP: TimestamptzType(),
}
CHANGE_COLUMN_DOCS = {
    CHANGE_TYPE: "Kind of change: INSERT, DELETE, UPDATE_BEFORE or UPDATE_AFTER",
    CHANGE_ORDINAL: "Position of the source snapshot in the source table's history (increasing)",
    COMMIT_SNAPSHOT_ID: "Id of the source snapshot that made this change",
    COMMIT_TIMESTAMP: "When the source snapshot that made this change was committed",
}
FIX_NAME_CLASH = (
    "rename the source column (ALTER TABLE ... RENAME COLUMN) -- names starting with "
    "'_change_' and the names '_commit_snapshot_id' and '_commit_timestamp' are reserved for the "
    "sink's change columns"
)
FIX_CONFLICT = (
    "to fix, rename the sink column out of the way (ALTER TABLE <sink> RENAME COLUMN <col> TO <col>_old; "
    "the sink then gains a new column with the source's type) or drop and recreate the sink table "
    "and reset its watermark"
)


def check_no_reserved_names(source_schema: Schema) -> None:
    """A source column may not take a change column's name: the sink could not hold both."""
    clashes = [f.name for f in source_schema.fields if f.name in CHANGE_COLUMNS]
    if clashes:
        raise SinkSchemaError(
            f"source column(s) {', '.join(repr(c) for c in clashes)} use a name the sink table "
            f"reserves for its change columns; {FIX_NAME_CLASH}"
        )

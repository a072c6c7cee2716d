"""Row lineage of format-v3 tables: which row a row was, and whether a write changed it.

The spec ("Row Lineage") gives every row of a v3 table a ``_row_id`` and a
``_last_updated_sequence_number``. A writer that moves a row into a new file
copies its ``_row_id``, and copies the sequence number only when it did not
modify the row (a modified row gets null, i.e. the new commit's sequence
number). Both columns may be absent or null in a file; readers then inherit:

* ``_row_id`` = the data file's ``first_row_id`` + the row's position in the
  file (null when the file has no ``first_row_id``: a file from before the
  upgrade to v3);
* ``_last_updated_sequence_number`` = the data sequence number of the file's
  manifest entry.

A data file's ``first_row_id`` is in its manifest entry or inherited from the
manifest's ``first_row_id`` (in the manifest list) plus the record counts of
the entries before it in that manifest that had none, skipping DELETED
entries (as Iceberg's Java ``ManifestReader`` assigns them).

Planner side (:func:`manifest_first_row_ids`, :func:`assign_first_row_ids`):
each input file's ``first_row_id`` and data sequence number go into the plan.
Executor side (:func:`with_lineage`, :class:`LineageFiller`): the file is read
with the two columns added to the snapshot's schema (absent ones come out
null) and nulls are filled by inheritance, before delete files drop rows, so
positions are the file's own.

pyiceberg 0.12 reads manifest lists with the v2 schema (no ``first_row_id``)
and has no notion of row lineage, hence this module.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
from pyiceberg.manifest import (
    ManifestEntry,
    ManifestEntryStatus,
)
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

from iceberg_cdc.source.manifests import v3_field

ROW_ID_FIELD_ID = 2147483540
LAST_UPDATED_FIELD_ID = 2147483539
# Names of the two columns while a write task holds them (never shuffled, never in the sink).
ROW_ID_COLUMN = "__cdc_row_id"
SEQUENCE_COLUMN = "__cdc_last_updated_sequence_number"
LINEAGE_COLUMNS = (ROW_ID_COLUMN, SEQUENCE_COLUMN)


def assign_first_row_ids(
    entries: Sequence[ManifestEntry], manifest_first_row_id: int | None
) -> dict[str, int]:
    """Data file path -> ``first_row_id`` for the entries of one data manifest, in manifest order.

    An explicit value is kept; a live entry without one inherits the
    manifest's plus the record counts of the earlier live entries that had
    none. A file whose id stays unknown is left out.
    """
    out: dict[str, int] = {}
    next_id = manifest_first_row_id
    for entry in entries:
        data_file = entry.data_file
        explicit = v3_field(data_file, "first_row_id")
        if explicit is not None:
            out[data_file.file_path] = int(explicit)
        elif next_id is not None and entry.status != ManifestEntryStatus.DELETED:
            out[data_file.file_path] = next_id
            next_id += int(data_file.record_count)
    return out


def with_lineage(schema: Schema) -> Schema:
    """``schema`` with the two lineage columns appended (read by field id; absent ones read as null)."""
    taken = {field.field_id for field in schema.fields}
    if ROW_ID_FIELD_ID in taken or LAST_UPDATED_FIELD_ID in taken:
        return schema
    return Schema(
        *schema.fields,
        NestedField(ROW_ID_FIELD_ID, ROW_ID_COLUMN, LongType(), required=False),
        NestedField(LAST_UPDATED_FIELD_ID, SEQUENCE_COLUMN, LongType(), required=False),
        schema_id=schema.schema_id,
        identifier_field_ids=schema.identifier_field_ids,
    )


def _filled(column: pa.Array, inherited: np.ndarray | None) -> pa.Array:
    if column.null_count == 0 or inherited is None:
        return column
    values = np.asarray(column.fill_null(0).to_numpy(), dtype=np.int64)
    return pa.array(np.where(np.asarray(column.is_valid()), values, inherited), pa.int64())


class LineageFiller:
    """Fills inherited lineage into the batches of one file, as read (before any row is dropped).

    ``positions``: the file positions of the rows read, when only some were
    (a kept file read at the rows its new deletes name); otherwise the rows
    are the file's from position 0, batch after batch.
    """

    def __init__(
        self,
        first_row_id: int | None,
        sequence_number: int | None,
        positions: np.ndarray | None = None,
        record_count: int | None = None,
    ) -> None:
        self._first_row_id = first_row_id
        self._sequence_number = sequence_number
        if positions is not None and record_count is not None:
            positions = positions[(positions >= 0) & (positions < record_count)]
        self._positions = positions
        self._offset = 0

    def fill(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        n = batch.num_rows
        if self._positions is None:
            positions = np.arange(self._offset, self._offset + n, dtype=np.int64)
        else:
            positions = self._positions[self._offset : self._offset + n]
        self._offset += n
        row_ids = None if self._first_row_id is None else positions + self._first_row_id
        sequence = None if self._sequence_number is None else np.full(n, self._sequence_number, np.int64)
        at_row, at_seq = (
            batch.schema.get_field_index(ROW_ID_COLUMN),
            batch.schema.get_field_index(SEQUENCE_COLUMN),
        )
        batch = batch.set_column(at_row, ROW_ID_COLUMN, _filled(batch.column(at_row), row_ids))
        return batch.set_column(at_seq, SEQUENCE_COLUMN, _filled(batch.column(at_seq), sequence))

    def batches(self, raw: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``raw`` with lineage filled; returns what ``raw`` returns (the file's row count)."""
        while True:
            try:
                batch = next(raw)
            except StopIteration as done:
                return done.value
            yield self.fill(batch)

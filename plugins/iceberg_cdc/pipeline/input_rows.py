"""A task's input files as the rows that count: merge-on-read deletes applied, row lineage filled in.

Shared by the write tasks (both sides of a change) and the insert tasks
(added files only); what delete files drop is counted per operation so row
conservation still adds up to the manifests' record counts.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from iceberg_cdc.errors import SourceFileMissingError
from iceberg_cdc.pipeline.plan import SnapshotPlan
from iceberg_cdc.source.delete_filter import DeleteLoader, LiveRows
from iceberg_cdc.source.lineage import LineageFiller, with_lineage
from iceberg_cdc.source.planning import InputFile
from iceberg_cdc.source.reading import name_mapping_from_json, read_data_file


class InputRows:
    """A task's input files as batches of the rows that count, with merge-on-read deletes applied.

    Rows a delete file says are not live (or, for a kept file, rows no new
    delete names) are dropped and counted per operation in ``masked``, so
    conservation still adds up to the manifests' record counts.
    """

    def __init__(self, plan: SnapshotPlan, io, schema) -> None:
        self._plan, self._io, self._schema = plan, io, schema
        self._mapping = name_mapping_from_json(plan.name_mapping_json)
        self._loader: DeleteLoader | None = None
        self.masked = {"DELETE": 0, "INSERT": 0}

    def batches(self, file: InputFile, lineage: bool = False) -> Iterator[pa.RecordBatch]:
        """The file's rows that count; with ``lineage``, plus the two row-lineage columns, inherited.

        A data or delete file gone from storage is a final error.
        """
        try:
            yield from self._batches(file, lineage)
        except FileNotFoundError as exc:
            named = re.search(r"[A-Za-z][\w+.-]*://[^\s:'\",)]+", str(exc))
            missing = file.path if file.path in str(exc) or named is None else named.group(0)
            raise SourceFileMissingError.for_file(
                missing,
                self._plan.source,
                self._plan.snapshot_id,
                detail=f"a delete file of {file.path}" if missing != file.path else "",
            ) from exc

    def _batches(self, file: InputFile, lineage: bool) -> Iterator[pa.RecordBatch]:
        if not (file.deletes or file.require):
            yield from self._read(file, lineage=lineage)
            return
        if self._loader is None:
            self._loader = DeleteLoader(self._io, self._schema, self._plan.delete_refs())
        live = LiveRows(self._loader, file.path, file.deletes, file.require)
        positions = live.selected_positions()
        if positions is None:
            yield from live.filter(self._read(file, lineage=lineage))
        else:  # a kept file changed by position deletes / a DV: read only the rows they name
            yield from live.filter_selected(self._read(file, positions, lineage))
        self.masked[file.op] += live.masked

    def _read(self, file: InputFile, positions: np.ndarray | None = None, lineage: bool = False):
        raw = read_data_file(
            self._io,
            file.path,
            with_lineage(self._schema) if lineage else self._schema,
            name_mapping=self._mapping,
            partition_values=file.partition_values,
            positions=positions,
        )
        if not lineage:
            return raw
        filler = LineageFiller(file.first_row_id, file.sequence_number, positions, file.record_count)
        return filler.batches(raw)

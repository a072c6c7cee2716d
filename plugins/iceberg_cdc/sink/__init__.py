"""The sink: a changelog Iceberg table that receives each source snapshot's changes exactly once.

``columns`` names the change columns, ``schema`` derives and evolves the sink
schema (by source field id, through the mapping ``field_ids`` keeps in the
sink's properties), ``rows`` shapes change rows for it,
``table`` creates the sink and reads its watermarks and commit markers,
``staging`` writes and cleans up the Parquet files read tasks stage for a
commit, ``datafiles`` turns them into Iceberg data files, and ``commit`` adds
them and moves the watermark in one atomic Iceberg commit.
"""

from __future__ import annotations

from iceberg_cdc.sink.columns import CHANGE_ORDINAL, CHANGE_TYPE, COMMIT_SNAPSHOT_ID, COMMIT_TIMESTAMP
from iceberg_cdc.sink.commit import CommitResult, advance_watermark, commit_changes
from iceberg_cdc.sink.rows import sink_arrow_schema, to_sink_arrow
from iceberg_cdc.sink.schema import SchemaEvolution, evolve_sink_schema, sink_schema_for
from iceberg_cdc.sink.staging import (
    StagedFile,
    delete_uncommitted_staged,
    list_staged,
    staged_file_path,
    write_staged_file,
)
from iceberg_cdc.sink.table import (
    ensure_sink_table,
    find_commit,
    read_watermark,
    watermark_property_names,
)
from iceberg_cdc.watermark import Watermark

__all__ = [
    "CHANGE_ORDINAL",
    "CHANGE_TYPE",
    "COMMIT_SNAPSHOT_ID",
    "COMMIT_TIMESTAMP",
    "CommitResult",
    "SchemaEvolution",
    "StagedFile",
    "Watermark",
    "advance_watermark",
    "commit_changes",
    "delete_uncommitted_staged",
    "ensure_sink_table",
    "evolve_sink_schema",
    "find_commit",
    "list_staged",
    "read_watermark",
    "sink_arrow_schema",
    "sink_schema_for",
    "staged_file_path",
    "to_sink_arrow",
    "watermark_property_names",
    "write_staged_file",
]

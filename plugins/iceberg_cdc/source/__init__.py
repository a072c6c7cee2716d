"""The source side of the pipeline: what a snapshot changed, which snapshot is next, how to read it.

* :mod:`.changes` — the files one snapshot added and removed, from its manifests
  (:mod:`.change_files`: their form in plans).
* :mod:`.history` — the watermark against the table's current ancestry: the next snapshot;
  :mod:`.reprocess` — which snapshots a manual run may reprocess.
* :mod:`.planning` — changed files bin-packed into deterministic SHUFFLE_WRITE tasks.
* :mod:`.reading` — one data file streamed as Arrow batches in the snapshot's schema.
"""

from iceberg_cdc.source.change_files import DataFileRef, SnapshotChanges
from iceberg_cdc.source.changes import (
    initial_load_changes,
    require_supported,
    snapshot_changes,
)
from iceberg_cdc.source.history import (
    PendingSnapshot,
    Watermark,
    current_ancestry,
    next_snapshot,
)
from iceberg_cdc.source.planning import InputFile, WriteTask, plan_from_dict, plan_to_dict, plan_write_tasks
from iceberg_cdc.source.reading import (
    file_io,
    output_schema,
    read_data_file,
    schema_from_json,
    schema_to_json,
)
from iceberg_cdc.source.reprocess import validate_manual_snapshot

__all__ = [
    "DataFileRef",
    "InputFile",
    "PendingSnapshot",
    "SnapshotChanges",
    "Watermark",
    "WriteTask",
    "current_ancestry",
    "file_io",
    "initial_load_changes",
    "next_snapshot",
    "output_schema",
    "plan_from_dict",
    "plan_to_dict",
    "plan_write_tasks",
    "read_data_file",
    "require_supported",
    "schema_from_json",
    "schema_to_json",
    "snapshot_changes",
    "validate_manual_snapshot",
]

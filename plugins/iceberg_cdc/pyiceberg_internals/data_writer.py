"""Arrow rows as new data files of a table, on an executor that has the table's metadata but no catalog.

pyiceberg's private ``_dataframe_to_data_files`` is the writer its own
``append`` uses: it splits rows by the partition spec, bin-packs them to the
target file size, writes Parquet with field ids and returns ``DataFile``
descriptions with the statistics pyiceberg's manifests hold. The mirror's
join and write units run it on Spark executors from the metadata the plan
carries (:func:`metadata_for_units`), with the data location pointed at the
apply's own staging directory so an uncommitted file can be found and
deleted later.
"""

from __future__ import annotations

import uuid

import pyarrow as pa
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import _dataframe_to_data_files
from pyiceberg.manifest import DataFile
from pyiceberg.table import TableProperties
from pyiceberg.table.metadata import TableMetadata, TableMetadataUtil, TableMetadataV3

from iceberg_cdc.pyiceberg_internals.format_v3 import dump_v3


def metadata_for_units(metadata: TableMetadata) -> str:
    """The table's metadata without its history, as JSON (what a unit needs to write data files)."""
    bare = metadata.model_copy(
        update={
            "snapshots": [],
            "snapshot_log": [],
            "metadata_log": [],
            "refs": {},
            "current_snapshot_id": None,
            "statistics": [],
            "partition_statistics": [],
        }
    )
    if isinstance(bare, TableMetadataV3):
        return dump_v3(bare)
    return bare.model_dump_json()


def parse_metadata(text: str) -> TableMetadata:
    return TableMetadataUtil.parse_raw(text)


def write_data_files(
    file_io: FileIO, metadata: TableMetadata, rows: pa.Table, data_path: str
) -> list[DataFile]:
    """Write ``rows`` (the table's Arrow schema) as data files under ``data_path``, split by partition."""
    if not rows.num_rows:
        return []
    properties = {
        **metadata.properties,
        TableProperties.WRITE_DATA_PATH: data_path.rstrip("/"),
        TableProperties.OBJECT_STORE_ENABLED: "false",
    }
    properties.pop(TableProperties.WRITE_PY_LOCATION_PROVIDER_IMPL, None)
    local = metadata.model_copy(update={"properties": properties})
    files = list(_dataframe_to_data_files(local, rows, file_io, write_uuid=uuid.uuid4()))
    for data_file in files:
        data_file.spec_id = metadata.default_spec_id
    return files

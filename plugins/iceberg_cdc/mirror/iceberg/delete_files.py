"""Delete files for a mirror's replaced rows: file-scoped position deletes (v2) and deletion vectors (v3).

Each data file that loses rows gets ONE delete description holding every
deleted position of that file -- the ones deleted before and the new ones --
and the commit removes the file's earlier one, so a row is never deleted
twice and readers apply one small delete per data file (as Iceberg's Java
writers do with ``write.delete.granularity=file`` and with DVs):

* **v2:** a Parquet position delete file with the spec's reserved columns
  ``file_path`` (field id 2147483546) and ``pos`` (2147483545), rows sorted by
  position, in the data file's partition, ``referenced_data_file`` set and
  bounds on both columns (lower = upper = the path: a reader prunes it to
  its one data file);
* **v3:** a ``deletion-vector-v1`` blob in a Puffin file (one Puffin file per
  task, one blob per data file): length, magic ``D1 D3 39 64``, the
  positions as a portable 64-bit Roaring bitmap (run-optimized), CRC-32; the
  blob's metadata names field 2147483645 (``_pos``) and inherits snapshot id
  and sequence number (-1), with ``referenced-data-file`` and
  ``cardinality``; the manifest entry points at the blob
  (``content_offset``, ``content_size_in_bytes``).
"""

from __future__ import annotations

import io
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.conversions import to_bytes
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, StringType
from pyroaring import BitMap

from iceberg_cdc.pyiceberg_internals.datafiles import v3_data_file
from iceberg_cdc.source.deletes import POSITION_PATH_FIELD_ID
from iceberg_cdc.source.deletion_vectors import DV_MAGIC

POSITION_POS_FIELD_ID = 2147483545
ROW_POSITION_FIELD_ID = 2147483645  # the _pos metadata column: what a deletion vector's bits stand for
PUFFIN_MAGIC = b"PFA1"
CREATED_BY = "iceberg-cdc mirror"

POSITION_DELETE_SCHEMA = pa.schema(
    [
        pa.field(
            "file_path",
            pa.string(),
            nullable=False,
            metadata={"PARQUET:field_id": str(POSITION_PATH_FIELD_ID)},
        ),
        pa.field(
            "pos", pa.int64(), nullable=False, metadata={"PARQUET:field_id": str(POSITION_POS_FIELD_ID)}
        ),
    ]
)


@dataclass(frozen=True)
class FileDeletes:
    """Every deleted position of one data file after this apply (old and new), and where the file sits."""

    data_path: str
    positions: np.ndarray  # sorted, distinct int64
    spec_id: int
    partition: Record


def _put(file_io: FileIO, path: str, payload: bytes) -> None:
    with file_io.new_output(path).create(overwrite=False) as stream:
        stream.write(payload)


def position_delete_file(file_io: FileIO, path: str, deletes: FileDeletes) -> DataFile:
    """Write a file-scoped Parquet position delete file at ``path``; its manifest description."""
    positions = deletes.positions
    if not len(positions):
        raise ValueError(f"no positions to delete in {deletes.data_path}")
    rows = pa.Table.from_arrays(
        [
            pa.array(np.full(len(positions), deletes.data_path, dtype=object), pa.string()),
            pa.array(positions, pa.int64()),
        ],
        schema=POSITION_DELETE_SCHEMA,
    )
    buffer = io.BytesIO()
    pq.write_table(rows, buffer, compression="zstd")
    payload = buffer.getvalue()
    _put(file_io, path, payload)
    encoded = to_bytes(StringType(), deletes.data_path)
    count = len(positions)
    data_file = v3_data_file(
        content=DataFileContent.POSITION_DELETES,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=deletes.partition,
        record_count=count,
        file_size_in_bytes=len(payload),
        value_counts={POSITION_PATH_FIELD_ID: count, POSITION_POS_FIELD_ID: count},
        null_value_counts={POSITION_PATH_FIELD_ID: 0, POSITION_POS_FIELD_ID: 0},
        lower_bounds={
            POSITION_PATH_FIELD_ID: encoded,
            POSITION_POS_FIELD_ID: to_bytes(LongType(), int(positions[0])),
        },
        upper_bounds={
            POSITION_PATH_FIELD_ID: encoded,
            POSITION_POS_FIELD_ID: to_bytes(LongType(), int(positions[-1])),
        },
        referenced_data_file=deletes.data_path,
    )
    data_file.spec_id = deletes.spec_id
    return data_file


def encode_deletion_vector(positions: np.ndarray) -> bytes:
    """A ``deletion-vector-v1`` blob of sorted distinct ``positions`` (spec: "Deletion Vectors")."""
    positions = np.asarray(positions, dtype=np.int64)
    if len(positions) and positions[0] < 0:
        raise ValueError("deletion vector positions must be >= 0")
    keys = positions >> 32
    unique_keys, starts = np.unique(keys, return_index=True)
    bounds = [*starts.tolist(), len(positions)]
    parts = [len(unique_keys).to_bytes(8, "little")]
    for i, key in enumerate(unique_keys.tolist()):
        low = (positions[bounds[i] : bounds[i + 1]] & 0xFFFFFFFF).astype(np.uint32)
        bitmap = BitMap(low.tolist())
        bitmap.run_optimize()
        parts += [int(key).to_bytes(4, "little"), bitmap.serialize()]
    body = DV_MAGIC + b"".join(parts)
    return len(body).to_bytes(4, "big") + body + (zlib.crc32(body) & 0xFFFFFFFF).to_bytes(4, "big")


def deletion_vector_file(file_io: FileIO, path: str, files: Sequence[FileDeletes]) -> list[DataFile]:
    """Write one Puffin file holding a DV per data file of ``files``; their manifest descriptions."""
    if not files:
        return []
    content = bytearray(PUFFIN_MAGIC)
    blobs, placed = [], []
    for deletes in sorted(files, key=lambda d: d.data_path):
        if not len(deletes.positions):
            raise ValueError(f"no positions to delete in {deletes.data_path}")
        blob = encode_deletion_vector(deletes.positions)
        cardinality = len(deletes.positions)
        blobs.append(
            {
                "type": "deletion-vector-v1",
                "fields": [ROW_POSITION_FIELD_ID],
                "snapshot-id": -1,
                "sequence-number": -1,
                "offset": len(content),
                "length": len(blob),
                "properties": {"referenced-data-file": deletes.data_path, "cardinality": str(cardinality)},
            }
        )
        placed.append((deletes, len(content), len(blob), cardinality))
        content += blob
    footer = json.dumps({"blobs": blobs, "properties": {"created-by": CREATED_BY}}).encode()
    content += PUFFIN_MAGIC + footer + len(footer).to_bytes(4, "little") + bytes(4) + PUFFIN_MAGIC
    _put(file_io, path, bytes(content))
    entries = []
    for deletes, offset, length, cardinality in placed:
        entry = v3_data_file(
            content=DataFileContent.POSITION_DELETES,
            file_path=path,
            file_format=FileFormat.PUFFIN,
            partition=deletes.partition,
            record_count=cardinality,
            file_size_in_bytes=len(content),
            referenced_data_file=deletes.data_path,
            content_offset=offset,
            content_size_in_bytes=length,
        )
        entry.spec_id = deletes.spec_id
        entries.append(entry)
    return entries

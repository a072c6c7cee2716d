"""The mirror's delete writers: DVs decode to exactly their positions; position delete files hold the spec's columns."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.typedef import Record

from iceberg_cdc.mirror.iceberg.delete_files import (
    PUFFIN_MAGIC,
    ROW_POSITION_FIELD_ID,
    FileDeletes,
    deletion_vector_file,
    encode_deletion_vector,
    position_delete_file,
)
from iceberg_cdc.pyiceberg_internals.manifest_reader import v3_field
from iceberg_cdc.source.deletion_vectors import decode_deletion_vector, read_deletion_vector

positions = st.lists(
    st.one_of(st.integers(0, 70_000), st.integers(2**32 - 5, 2**32 + 70_000), st.integers(0, 2**40)),
    min_size=1,
    max_size=300,
).map(lambda xs: np.unique(np.array(xs, dtype=np.int64)))


@settings(max_examples=200, deadline=None)
@given(positions)
def test_a_deletion_vector_decodes_to_exactly_its_positions(wanted):
    decoded = decode_deletion_vector(encode_deletion_vector(wanted), "test")
    assert np.array_equal(decoded, wanted)


def test_dense_runs_and_bitsets_round_trip():
    wanted = np.concatenate([np.arange(0, 70_000), np.arange(200_000, 260_000, 3), [2**33]]).astype(np.int64)
    assert np.array_equal(decode_deletion_vector(encode_deletion_vector(wanted), "dense"), wanted)


def test_a_puffin_file_names_each_blob_and_its_data_file(tmp_path):
    io = PyArrowFileIO()
    path = f"file://{tmp_path}/dv.puffin"
    files = [
        FileDeletes("s3://b/t/data/a.parquet", np.array([0, 5, 9], dtype=np.int64), 0, Record("us")),
        FileDeletes("s3://b/t/data/b.parquet", np.array([2**32 + 1], dtype=np.int64), 0, Record("eu")),
    ]
    entries = deletion_vector_file(io, path, files)
    raw = (tmp_path / "dv.puffin").read_bytes()
    assert raw[:4] == PUFFIN_MAGIC and raw[-4:] == PUFFIN_MAGIC
    footer_size = int.from_bytes(raw[-12:-8], "little")
    footer = json.loads(raw[-12 - footer_size : -12])
    assert [b["properties"]["referenced-data-file"] for b in footer["blobs"]] == [f.data_path for f in files]
    assert all(b["fields"] == [ROW_POSITION_FIELD_ID] and b["snapshot-id"] == -1 for b in footer["blobs"])
    for entry, deletes in zip(entries, files, strict=True):
        assert v3_field(entry, "referenced_data_file") == deletes.data_path
        found = read_deletion_vector(
            io,
            path,
            v3_field(entry, "content_offset"),
            v3_field(entry, "content_size_in_bytes"),
            entry.record_count,
        )
        assert np.array_equal(found, deletes.positions)
        assert entry.file_size_in_bytes == len(raw)


def test_a_position_delete_file_is_file_scoped_with_the_reserved_ids(tmp_path):
    io = PyArrowFileIO()
    path = f"file://{tmp_path}/pos.parquet"
    deletes = FileDeletes("s3://b/t/data/a.parquet", np.array([1, 4, 7], dtype=np.int64), 3, Record("us"))
    entry = position_delete_file(io, path, deletes)
    table = pq.read_table(tmp_path / "pos.parquet")
    assert table.column("pos").to_pylist() == [1, 4, 7]
    assert set(table.column("file_path").to_pylist()) == {deletes.data_path}
    ids = [f.metadata[b"PARQUET:field_id"] for f in table.schema]
    assert ids == [b"2147483546", b"2147483545"]
    assert entry.lower_bounds[2147483546] == entry.upper_bounds[2147483546] == deletes.data_path.encode()
    assert v3_field(entry, "referenced_data_file") == deletes.data_path and entry.spec_id == 3
    with pytest.raises(ValueError):
        position_delete_file(
            io, f"file://{tmp_path}/none.parquet", FileDeletes("x", np.zeros(0, np.int64), 0, Record())
        )

"""Delete files applied to a data file's batches: positions across batches, equality keys with nulls and NaN."""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st
from pyiceberg.io.pyarrow import PyArrowFileIO, schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import DoubleType, LongType, NestedField, StringType

from cdc_devtools.format_v3 import encode_deletion_vector
from cdc_devtools.mor import _POSITION_SCHEMA
from iceberg_cdc.source.delete_filter import DeleteLoader, LiveRows
from iceberg_cdc.source.deletes import DeleteFileRef
from iceberg_cdc.source.reading import read_data_file

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "name", StringType(), required=False),
    NestedField(3, "score", DoubleType(), required=False),
)


def _write(path, table: pa.Table) -> str:
    pq.write_table(table, path)
    return str(path)


def _data(tmp_path) -> str:
    rows = pa.table(
        {
            "id": pa.array([1, 2, 3, None, 5, 6, 7, 8], pa.int64()),
            "name": pa.array(["a", None, "c", "d", "e", None, "g", "h"]),
            "score": pa.array([0.0, -0.0, math.nan, 1.0, 2.0, math.nan, 3.0, 4.0]),
        }
    ).cast(schema_to_pyarrow(SCHEMA))
    return _write(tmp_path / "data.parquet", rows)


def _live(tmp_path, refs: dict[str, DeleteFileRef], deletes=(), require=(), batch_size=3) -> tuple[list, int]:
    io = PyArrowFileIO()
    data = _data(tmp_path)
    live = LiveRows(DeleteLoader(io, SCHEMA, refs), data, list(deletes), list(require))
    batches = list(live.filter(read_data_file(io, data, SCHEMA, batch_size=batch_size)))
    ids = [row["id"] for batch in batches for row in batch.to_pylist()]
    return ids, live.masked


def test_positions_across_batches_and_other_files_ignored(tmp_path):
    data = str(tmp_path / "data.parquet")
    deletes = pa.Table.from_arrays(
        [pa.array([data, data, data, "other.parquet"]), pa.array([0, 3, 7, 1], pa.int64())],
        schema=_POSITION_SCHEMA,
    )
    path = _write(tmp_path / "pos.parquet", deletes)
    refs = {path: DeleteFileRef(path, "position", 1, 4, 2)}
    assert _live(tmp_path, refs, deletes=[path]) == ([2, 3, 5, 6, 7], 3)
    # A kept file: only the rows the new delete names are the change.
    assert _live(tmp_path, refs, require=[path]) == ([1, None, 8], 5)


def _puffin_with_dvs(tmp_path, vectors: dict[str, list[int]]) -> dict[str, DeleteFileRef]:
    """One Puffin-like file holding a DV blob per data file (only the blobs are read), and their refs."""
    path = str(tmp_path / "dvs.puffin")
    content, refs = bytearray(b"PFA1"), {}
    for data_path, positions in vectors.items():
        blob = encode_deletion_vector(positions)
        ref = DeleteFileRef(path, "dv", 0, len(set(positions)), 2, (), data_path, len(content), len(blob))
        refs[ref.key] = ref
        content += blob
    (tmp_path / "dvs.puffin").write_bytes(bytes(content))
    return {key: DeleteFileRef(**{**ref.__dict__, "size": len(content)}) for key, ref in refs.items()}


def test_deletion_vectors_are_read_by_blob_and_name_one_data_file(tmp_path):
    data = str(tmp_path / "data.parquet")
    refs = _puffin_with_dvs(tmp_path, {"other.parquet": [1, 2], data: [0, 3, 7]})
    (other_key, dv_key) = refs
    assert other_key != dv_key and dv_key.startswith(str(tmp_path / "dvs.puffin"))
    assert _live(tmp_path, refs, deletes=[dv_key]) == ([2, 3, 5, 6, 7], 3)
    assert _live(tmp_path, refs, require=[dv_key]) == ([1, None, 8], 5)
    # A DV of another data file names nothing here.
    assert _live(tmp_path, refs, deletes=[other_key]) == ([1, 2, 3, None, 5, 6, 7, 8], 0)


def test_a_replaced_deletion_vector_leaves_only_the_new_positions(tmp_path):
    data = str(tmp_path / "data.parquet")
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    ((old_key, old),) = _puffin_with_dvs(tmp_path / "old", {data: [0, 3]}).items()
    ((new_key, new),) = _puffin_with_dvs(tmp_path / "new", {data: [0, 3, 5]}).items()
    # Removed by the snapshot: the rows the new DV names that the old one did not.
    refs = {old_key: old, new_key: new}
    assert _live(tmp_path, refs, deletes=[old_key], require=[new_key]) == ([6], 7)


def test_equality_keys_match_null_to_null_and_nan_to_nan_but_not_signed_zero(tmp_path):
    key_schema = pa.schema(
        [
            pa.field("name", pa.large_string(), metadata={"PARQUET:field_id": "2"}),
            pa.field("score", pa.float64(), metadata={"PARQUET:field_id": "3"}),
        ]
    )
    keys = pa.table({"name": [None, "c", "a", "zz"], "score": [-0.0, math.nan, -0.0, 1.0]}, schema=key_schema)
    path = _write(tmp_path / "eq.parquet", keys)
    refs = {path: DeleteFileRef(path, "equality", 1, 4, 2, (2, 3))}
    # (None, -0.0) hits id 2; ("c", NaN) hits id 3; ("a", -0.0) misses id 1 (0.0); (None, NaN) of id 6 is no key.
    assert _live(tmp_path, refs, deletes=[path]) == ([1, None, 5, 6, 7, 8], 2)


def test_single_key_equality_and_positions_together(tmp_path):
    data = str(tmp_path / "data.parquet")
    eq = _write(
        tmp_path / "eq.parquet",
        pa.table(
            {"id": pa.array([None, 5, 99], pa.int64())},
            schema=pa.schema([pa.field("id", pa.int64(), metadata={"PARQUET:field_id": "1"})]),
        ),
    )
    pos = _write(
        tmp_path / "pos.parquet",
        pa.Table.from_arrays([pa.array([data]), pa.array([0], pa.int64())], schema=_POSITION_SCHEMA),
    )
    refs = {eq: DeleteFileRef(eq, "equality", 1, 3, 3, (1,)), pos: DeleteFileRef(pos, "position", 1, 1, 2)}
    assert _live(tmp_path, refs, deletes=[eq, pos], batch_size=2) == ([2, 3, 6, 7, 8], 3)
    # Rows the old position delete removed are not removed again by the new equality delete.
    ids, masked = _live(tmp_path, refs, deletes=[pos], require=[eq])
    assert (ids, masked) == ([None, 5], 6)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 40),
    row_group=st.integers(1, 9),
    batch_size=st.integers(1, 7),
    required=st.sets(st.integers(0, 45), max_size=12),
    deleted=st.sets(st.integers(0, 45), max_size=12),
)
def test_reading_only_the_required_positions_matches_reading_the_whole_file(
    tmp_path_factory, n, row_group, batch_size, required, deleted
):
    """A kept file changed by position deletes: the row groups holding them only, same rows, same count."""
    tmp = tmp_path_factory.mktemp("selected")
    data = str(tmp / "data.parquet")
    pq.write_table(
        pa.table({"id": pa.array(range(n), pa.int64())}).cast(schema_to_pyarrow(Schema(SCHEMA.fields[0]))),
        data,
        row_group_size=row_group,
    )
    refs = {}
    for name, positions in (("new", required), ("old", deleted)):
        path = str(tmp / f"{name}.parquet")
        ordered = sorted(positions)
        pq.write_table(
            pa.Table.from_arrays(
                [pa.array([data] * len(ordered)), pa.array(ordered, pa.int64())], schema=_POSITION_SCHEMA
            ),
            path,
        )
        refs[path] = DeleteFileRef(path, "position", 1, len(ordered), 2)
    new, old = list(refs)
    io, schema = PyArrowFileIO(), Schema(SCHEMA.fields[0])

    def read(selected: bool) -> tuple[list, int]:
        live = LiveRows(DeleteLoader(io, schema, refs), data, [old], [new])
        if selected:
            positions = live.selected_positions()
            batches = live.filter_selected(read_data_file(io, data, schema, batch_size, positions=positions))
        else:
            batches = live.filter(read_data_file(io, data, schema, batch_size))
        return [row["id"] for batch in batches for row in batch.to_pylist()], live.masked

    expected = sorted(p for p in required - deleted if p < n)
    assert read(selected=False) == read(selected=True) == (expected, n - len(expected))

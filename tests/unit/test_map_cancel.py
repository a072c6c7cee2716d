"""A write task's cancel buffer: one partition's both sides, in memory or in hash buckets on disk.

The buffer must give the same survivors (as a multiset per operation)
whether it holds everything in memory or spills to buckets, count every row
(in = out + cancelled, as many DELETEs as INSERTs cancelled), keep lineage
columns out of what it hands on, and leave no file behind.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc_devtools.oracle import row_key
from iceberg_cdc.pipeline.map_cancel import CancelBuffer, file_groups
from iceberg_cdc.shuffle.rows import Op
from iceberg_cdc.source.lineage import ROW_ID_COLUMN, SEQUENCE_COLUMN
from iceberg_cdc.source.planning import InputFile

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.large_string()), ("v", pa.float64())])


def side(rng: random.Random, ids: list[int]) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([rng.choice(["a", "b", None]) for _ in ids], pa.large_string()),
            "v": pa.array([rng.choice([0.0, -0.0, float("nan"), None]) for _ in ids], pa.float64()),
        },
        schema=SCHEMA,
    )


def drain(buffer: CancelBuffer) -> Counter:
    out: Counter = Counter()
    for table, op in buffer.survivors():
        assert table.schema.names == SCHEMA.names, "lineage and op columns never leave the buffer"
        for row in table.to_pylist():
            out[(row_key(row, SCHEMA.names), op)] += 1
    return out


def feed(buffer: CancelBuffer, parts: list[tuple[pa.Table, Op]], lineage: bool = False) -> None:
    for table, op in parts:
        for batch in table.to_batches(max_chunksize=7):
            if lineage:
                n = batch.num_rows
                ids = pa.array([None] * n, pa.int64())
                batch = batch.append_column(ROW_ID_COLUMN, ids).append_column(SEQUENCE_COLUMN, ids)
            buffer.add(batch, op)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    rows=st.integers(0, 300),
    ids=st.sampled_from([None, ["id"]]),
    lineage=st.booleans(),
)
def test_spilled_buckets_give_what_memory_gives(tmp_path_factory, seed, rows, ids, lineage):
    rng = random.Random(seed)
    keys = list(range(rows)) + [rng.randrange(max(rows, 1)) for _ in range(rows // 10)]  # duplicates
    old = side(rng, keys)
    copied = [i for i in range(len(keys)) if rng.random() < 0.8]
    new = pa.concat_tables(
        [old.take(pa.array(copied, pa.int64())), side(rng, [rng.randrange(max(rows, 1)) for _ in range(5)])]
    )
    parts = [(old, Op.DELETE), (new, Op.INSERT)]
    spill_dir = tmp_path_factory.mktemp("spill")
    results = []
    for memory in (1 << 30, 512):
        buffer = CancelBuffer(
            ids, memory_bytes=memory, expected_rows=old.num_rows + new.num_rows, spill_dir=str(spill_dir)
        )
        feed(buffer, parts, lineage)
        survivors = drain(buffer)
        stats = buffer.stats
        assert stats.cancelled["DELETE"] == stats.cancelled["INSERT"]
        assert sum(survivors.values()) + stats.rows == old.num_rows + new.num_rows
        results.append((survivors, stats))
        assert os.listdir(spill_dir) == [], "bucket files are deleted"
    (in_memory, memory_stats), (spilled, spill_stats) = results
    assert in_memory == spilled
    assert memory_stats.spilled_groups == 0
    if old.num_rows + new.num_rows > 40:
        assert spill_stats.spilled_groups == 1 and spill_stats.buckets >= 2 and spill_stats.spill_bytes > 0


def test_copies_of_one_row_land_in_one_bucket(tmp_path: Path):
    row = pa.table({"id": [7], "name": ["x"], "v": [1.0]}, schema=SCHEMA)
    many = pa.concat_tables([row] * 50)
    other = side(random.Random(1), list(range(200)))
    buffer = CancelBuffer(None, memory_bytes=256, expected_rows=400, spill_dir=str(tmp_path))
    feed(
        buffer,
        [
            (pa.concat_tables([many, other]), Op.DELETE),
            (pa.concat_tables([other, many.slice(0, 45)]), Op.INSERT),
        ],
    )
    survivors = drain(buffer)
    assert survivors == Counter({(row_key(row.to_pylist()[0], SCHEMA.names), Op.DELETE): 5})
    assert buffer.stats.spilled_groups == 1


def test_a_failed_task_leaves_no_bucket_file(tmp_path: Path):
    buffer = CancelBuffer(["id"], memory_bytes=64, expected_rows=100, spill_dir=str(tmp_path))
    feed(buffer, [(side(random.Random(2), list(range(100))), Op.DELETE)])
    assert os.listdir(tmp_path)
    buffer.close()
    assert os.listdir(tmp_path) == []
    with pytest.raises(RuntimeError, match="drained"):
        buffer.add(side(random.Random(3), [1]).to_batches()[0], Op.INSERT)


def test_bad_budget():
    with pytest.raises(ValueError, match="positive"):
        CancelBuffer(None, memory_bytes=0, expected_rows=1)


def _file(path: str, op: str, partition: str | None) -> InputFile:
    return InputFile(path, 10, 1, op, cancel_group=partition)  # type: ignore[arg-type]


def test_file_groups_pair_the_two_sides_of_a_partition():
    files = [
        _file("a-old", "DELETE", "p1"),
        _file("a-new", "INSERT", "p1"),
        _file("b-old", "DELETE", "p2"),  # a partition that only lost a file
        _file("c-new", "INSERT", "p3"),
        _file("d-old", "DELETE", None),  # no partition known
        _file("e-new", "INSERT", None),
    ]
    groups = file_groups(files, cancel=True)
    assert [(tuple(f.path for f in g.files), g.cancels) for g in groups] == [
        (("a-old", "a-new"), True),
        (("b-old", "c-new", "d-old", "e-new"), False),
    ]
    assert [g.cancels for g in file_groups(files, cancel=False)] == [False]
    assert file_groups([], cancel=True) == []


def test_lineage_cancels_in_buckets_too(tmp_path: Path):
    rng = random.Random(4)
    old = side(rng, list(range(120)))
    ids = pa.array(np.arange(120), pa.int64())
    seq = pa.array(np.full(120, 3), pa.int64())
    lineage_old = old.append_column(ROW_ID_COLUMN, ids).append_column(SEQUENCE_COLUMN, seq)
    buffer = CancelBuffer(["id"], memory_bytes=1024, expected_rows=240, spill_dir=str(tmp_path))
    for batch in lineage_old.to_batches(max_chunksize=16):
        buffer.add(batch, Op.DELETE)
    for batch in lineage_old.to_batches(max_chunksize=16):
        buffer.add(batch, Op.INSERT)
    assert drain(buffer) == Counter()
    assert buffer.stats.by_lineage == 240 and buffer.stats.spilled_groups == 1

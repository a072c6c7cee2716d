"""The NumPy ``hashLong`` fast path agrees with pyiceberg-core's ``bucket`` on every value it takes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyiceberg_core.transform import bucket

from iceberg_cdc.shuffle.partitioner import HashPartitioner, column_hash, murmur3_longs


def test_murmur3_longs_is_the_spec_hash_on_random_longs():
    values = np.random.default_rng(42).integers(-(2**63), 2**63 - 1, size=100_000, dtype=np.int64)
    values[:4] = [0, -1, 2**63 - 1, -(2**63)]
    expected = bucket(pa.array(values), 2**31 - 1).to_numpy().astype(np.uint32)
    assert ((murmur3_longs(values) & np.uint32(0x7FFFFFFF)) % np.uint32(2**31 - 1) == expected).all()


@pytest.mark.parametrize(
    "typ",
    [pa.int32(), pa.int64(), pa.date32(), pa.time64("us"), pa.timestamp("us"), pa.timestamp("us", "UTC")],
)
@pytest.mark.parametrize("num_partitions", [1, 64, 1000])
def test_fast_path_types_partition_as_the_bucket_transform(typ, num_partitions):
    rng = np.random.default_rng(7)
    high = 2**31 - 1 if typ == pa.int32() else 2_900_000 if typ == pa.date32() else 2**40
    raw = rng.integers(0, high, size=5000)
    if pa.types.is_time64(typ):
        raw = raw % 86_400_000_000
    mask = rng.random(5000) < 0.1
    array = pa.array(raw, pa.int64()).cast(pa.int32() if typ.bit_width == 32 else pa.int64()).view(typ)
    array = pc.if_else(pa.array(mask), pa.scalar(None, typ), array)
    got = HashPartitioner(num_partitions, ["k"]).partitions(pa.record_batch([array], names=["k"]))
    expected = bucket(array, num_partitions).to_numpy(zero_copy_only=False)
    assert got[~mask].tolist() == expected[~mask].astype(np.int64).tolist()
    assert len(set(got[mask].tolist())) <= 1
    assert column_hash(array.slice(10)).tolist() == column_hash(array)[10:].tolist()

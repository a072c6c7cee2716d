"""``partition = hash(identifier columns) mod P``, a whole batch at a time.

Each column is hashed with the Iceberg spec's 32-bit Murmur3 (``pyiceberg-core``
``transform.bucket``, vectorized in Rust), so the hash of a value is the same
on every machine, process and Python version, and an int hashes like the equal
long (the spec's rule, which keeps partitions stable across int -> long
promotion). With one key column the partition *is* Iceberg's ``bucket[P]``
transform of it. Several columns are combined in order with a fixed mixing
function; nulls hash to a fixed constant, so null keys meet on one partition.

Types the spec does not hash are mapped first: booleans and small integers to
int, floats to the bits of the equal double (with -0.0 and NaN made canonical),
nested values (struct, list, map) and anything else to their canonical byte
encoding (:mod:`iceberg_cdc.canonical`, where every NaN is one NaN), hashed as
binary. Either way, values the merge finds equal hash alike: a NaN rewritten
with another payload lands where the original did.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg_core.transform import bucket

from iceberg_cdc import canonical
from iceberg_cdc.errors import ConfigError

_HASH_SPACE = 2**31 - 1  # bucket(x, 2^31 - 1) keeps all 31 bits of the spec's hash (but one value)
NULL_HASH = np.uint32(0x2F3A5B71)
_SEED = np.uint32(0x6A09E667)


def _hashable(array: pa.Array) -> pa.Array:
    """Map ``array`` onto a type that ``bucket`` hashes, preserving equality."""
    typ = array.type
    if pa.types.is_boolean(typ) or typ in (pa.int8(), pa.int16(), pa.uint8(), pa.uint16()):
        return pc.cast(array, pa.int32())
    if typ == pa.uint32():
        return pc.cast(array, pa.int64())
    if typ == pa.uint64():
        return array.view(pa.int64())
    if pa.types.is_floating(typ):
        values = pc.cast(array, pa.float64())
        values = pc.if_else(pc.equal(values, 0.0), pa.scalar(0.0), values)  # -0.0 -> 0.0
        values = pc.if_else(pc.is_nan(values), pa.scalar(float("nan")), values)
        bits = np.ascontiguousarray(values.fill_null(0.0).to_numpy()).view(np.int64)
        return pa.array(bits, mask=None if array.null_count == 0 else np.asarray(array.is_null()))
    if pa.types.is_string_view(typ):
        return pc.cast(array, pa.large_string())
    if pa.types.is_binary_view(typ):
        return pc.cast(array, pa.large_binary())
    if pa.types.is_date64(typ):
        return pc.cast(array, pa.date32())
    if pa.types.is_time32(typ):
        return pc.cast(array, pa.time64("us"))
    if pa.types.is_timestamp(typ) and typ.unit in ("s", "ms"):
        return pc.cast(array, pa.timestamp("us", typ.tz))
    if pa.types.is_duration(typ):
        return array.view(pa.int64())
    if (
        pa.types.is_integer(typ)
        or pa.types.is_string(typ)
        or pa.types.is_large_string(typ)
        or pa.types.is_binary(typ)
        or pa.types.is_large_binary(typ)
        or pa.types.is_fixed_size_binary(typ)
        or pa.types.is_date32(typ)
        or pa.types.is_time64(typ)
        or pa.types.is_timestamp(typ)
        or pa.types.is_decimal128(typ)
    ):
        return array
    return canonical.encode(array)  # nested, decimal256, null, ...


def _hashes_as_long(typ: pa.DataType) -> bool:
    """Types whose spec hash is ``hashLong`` of the stored integer (int, long, date, time, timestamp in us)."""
    if typ in (pa.int32(), pa.int64(), pa.date32()):
        return True
    return (pa.types.is_time64(typ) or pa.types.is_timestamp(typ)) and typ.unit == "us"


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def murmur3_longs(values: np.ndarray) -> np.ndarray:
    """The spec's ``hashLong``: Murmur3 x86 32-bit, seed 0, of each value's 8 little-endian bytes (uint32).

    The same function ``pyiceberg-core``'s ``bucket`` applies to longs, in
    NumPy: about 5x faster for the common identifier types, because it
    needs no per-call conversion into Rust (measured on 64k-row batches).
    """
    words = np.ascontiguousarray(values, dtype="<i8").view("<u4").reshape(-1, 2)
    h = np.zeros(len(words), dtype=np.uint32)
    with np.errstate(over="ignore"):
        for half in (0, 1):
            k = words[:, half] * np.uint32(0xCC9E2D51)
            k = _rotl(k, 15)
            k *= np.uint32(0x1B873593)
            h ^= k
            h = _rotl(h, 13)
            h *= np.uint32(5)
            h += np.uint32(0xE6546B64)
        h ^= np.uint32(8)  # the input length
        return _fmix32(h)


def _long_bucket(array: pa.Array, buckets: int) -> np.ndarray:
    """``bucket`` of a type that hashes as long, computed with :func:`murmur3_longs`."""
    width = pa.int32() if array.type.bit_width == 32 else pa.int64()
    valid = None if array.null_count == 0 else np.asarray(array.is_valid())
    if valid is not None:
        array = array.fill_null(pa.scalar(0, width).cast(array.type))
    values = array.view(width).to_numpy().astype(np.int64, copy=False)
    result = (murmur3_longs(values) & np.uint32(0x7FFFFFFF)) % np.uint32(buckets)
    if valid is not None:
        result[~valid] = NULL_HASH % np.uint32(buckets)
    return result


def _bucket(array: pa.Array, buckets: int) -> np.ndarray:
    """``bucket`` with nulls given the fixed null hash (mod ``buckets``)."""
    if pa.types.is_null(array.type):
        return np.full(len(array), NULL_HASH % np.uint32(buckets), dtype=np.uint32)
    hashable = _hashable(array)
    if _hashes_as_long(hashable.type):
        return _long_bucket(hashable, buckets)
    result = bucket(hashable, buckets)
    if result.null_count:
        result = result.fill_null(int(NULL_HASH % np.uint32(buckets)))
    return result.to_numpy().astype(np.uint32)


def column_hash(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """31-bit spec hash of each value (uint32); nulls get :data:`NULL_HASH`."""
    return _bucket(canonical.plain(array), _HASH_SPACE)


def _fmix32(h: np.ndarray) -> np.ndarray:
    """Murmur3's finalizer: every input bit affects every output bit."""
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def combined_hash(columns: Sequence[pa.Array | pa.ChunkedArray]) -> np.ndarray:
    """Order-sensitive combination of the column hashes (uint32)."""
    n = len(columns[0])
    h = np.full(n, _SEED, dtype=np.uint32)
    with np.errstate(over="ignore"):
        for column in columns:
            h = h ^ (column_hash(column) + np.uint32(0x9E3779B9) + (h << np.uint32(6)) + (h >> np.uint32(2)))
        return _fmix32(h)


def key_columns(batch: pa.RecordBatch | pa.Table, names: Sequence[str]) -> list[pa.Array | pa.ChunkedArray]:
    """The key columns of ``batch``: top-level columns, or struct fields by dotted path (``k.a``)."""
    columns, missing = [], []
    for name in names:
        try:
            columns.append(canonical.column_at(batch, name))
        except KeyError:
            missing.append(name)
    if missing:
        raise ConfigError(
            f"identifier column(s) {missing} are not in the data (columns: {batch.schema.names}). Set "
            "tables[].identifier_columns to columns of the source table (dotted paths for struct fields, "
            "e.g. k.id), or leave it out to use the table's identifier fields"
        )
    return columns


class HashPartitioner:
    """Assigns each row a shuffle partition in ``[0, num_partitions)``.

    ``key_columns`` are the identifier columns, top-level names or dotted
    paths to struct fields (``k.a``, as Iceberg names nested identifier
    fields); ``None`` or empty means the whole row is the key (tables without
    identifier fields).

    Rows the merge finds equal (:mod:`iceberg_cdc.changelog.merge`: null equals
    null, every NaN equals every NaN, nested values by value) always get the
    same partition, in whole-row mode too, so they meet in one read task.
    """

    def __init__(self, num_partitions: int, key_columns: Sequence[str] | None = None) -> None:
        if not 1 <= num_partitions <= 2**31 - 1:
            raise ConfigError(
                f"number of shuffle partitions must be in [1, 2^31 - 1], got {num_partitions}: "
                "set shuffle.partitions in the config"
            )
        self.num_partitions = num_partitions
        self.key_columns = list(key_columns or [])

    def partitions(self, batch: pa.RecordBatch | pa.Table) -> np.ndarray:
        """Partition id of every row, as int32."""
        if batch.num_rows == 0:
            return np.zeros(0, dtype=np.int32)
        columns = key_columns(batch, self.key_columns or batch.schema.names)
        if len(columns) == 1:
            return _bucket(canonical.plain(columns[0]), self.num_partitions).astype(np.int32)
        return (combined_hash(columns) % np.uint32(self.num_partitions)).astype(np.int32)

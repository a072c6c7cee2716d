"""Map output reader: partitions ``[p0, p1)`` of one map output, one ranged GET.

A coalesced read range is contiguous in every map output, so a SHUFFLE_READ
task issues exactly one GET per map output for its whole range. The offsets
come from the index, which coalesce has already read and validated; passing
them along saves one request per (reader, map output), as IBM's S3 shuffle
does with cached index lengths.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa

from iceberg_cdc.errors import SHUFFLE_RETRY_HINT, CorruptShuffleError, ObjectNotFoundError, ShortObjectError
from iceberg_cdc.shuffle.codec import decode_block
from iceberg_cdc.shuffle.layout import MapOutputIndex, data_key, index_key, iter_blocks
from iceberg_cdc.storage.base import ObjectStore


def in_store(store: ObjectStore, exc: CorruptShuffleError) -> CorruptShuffleError:
    """The same error, saying which shuffle store its (relative) key is in."""
    message = exc.args[0] if exc.args else str(exc)
    return CorruptShuffleError(f"in shuffle store {store.uri}: {message}")


def read_index(
    store: ObjectStore, name: str, num_partitions: int | None = None, data_size: int | None = None
) -> MapOutputIndex:
    """Fetch and validate ``NAME.index``.

    Errors name the object by its full URI (the index and layout messages only
    know the key relative to the shuffle root).
    """
    try:
        raw = store.get(index_key(name))
    except ObjectNotFoundError:
        raise ObjectNotFoundError(
            f"shuffle index {store.describe(index_key(name))} does not exist: the map output was never "
            f"written or was deleted after the write phase. {SHUFFLE_RETRY_HINT}"
        ) from None
    try:
        return MapOutputIndex.from_bytes(name, raw, num_partitions, data_size)
    except CorruptShuffleError as exc:
        raise in_store(store, exc) from None


def read_partitions(
    store: ObjectStore,
    name: str,
    partition_offsets: Sequence[int] | np.ndarray,
    first_partition: int,
    schema: pa.Schema,
) -> Iterator[pa.RecordBatch]:
    """Decode the blocks of consecutive partitions of one map output.

    ``partition_offsets`` are the index offsets ``off[p0] .. off[p1]`` (p1 - p0 + 1
    values); ``schema`` is the shuffle schema (data columns + operation tag).
    """
    offsets = [int(o) for o in partition_offsets]
    start, end = offsets[0], offsets[-1]
    if end == start:
        return
    try:
        raw = store.get_range(data_key(name), start, end)
    except ShortObjectError as exc:
        raise CorruptShuffleError(
            f"shuffle data {data_key(name)!r}, partitions {first_partition}.."
            f"{first_partition + len(offsets) - 2}: the object is truncated: shorter than its index says "
            f"({exc}); rerun the snapshot from the write phase."
        ) from None
    except ObjectNotFoundError:
        raise ObjectNotFoundError(
            f"shuffle data {store.describe(data_key(name))} does not exist, though its index does: it "
            f"was deleted after the write phase (a lifecycle rule, or another run's cleanup). "
            f"{SHUFFLE_RETRY_HINT}"
        ) from None
    try:
        for block in iter_blocks(name, memoryview(raw), offsets, first_partition):
            yield decode_block(name, block, schema)
    except CorruptShuffleError as exc:
        raise in_store(store, exc) from None

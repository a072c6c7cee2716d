"""What lives inside a block: one Arrow record batch, checksummed, LZ4-compressed.

Why a columnar batch and not the seed's per-record framing
(``[len][op][ordinal][avro record]``): per-record encoding costs a Python call
per row (fastavro measured about 1.1 microseconds per record each way here,
i.e. under 100 MB/s for 100-byte rows), while an Arrow IPC record-batch
message is written and read at memory speed and decodes without copying.
``make bench`` measures both framings on the same data.

The payload is ``[crc32 of the message: u32 BE][format version: u32 BE][Arrow IPC
record batch message]``. The crc32 is seeded with the crc32 of the map output's
name (which holds the run's epoch and the write task id), so a block carries
its identity: an object copied or swapped in from another task or another run
fails the checksum and is reported as such, instead of decoding into rows that
would be blamed on the data. IPC pads buffers to 8 bytes only, and Rust consumers
of the batches (pyiceberg-core's hash) reject a decimal buffer that is not
16-aligned, so for schemas with decimals the decoder realigns buffers (a copy
at about 5 GB/s); other schemas decode without copying.
The schema is not repeated in every block: writer and reader derive it from the
same plan, as the seed does, which keeps blocks of small partitions small
(P = 10 000 makes many of them). The checksum catches corruption that LZ4's
block format alone would decode into wrong values silently.
"""

from __future__ import annotations

import functools
import struct
import zlib

import lz4.block
import pyarrow as pa

from iceberg_cdc.errors import CorruptShuffleError
from iceberg_cdc.shuffle.layout import MAX_BLOCK_SIZE, RawBlock, data_key

_HEADER = struct.Struct(">II")
FORMAT_VERSION = 2
# LZ4's acceleration (1 = LZ4's default). Measured on shuffle blocks of the benchmark's
# orders table: 2 compresses about 10% faster than 1 for 0.6% more bytes; 4 and above lose
# 7-15% of the compression. Any acceleration gives a standard LZ4 block (same decoder).
LZ4_ACCELERATION = 2
# LZ4 cannot expand input by more than ~255x; a larger claim is a corrupt header, and
# believing it would mean allocating gigabytes before failing.
_LZ4_MAX_RATIO = 255


def identity_seed(name: str) -> int:
    """The crc32 seed of map output ``name``'s blocks: their identity."""
    return zlib.crc32(name.encode())


def encode_block(batch: pa.RecordBatch, name: str) -> tuple[int, bytes]:
    """Return ``(uncompressed size, LZ4 block)`` for one batch of map output ``name``."""
    message = batch.serialize()
    payload = b"".join((_HEADER.pack(zlib.crc32(message, identity_seed(name)), FORMAT_VERSION), message))
    if len(payload) > MAX_BLOCK_SIZE:
        raise ValueError(
            f"a shuffle block of {len(payload)} bytes exceeds the u32 size field; "
            "lower the writer's block size"
        )
    compressed = lz4.block.compress(payload, mode="fast", acceleration=LZ4_ACCELERATION, store_size=False)
    return len(payload), compressed


def _has_decimal(typ: pa.DataType) -> bool:
    if pa.types.is_decimal(typ):
        return True
    if isinstance(typ, pa.BaseExtensionType):
        return _has_decimal(typ.storage_type)
    return any(_has_decimal(typ.field(i).type) for i in range(typ.num_fields))


@functools.lru_cache(maxsize=64)
def _stream_prefix(schema: pa.Schema) -> tuple[bytes, pa.ipc.IpcReadOptions]:
    """The schema message that makes a bare batch message a readable stream, and read options."""
    aligned = any(_has_decimal(field.type) for field in schema)
    alignment = pa.ipc.Alignment.At64Byte if aligned else pa.ipc.Alignment.Any
    options = pa.ipc.IpcReadOptions(ensure_alignment=alignment, use_threads=False)
    return schema.serialize().to_pybytes(), options


def decode_block(name: str, block: RawBlock, schema: pa.Schema) -> pa.RecordBatch:
    """Decode one block, validating sizes, checksum and the Arrow message."""
    where = f"shuffle data {data_key(name)!r}, partition {block.partition}"
    usize, csize = block.uncompressed_size, len(block.compressed)
    if not _HEADER.size <= usize <= _LZ4_MAX_RATIO * csize + 16:
        raise CorruptShuffleError(
            f"{where}: block header claims {usize} uncompressed bytes from {csize} compressed "
            "bytes, which LZ4 cannot produce; rerun the snapshot from the write phase."
        )
    try:
        payload = lz4.block.decompress(block.compressed, uncompressed_size=usize)
    except (lz4.block.LZ4BlockError, OverflowError, MemoryError) as exc:
        raise CorruptShuffleError(
            f"{where}: LZ4 block does not decompress to the {usize} bytes its header claims "
            f"({exc}); rerun the snapshot from the write phase."
        ) from None
    if len(payload) != usize:
        raise CorruptShuffleError(
            f"{where}: block decompressed to {len(payload)} bytes, header says {usize}; "
            "rerun the snapshot from the write phase."
        )
    expected, version = _HEADER.unpack_from(payload, 0)
    if version != FORMAT_VERSION:
        raise CorruptShuffleError(
            f"{where}: block format version {version}, this reader knows {FORMAT_VERSION}; "
            "the map output was written by another release or is corrupt: rerun the snapshot "
            "from the write phase."
        )
    message = memoryview(payload)[_HEADER.size :]
    if zlib.crc32(message, identity_seed(name)) != expected:
        raise CorruptShuffleError(
            f"{where}: block checksum mismatch: the bytes changed after they were written, or the "
            "object was written for another map output (copied or swapped in from another write task "
            "or run); rerun the snapshot from the write phase."
        )
    try:
        prefix, options = _stream_prefix(schema)
        stream = pa.py_buffer(b"".join((prefix, message)))
        batch = pa.ipc.open_stream(stream, options=options).read_next_batch()
        batch.validate()
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError, StopIteration) as exc:
        raise CorruptShuffleError(
            f"{where}: block is not an Arrow record batch of the planned schema ({exc}); "
            "the map output was written by another plan or is corrupt: rerun the snapshot "
            "from the write phase."
        ) from None
    return batch

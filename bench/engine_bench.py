"""Engine figures: writer and reader+merge throughput per core, and peak task memory.

Generates a copy-on-write snapshot in the worst realistic shape: every data
file is rewritten, so the shuffle input is the whole table twice (DELETE rows
of the old files, INSERT rows of the new ones); 10% of rows are updated (a
fifth of those move to another region) and 1% are deleted.

Each phase runs in a child process pinned to one Arrow thread, so the figures
are per core, and its peak RSS is the task's memory. Input is generated inside
the write task as a stream of batches (outside the timed section), so peak
memory shows what the writer itself holds. The same map outputs are then read
range by range (coalesced to the target size) and merged.

    python bench/engine_bench.py            # ~1 GB of Arrow data, file:// and local S3
    python bench/engine_bench.py --quick    # ~100 MB, for a quick check
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import resource
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from iceberg_cdc.shuffle.writer import DEFAULT_BUFFER_BYTES

ROOT = Path(__file__).resolve().parents[1]

MiB = 1024 * 1024
BATCH_ROWS = 65_536
REGIONS = np.array(["us-east", "us-west", "eu-central", "eu-west", "ap-south", "ap-east"])


# --- data ----------------------------------------------------------------------------------------


def _strings(rng: np.random.Generator, n: int, length: int) -> pa.Array:
    alphabet = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789", dtype=np.uint8)
    data = alphabet[rng.integers(0, len(alphabet), size=n * length)]
    offsets = np.arange(n + 1, dtype=np.int32) * length
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data.tobytes()))


_WORDS = _strings(np.random.default_rng(7), 2000, 7)  # a vocabulary of 2000 words
_SKUS = _strings(np.random.default_rng(8), 50_000, 12)  # a catalog of 50k SKUs


def _notes(rng: np.random.Generator, n: int) -> pa.Array:
    """Three words from the vocabulary per row, as free text looks to a compressor."""
    import pyarrow.compute as pc

    words = [_WORDS.take(pa.array(rng.integers(0, len(_WORDS), size=n))) for _ in range(3)]
    return pc.binary_join_element_wise(*words, " ")


def _choice(values: np.ndarray, index: np.ndarray) -> pa.Array:
    return pa.DictionaryArray.from_arrays(pa.array(index.astype(np.int32)), pa.array(values)).cast(
        pa.string()
    )


def _cents(unscaled: np.ndarray) -> pa.Array:
    """decimal(18, 2) from unscaled int64 values, built from the int128 buffer directly."""
    low = unscaled.astype("<i8")
    words = np.column_stack([low, np.where(low < 0, -1, 0).astype("<i8")]).ravel()
    return pa.Array.from_buffers(pa.decimal128(18, 2), len(low), [None, pa.py_buffer(words.tobytes())])


def table_batch(first_id: int, n: int, version: int) -> pa.RecordBatch:
    """Rows ``first_id .. first_id + n`` of the table, as of ``version`` (0 = before, 1 = after)."""
    ids = np.arange(first_id, first_id + n, dtype=np.int64)
    rng = np.random.default_rng(first_id)  # same base rows in both versions
    region = rng.integers(0, len(REGIONS), size=n)
    amount = rng.integers(0, 10_000_000, size=n)
    status = rng.integers(0, 4, size=n)
    note = _notes(rng, n)
    updated = np.zeros(n, dtype=bool)
    if version == 1:
        updated = updated_mask(ids)
        moved = updated & ((ids * 40503 % 5) == 0)  # a fifth of them change region
        amount = np.where(updated, amount + 1, amount)
        status = np.where(updated, (status + 1) % 4, status)
        region = np.where(moved, (region + 1) % len(REGIONS), region)
    return pa.RecordBatch.from_pydict(
        {
            "id": ids,
            "customer_id": ids * 7 % 1_000_003,
            "region": _choice(REGIONS, region),
            "status": _choice(np.array(["new", "paid", "shipped", "closed"]), status),
            "amount": _cents(amount),
            "quantity": pa.array((ids % 17).astype(np.int32)),
            "price": ids % 1000 / 7.0,
            "created_at": pa.array(ids * 1_000_000, pa.timestamp("us", tz="UTC")),
            "updated_at": pa.array(ids * 1_000_000 + updated, pa.timestamp("us")),
            "sku": _SKUS.take(pa.array(rng.integers(0, len(_SKUS), size=n))),
            "note": note,
            "active": ids % 3 == 0,
        }
    )


def updated_mask(ids: np.ndarray) -> np.ndarray:
    return (ids * 2654435761 % 1000) < 100  # 10% of rows updated (some of them deleted as well)


def deleted_mask(ids: np.ndarray) -> np.ndarray:
    return (ids * 2246822519 % 1000) < 10  # 1% of rows deleted


def task_input(first_id: int, rows: int):
    """(batch, op) stream of one write task: its slice of old files, then of new files."""
    from iceberg_cdc.shuffle.rows import Op

    for version, op in ((0, Op.DELETE), (1, Op.INSERT)):
        for start in range(first_id, first_id + rows, BATCH_ROWS):
            n = min(BATCH_ROWS, first_id + rows - start)
            batch = table_batch(start, n, version)
            if version == 1:
                keep = ~deleted_mask(batch.column("id").to_numpy())
                batch = batch.filter(pa.array(keep))
            yield batch, op


# --- child tasks ---------------------------------------------------------------------------------


def _one_core() -> None:
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def write_task(args: dict) -> dict:
    _one_core()
    from iceberg_cdc.shuffle.partitioner import HashPartitioner
    from iceberg_cdc.shuffle.writer import MapOutputWriter
    from iceberg_cdc.storage import open_store

    store = open_store(args["uri"], args["props"])
    schema = table_batch(0, 1, 0).schema
    writer = MapOutputWriter(
        store,
        args["name"],
        schema,
        HashPartitioner(args["partitions"], ["id"]),
        buffer_bytes=args["buffer"],
        spill_dir=args["spill_dir"],
    )
    busy = 0.0
    for batch, op in task_input(args["first_id"], args["rows"]):
        started = time.perf_counter()
        writer.write(batch, op)
        busy += time.perf_counter() - started
    started = time.perf_counter()
    stats = writer.commit()
    busy += time.perf_counter() - started
    return {
        "seconds": busy,
        "arrow_bytes": stats.input_bytes,
        "data_bytes": stats.data_bytes,
        "spills": stats.spills,
        "rows": sum(stats.rows.values()),
        "peak_rss": _peak_rss(),
        "requests": dict(getattr(store, "requests", {})),
    }


def read_task(args: dict) -> dict:
    _one_core()
    from iceberg_cdc.changelog.merge import MergeStats, merge_changes
    from iceberg_cdc.shuffle.coalesce import coalesce
    from iceberg_cdc.shuffle.fetch import fetch_range
    from iceberg_cdc.shuffle.reader import read_index
    from iceberg_cdc.shuffle.rows import shuffle_schema
    from iceberg_cdc.storage import open_store

    store = open_store(args["uri"], args["props"])
    schema = shuffle_schema(table_batch(0, 1, 0).schema)
    indexes = [read_index(store, name, args["partitions"]) for name in args["names"]]
    plan = coalesce(
        np.sum([ix.partition_sizes() for ix in indexes], axis=0), args["target"], args["target"] // 5
    )
    totals = MergeStats()
    fetch_s = merge_s = 0.0
    arrow_bytes = 0
    before = dict(store.requests)
    for r in plan.ranges:
        started = time.perf_counter()
        table = fetch_range(store, indexes, r.start, r.end, schema, threads=args["fetch_threads"])
        fetched = time.perf_counter()
        _, stats = merge_changes(table, ["id"])
        merge_s += time.perf_counter() - fetched
        fetch_s += fetched - started
        arrow_bytes += table.nbytes
        totals.add(stats)
        del table
    requests = {k: v - before.get(k, 0) for k, v in store.requests.items()}
    return {
        "seconds": fetch_s + merge_s,
        "fetch_seconds": fetch_s,
        "merge_seconds": merge_s,
        "arrow_bytes": arrow_bytes,
        "ranges": len(plan.ranges),
        "peak_rss": _peak_rss(),
        "stats": totals.__dict__,
        "get_range_requests": requests.get("GET_RANGE", 0),
    }


def framing_task(args: dict) -> dict:
    """Block payload choice: Arrow IPC batch vs per-record framing, encode + decode."""
    _one_core()
    import struct

    import lz4.block

    from iceberg_cdc.shuffle.codec import decode_block, encode_block
    from iceberg_cdc.shuffle.layout import RawBlock

    batch = table_batch(0, args["rows"], 1)
    started = time.perf_counter()
    usize, compressed = encode_block(batch, "bench")
    decode_block("bench", RawBlock(0, usize, memoryview(compressed)), batch.schema)
    arrow_s = time.perf_counter() - started

    # Per-record framing as in the seed ([len][op][fields...]); the cheapest Python encoder.
    started = time.perf_counter()
    rows = batch.to_pylist()
    out = bytearray()
    for row in rows:
        text = "\x1f".join(str(v) for v in row.values()).encode()
        out += struct.pack(">IB", len(text), 1) + text
    packed = lz4.block.compress(bytes(out), store_size=False)
    raw = lz4.block.decompress(packed, uncompressed_size=len(out))
    pos, decoded = 0, []
    while pos < len(raw):
        length, _ = struct.unpack_from(">IB", raw, pos)
        decoded.append(raw[pos + 5 : pos + 5 + length].decode().split("\x1f"))
        pos += 5 + length
    record_s = time.perf_counter() - started
    mb = batch.nbytes / MiB
    return {"arrow_ipc_mb_s": mb / arrow_s, "per_record_mb_s": mb / record_s, "rows": args["rows"]}


def in_child(fn, args: dict) -> dict:
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pool.apply(fn, (args,))


# --- orchestration -------------------------------------------------------------------------------


def run_backend(label: str, uri: str, props: dict, cfg: dict, spill_dir: str) -> dict:
    names = []
    writes = []
    for task in range(cfg["tasks"]):
        name = f"bench/{label}/map-{task:04d}"
        names.append(name)
        writes.append(
            in_child(
                write_task,
                {
                    "uri": uri,
                    "props": props,
                    "name": name,
                    "first_id": task * cfg["rows_per_task"],
                    "rows": cfg["rows_per_task"],
                    "partitions": cfg["partitions"],
                    "buffer": cfg["buffer"],
                    "spill_dir": spill_dir,
                },
            )
        )
    read = in_child(
        read_task,
        {
            "uri": uri,
            "props": props,
            "names": names,
            "partitions": cfg["partitions"],
            "target": cfg["target"],
            "fetch_threads": 4,
        },
    )
    write_bytes = sum(w["arrow_bytes"] for w in writes)
    write_s = sum(w["seconds"] for w in writes)
    return {
        "write": {
            "arrow_mb": write_bytes / MiB,
            "seconds": write_s,
            "mb_s_per_core": write_bytes / MiB / write_s,
            "shuffle_mb": sum(w["data_bytes"] for w in writes) / MiB,
            "peak_rss_mb": max(w["peak_rss"] for w in writes) / MiB,
            "spills_per_task": max(w["spills"] for w in writes),
            "tasks": len(writes),
        },
        "read_merge": {
            "arrow_mb": read["arrow_bytes"] / MiB,
            "seconds": read["seconds"],
            "fetch_seconds": read["fetch_seconds"],
            "merge_seconds": read["merge_seconds"],
            "mb_s_per_core": read["arrow_bytes"] / MiB / read["seconds"],
            "peak_rss_mb": read["peak_rss"] / MiB,
            "ranges": read["ranges"],
            "get_range_requests": read["get_range_requests"],
            "changes": read["stats"],
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="about 100 MB instead of about 1 GB")
    parser.add_argument("--no-s3", action="store_true", help="skip the local S3 (moto) run")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "engine.json"))
    args = parser.parse_args()

    rows_per_task = 250_000 if args.quick else 1_000_000
    tasks = 2 if args.quick else 4
    cfg = {
        "rows_per_task": rows_per_task,
        "tasks": tasks,
        "partitions": 64,
        "buffer": DEFAULT_BUFFER_BYTES,
        "target": 64 * MiB,
    }
    results: dict = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "pyarrow": pa.__version__},
        "config": cfg,
    }
    workdir = Path(tempfile.mkdtemp(prefix="cdc-bench-"))
    try:
        print("block framing (encode + decode one 200k-row batch) ...", flush=True)
        results["framing"] = in_child(framing_task, {"rows": 200_000})
        print(f"file:// ({tasks} write tasks x {rows_per_task:,} rows per version) ...", flush=True)
        results["file"] = run_backend("file", (workdir / "shuffle").as_uri(), {}, cfg, str(workdir))
        print("memory check: write task with 4x the input ...", flush=True)
        big = dict(cfg, rows_per_task=rows_per_task * 4, tasks=1)
        results["file_4x_input"] = run_backend(
            "file4x", (workdir / "shuffle4x").as_uri(), {}, big, str(workdir)
        )
        if not args.no_s3:
            from cdc_devtools.local_s3 import LocalS3Server

            with LocalS3Server() as server:
                server.client().create_bucket(Bucket="bench")
                print("local S3 (moto server) ...", flush=True)
                results["s3"] = run_backend("s3", "s3://bench/shuffle", server.properties, cfg, str(workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print_summary(results)
    print(f"\nresults written to {out}")


def print_summary(results: dict) -> None:
    print("\n| storage | phase | Arrow MB | seconds | MB/s per core | peak RSS MB |")
    print("|---|---|---:|---:|---:|---:|")
    for key, label in (
        ("file", "file://"),
        ("file_4x_input", "file:// (4x input per task)"),
        ("s3", "local S3"),
    ):
        if key not in results:
            continue
        for phase in ("write", "read_merge"):
            r = results[key][phase]
            print(
                f"| {label} | {phase.replace('_', ' + ')} | {r['arrow_mb']:.0f} | {r['seconds']:.2f} "
                f"| {r['mb_s_per_core']:.0f} | {r['peak_rss_mb']:.0f} |"
            )
    f = results["framing"]
    print(
        f"\nblock framing, encode+decode: Arrow IPC batch {f['arrow_ipc_mb_s']:.0f} MB/s, "
        f"per-record {f['per_record_mb_s']:.0f} MB/s"
    )
    r = results["file"]["read_merge"]
    print(
        f"changes: {r['changes']}; read ranges: {r['ranges']}; GET_RANGE requests: {r['get_range_requests']}"
    )


if __name__ == "__main__":
    main()

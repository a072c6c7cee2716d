"""The work of one Spark task, in plain Python: what runs on executors.

Each function takes the plan and a :class:`Runtime` and does one unit of a
phase: a write task (input files -> one map output), a read task (one read
range of every map output -> merged changes -> one staged sink file), or an
insert task (added files -> INSERT rows staged, no shuffle). They return
small JSON-able dicts of figures and leave their results in storage, so a
retried Spark task simply redoes and overwrites its own output.
"""

from __future__ import annotations

import contextlib
import json
import resource
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

import pyarrow as pa

from iceberg_cdc.changelog.merge import CHANGE_TYPE_COLUMN, MergeStats, merge_changes
from iceberg_cdc.pipeline.paths import SnapshotPaths
from iceberg_cdc.pipeline.plan import SnapshotPlan
from iceberg_cdc.pipeline.runtime import Runtime
from iceberg_cdc.shuffle.fetch import MapOutputSpan, fetch_spans
from iceberg_cdc.shuffle.partitioner import HashPartitioner
from iceberg_cdc.shuffle.rows import Op, shuffle_schema
from iceberg_cdc.shuffle.writer import MapOutputWriter
from iceberg_cdc.sink.schema import sink_arrow_schema, to_sink_arrow
from iceberg_cdc.sink.staging import staged_file_path, write_staged_file
from iceberg_cdc.source.reading import output_schema, read_data_file

T = TypeVar("T")


def reset_peak_rss() -> None:
    """Start a fresh peak-RSS count for this task (Linux >= 4.0; elsewhere the process's peak stays).

    A Spark Python worker runs task after task, so without a reset a task's
    figure would be the worker's peak so far.
    """
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # resets VmHWM only; touches no page state


def peak_rss_mb() -> float:
    """Peak resident memory since :func:`reset_peak_rss`, in MiB (a float, so commit never sums it).

    ``VmHWM`` rather than ``ru_maxrss``: a process started by fork + exec
    inherits its parent's ``ru_maxrss``, not its memory.
    """
    with contextlib.suppress(OSError), open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1 << 20 if sys.platform == "darwin" else 1 << 10), 1)


class _Clock:
    """Seconds spent inside an iterator's ``next`` (e.g. decoding Parquet), apart from the caller's work."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def timed(self, items: Iterable[T]) -> Iterator[T]:
        iterator = iter(items)
        while True:
            started = time.perf_counter()
            item = next(iterator, None)
            self.seconds += time.perf_counter() - started
            if item is None:
                return
            yield item


def _schemas(plan: SnapshotPlan):
    from pyiceberg.schema import Schema

    source = Schema.model_validate_json(plan.schema_json)
    sink = Schema.model_validate_json(plan.sink_schema_json)
    return source, sink


def run_write_task(plan: SnapshotPlan, runtime: Runtime, task_id: str) -> dict[str, Any]:
    """SHUFFLE_WRITE: read the task's files and write its map output."""
    reset_peak_rss()
    started_at, started = time.time(), time.perf_counter()
    task = plan.task(task_id)
    source_schema, _ = _schemas(plan)
    io = runtime.file_io(plan.sink_location)
    partitioner = HashPartitioner(plan.partitions, plan.identifier_columns)
    name = SnapshotPaths(plan.source, plan.snapshot_id).map_output(task_id)
    with (
        tempfile.TemporaryDirectory(prefix="cdc-spill-") as spill_dir,
        MapOutputWriter(
            runtime.store(), name, output_schema(source_schema), partitioner, spill_dir=spill_dir
        ) as writer,
    ):
        reading = _Clock()
        for file in task.files:
            for batch in reading.timed(read_data_file(io, file.path, source_schema)):
                writer.write(batch, Op[file.op])
        committing = time.perf_counter()
        stats = writer.commit()
    done = time.perf_counter()
    return {
        "task_id": task_id,
        "rows": stats.rows,
        "input_bytes": stats.input_bytes,
        "shuffle_bytes": stats.data_bytes,
        "spills": stats.spills,
        "seconds": round(done - started, 3),
        # Where the seconds go: decoding input files, partitioning + encoding (+ spills), assembling
        # and uploading the map output.
        "read_seconds": round(reading.seconds, 3),
        "encode_seconds": round(committing - started - reading.seconds, 3),
        "commit_seconds": round(done - committing, 3),
        "peak_rss_mb": peak_rss_mb(),
        "started_at": started_at,  # epoch seconds: with the job's own clock, a Spark app's fixed cost
        "finished_at": time.time(),
    }


def _staged_path(plan: SnapshotPlan, part: str) -> str:
    # The run's token in the name: a reprocess never overwrites files the sink already references.
    return staged_file_path(plan.sink_location, plan.snapshot_id, f"{part}-{plan.attempt}")


def _record(plan: SnapshotPlan, runtime: Runtime, part: str, staged, stats: dict[str, Any]) -> dict[str, Any]:
    """Leave the task's result where commit finds it: staged files and figures."""
    files = []
    if staged is not None and staged.record_count:
        files.append(
            {"path": staged.path, "record_count": staged.record_count, "file_size": staged.file_size}
        )
    record = {"part": part, "files": files, "stats": stats}
    runtime.store().put(
        SnapshotPaths(plan.source, plan.snapshot_id).staged(part), json.dumps(record).encode()
    )
    return record


def run_read_task(plan: SnapshotPlan, runtime: Runtime, range_doc: dict[str, Any]) -> dict[str, Any]:
    """SHUFFLE_READ: fetch one read range from every map output, merge, stage the changes."""
    reset_peak_rss()
    started_at, started = time.time(), time.perf_counter()
    source_schema, _ = _schemas(plan)
    spans = [MapOutputSpan.from_dict(span) for span in range_doc["spans"]]
    rows = fetch_spans(runtime.store(), spans, shuffle_schema(output_schema(source_schema)))
    fetched = time.perf_counter()
    changes, merge_stats = merge_changes(
        rows, plan.identifier_columns, emit_unpaired=plan.duplicate_keys == "emit_unpaired"
    )
    arrow_bytes = rows.nbytes
    del rows
    merged = time.perf_counter()
    part = f"range-{range_doc['index']:05d}"
    staged = None
    if changes.num_rows:
        _, sink_schema = _schemas(plan)
        rows = to_sink_arrow(changes, sink_schema, plan.ordinal, plan.snapshot_id)
        staged = write_staged_file(runtime.file_io(plan.sink_location), _staged_path(plan, part), rows)
    done = time.perf_counter()
    stats = {
        **vars(merge_stats),
        "shuffle_bytes": sum(span.size for span in spans),
        "arrow_bytes": arrow_bytes,
        "fetch_seconds": round(fetched - started, 3),
        "merge_seconds": round(merged - fetched, 3),
        "stage_seconds": round(done - merged, 3),
        "peak_rss_mb": peak_rss_mb(),
        "started_at": started_at,
        "finished_at": time.time(),
    }
    return _record(plan, runtime, part, staged, stats)


def run_insert_task(plan: SnapshotPlan, runtime: Runtime, task_id: str) -> dict[str, Any]:
    """Insert-only snapshots: every added row is an INSERT; no shuffle, streamed batch by batch."""
    started = time.perf_counter()
    task = plan.task(task_id)
    source_schema, sink_schema = _schemas(plan)
    io = runtime.file_io(plan.sink_location)
    change_type = pa.field(CHANGE_TYPE_COLUMN, pa.string(), nullable=False)

    def sink_batches():
        for file in task.files:
            for batch in read_data_file(io, file.path, source_schema):
                inserts = pa.Table.from_batches([batch]).append_column(
                    change_type, pa.array(["INSERT"] * batch.num_rows, pa.string())
                )
                yield from to_sink_arrow(inserts, sink_schema, plan.ordinal, plan.snapshot_id).to_batches()

    part = f"insert-{task_id}"
    staged = write_staged_file(
        io, _staged_path(plan, part), sink_batches(), schema=sink_arrow_schema(sink_schema)
    )
    stats = {**vars(MergeStats(input_rows=staged.record_count, inserts=staged.record_count))}
    stats["seconds"] = round(time.perf_counter() - started, 3)
    return _record(plan, runtime, part, staged, stats)

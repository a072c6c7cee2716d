"""The work of one Spark task, in plain Python: what runs on executors.

Each function takes the plan and a :class:`Runtime` and does one unit of a
phase: a write task (input files -> one map output), a read task (one read
range of every map output -> merged changes -> one staged sink file), or an
insert task (added files -> INSERT rows staged, no shuffle). They return
small JSON-able dicts of figures and leave their results in storage, so a
retried Spark task simply redoes and overwrites its own output.

Each unit also checks that rows are conserved across it -- rows of its input
files (the manifests' record counts) = rows it wrote to the shuffle; rows a
read range's map outputs hold for it = rows it fetched = carryover + change
rows it staged -- and records the counts, so commit can check the whole
snapshot before anything reaches the sink (:mod:`iceberg_cdc.pipeline.conservation`).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import resource
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

import pyarrow as pa

from iceberg_cdc.changelog.merge import CHANGE_TYPE_COLUMN, MergeStats, merge_changes
from iceberg_cdc.errors import CorruptShuffleError
from iceberg_cdc.pipeline.conservation import check_merge, check_written
from iceberg_cdc.pipeline.input_rows import InputRows
from iceberg_cdc.pipeline.map_cancel import CancelBuffer, CancelStats, file_groups
from iceberg_cdc.pipeline.plan import SnapshotPlan
from iceberg_cdc.pipeline.runtime import Runtime
from iceberg_cdc.shuffle.fetch import MapOutputSpan
from iceberg_cdc.shuffle.partitioner import HashPartitioner
from iceberg_cdc.shuffle.range_reader import DEFAULT_MERGE_BYTES, FetchedRange
from iceberg_cdc.shuffle.rows import Op, shuffle_schema
from iceberg_cdc.shuffle.writer import MapOutputWriter
from iceberg_cdc.sink import field_ids
from iceberg_cdc.sink.rows import sink_arrow_schema, to_sink_arrow
from iceberg_cdc.sink.staging import staged_file_path, write_staged_file
from iceberg_cdc.source.reading import output_schema

T = TypeVar("T")
# Compressed shuffle bytes a read task decodes and merges at once (a larger partition: alone).
READ_MERGE_BYTES = DEFAULT_MERGE_BYTES


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
        self.bytes = 0  # Arrow bytes of what was read (the caller counts)

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


def _field_ids(plan: SnapshotPlan) -> dict[int, int] | None:
    """The sink's field-id mapping the plan carries (None: match columns by name)."""
    return None if plan.sink_field_ids is None else field_ids.decode(plan.sink_field_ids)


def run_write_task(plan: SnapshotPlan, runtime: Runtime, task_id: str) -> dict[str, Any]:
    """SHUFFLE_WRITE: read the task's files and write its map output."""
    reset_peak_rss()
    started_at, started = time.time(), time.perf_counter()
    task = plan.task(task_id)
    source_schema, _ = _schemas(plan)
    io = runtime.file_io(plan.sink_location)
    partitioner = HashPartitioner(plan.partitions, plan.identifier_columns)
    paths = plan.paths
    name = paths.map_output(task_id)
    with (
        tempfile.TemporaryDirectory(prefix="cdc-spill-") as spill_dir,
        MapOutputWriter(
            runtime.store(), name, output_schema(source_schema), partitioner, spill_dir=spill_dir
        ) as writer,
    ):
        reading = _Clock()
        inputs = InputRows(plan, io, source_schema)
        cancelling = CancelStats()
        cancel_seconds = 0.0
        for group in file_groups(task.files, plan.cancel_before_shuffle):
            if not group.cancels:
                for file in group.files:
                    for batch in reading.timed(inputs.batches(file)):
                        reading.bytes += batch.nbytes
                        writer.write(batch, Op[file.op])
                continue
            buffer = CancelBuffer(
                plan.identifier_columns,
                memory_bytes=plan.cancel_memory,
                expected_rows=sum(f.record_count for f in group.files),
                spill_dir=spill_dir,
            )
            with contextlib.closing(buffer):
                for file in group.files:
                    for batch in reading.timed(inputs.batches(file, plan.row_lineage)):
                        reading.bytes += batch.nbytes
                        buffer.add(batch, Op[file.op])
                cancel_started = time.perf_counter()
                for table, op in buffer.survivors():
                    writer.write(table, op)
                cancel_seconds += time.perf_counter() - cancel_started
            cancelling.add(buffer.stats)
        committing = time.perf_counter()
        stats = writer.commit()
    check_written(plan, task, stats.rows, inputs.masked, cancelling.cancelled)
    written = {
        "task_id": task_id,
        "epoch": plan.epoch,
        "rows": stats.rows,
        "masked": inputs.masked,
        "cancelled": cancelling.cancelled,
        "partition_rows": stats.partition_rows,
        "data_bytes": stats.data_bytes,
    }
    # Written after the index: with it the map output counts as committed (barrier, coalesce).
    runtime.store().put(paths.written(task_id), json.dumps(written).encode())
    done = time.perf_counter()
    return {
        "task_id": task_id,
        "rows": stats.rows,
        "masked_rows": sum(inputs.masked.values()),
        "cancelled_rows": cancelling.rows,
        "cancelled_by_lineage": cancelling.by_lineage,
        "cancel_spilled_groups": cancelling.spilled_groups,
        "cancel_spill_bytes": cancelling.spill_bytes,
        "read_arrow_bytes": reading.bytes,  # every row read, as Arrow
        "input_bytes": stats.input_bytes,  # Arrow bytes handed to the shuffle writer
        "shuffle_bytes": stats.data_bytes,
        "spills": stats.spills,
        "seconds": round(done - started, 3),
        # Where the seconds go: decoding input files, cancelling carryover (and encoding what is
        # left), partitioning + encoding (+ spills), assembling and uploading the map output.
        "read_seconds": round(reading.seconds, 3),
        "cancel_seconds": round(cancel_seconds, 3),
        "encode_seconds": round(committing - started - reading.seconds - cancel_seconds, 3),
        "commit_seconds": round(done - committing, 3),
        "peak_rss_mb": peak_rss_mb(),
        "started_at": started_at,  # epoch seconds: with the job's own clock, a Spark app's fixed cost
        "finished_at": time.time(),
    }


def _staged_path(plan: SnapshotPlan, part: str) -> str:
    """A name no write ever used: the run's epoch directory and a random suffix per task attempt.

    A committed file must never be written again (Java readers find the footer
    from the size in the manifest), and a retried task, a cleared run or a
    reprocess must never overwrite one; the staged record names the file that
    counts, and cleanup deletes the others.
    """
    return staged_file_path(
        plan.sink_location, plan.snapshot_id, f"{part}-{uuid.uuid4().hex[:12]}", attempt=plan.attempt
    )


def _record(plan: SnapshotPlan, runtime: Runtime, part: str, staged, stats: dict[str, Any]) -> dict[str, Any]:
    """Leave the task's result where commit finds it: staged files and figures."""
    files = []
    if staged is not None and staged.record_count:
        files.append(
            {"path": staged.path, "record_count": staged.record_count, "file_size": staged.file_size}
        )
    record = {"part": part, "epoch": plan.epoch, "files": files, "stats": stats}
    runtime.store().put(plan.paths.staged(part), json.dumps(record).encode())
    return record


def run_read_task(plan: SnapshotPlan, runtime: Runtime, range_doc: dict[str, Any]) -> dict[str, Any]:
    """SHUFFLE_READ: fetch one read range from every map output, merge it a few partitions at a time,
    stage the changes.

    The range's bytes go to a local file (one GET per map output); rows are
    decoded and merged one partition group at a time and their changes
    streamed into the staged Parquet file, so the task's memory follows the
    largest partition, not the range (:mod:`iceberg_cdc.shuffle.range_reader`).
    """
    reset_peak_rss()
    started_at, started = time.time(), time.perf_counter()
    source_schema, sink_schema = _schemas(plan)
    mapping = _field_ids(plan)
    spans = [MapOutputSpan.from_dict(span) for span in range_doc["spans"]]
    part = f"range-{range_doc['index']:05d}"
    merge_stats = MergeStats()
    clock = {
        "decode": 0.0,
        "merge": 0.0,
        "arrow_bytes": 0,
        "largest_group_bytes": 0,
        "groups": 0,
        "change_rows": 0,
    }
    where = f"table {plan.source}, snapshot {plan.snapshot_id}"
    with (
        tempfile.TemporaryDirectory(prefix="cdc-read-") as spill_dir,
        FetchedRange(
            runtime.store(), spans, shuffle_schema(output_schema(source_schema)), spill_dir=spill_dir
        ) as fetched,
    ):
        fetched.fetch()
        fetched_at = time.perf_counter()

        def sink_batches() -> Iterator[pa.RecordBatch]:
            for lo, hi in fetched.groups(READ_MERGE_BYTES):
                decoding = time.perf_counter()
                rows = fetched.read(lo, hi)
                merging = time.perf_counter()
                changes, stats = merge_changes(
                    rows,
                    plan.identifier_columns,
                    emit_unpaired=plan.duplicate_keys == "emit_unpaired",
                    where=where,
                )
                merge_stats.add(stats)
                clock["arrow_bytes"] += rows.nbytes
                clock["largest_group_bytes"] = max(int(clock["largest_group_bytes"]), rows.nbytes)
                clock["groups"] += 1
                clock["change_rows"] += changes.num_rows
                del rows
                done = time.perf_counter()
                clock["decode"] += merging - decoding
                clock["merge"] += done - merging
                if changes.num_rows:
                    yield from to_sink_arrow(
                        changes,
                        sink_schema,
                        plan.ordinal,
                        plan.snapshot_id,
                        plan.snapshot_timestamp_ms,
                        source_schema=source_schema,
                        field_ids=mapping,
                    ).to_batches()

        batches = sink_batches()
        first = next(batches, None)  # no change row in the whole range: no file
        staged = None
        if first is not None:
            staged = write_staged_file(
                runtime.file_io(plan.sink_location),
                _staged_path(plan, part),
                itertools.chain([first], batches),
                schema=sink_arrow_schema(sink_schema),
            )
        span_rows = fetched.span_rows
    _check_span_rows(plan, range_doc, spans, span_rows)
    check_merge(plan, range_doc["index"], merge_stats, int(clock["change_rows"]))
    done = time.perf_counter()
    stats = {
        **vars(merge_stats),
        "rows_read": merge_stats.input_rows,
        "shuffle_bytes": sum(span.size for span in spans),
        "arrow_bytes": int(clock["arrow_bytes"]),  # every row decoded, as Arrow
        "largest_group_arrow_bytes": int(clock["largest_group_bytes"]),  # held at once
        "merge_groups": int(clock["groups"]),
        "fetch_seconds": round(fetched_at - started + clock["decode"], 3),
        "merge_seconds": round(clock["merge"], 3),
        "stage_seconds": round(done - fetched_at - clock["decode"] - clock["merge"], 3),
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
    mapping = _field_ids(plan)
    io = runtime.file_io(plan.sink_location)
    change_type = pa.field(CHANGE_TYPE_COLUMN, pa.string(), nullable=False)
    inputs = InputRows(plan, io, source_schema)

    def sink_batches():
        for file in task.files:
            for batch in inputs.batches(file):
                inserts = pa.Table.from_batches([batch]).append_column(
                    change_type, pa.repeat(pa.scalar("INSERT", pa.string()), batch.num_rows)
                )
                yield from to_sink_arrow(
                    inserts,
                    sink_schema,
                    plan.ordinal,
                    plan.snapshot_id,
                    plan.snapshot_timestamp_ms,
                    source_schema=source_schema,
                    field_ids=mapping,
                ).to_batches()

    part = f"insert-{task_id}"
    staged = write_staged_file(
        io, _staged_path(plan, part), sink_batches(), schema=sink_arrow_schema(sink_schema)
    )
    check_written(plan, task, {"DELETE": 0, "INSERT": staged.record_count}, inputs.masked)
    stats = {**vars(MergeStats(input_rows=staged.record_count, inserts=staged.record_count))}
    stats["rows_read"] = staged.record_count
    stats["masked_rows"] = sum(inputs.masked.values())
    stats["seconds"] = round(time.perf_counter() - started, 3)
    return _record(plan, runtime, part, staged, stats)


def _check_span_rows(
    plan: SnapshotPlan, range_doc: dict[str, Any], spans: list[MapOutputSpan], span_rows: list[int]
) -> None:
    """Each map output gave this range exactly the rows its writer recorded for these partitions."""
    expected = range_doc.get("span_rows")
    if expected is None:
        raise CorruptShuffleError(
            f"read range {range_doc['index']} of snapshot {plan.snapshot_id} has no expected row counts: "
            "its ranges.json was not written by this release's coalesce"
        )
    for span, want, got in zip(spans, expected, span_rows, strict=True):
        if want != got:
            raise CorruptShuffleError(
                f"map output {span.name!r} gave {got} rows for partitions [{span.first_partition}, "
                f"{span.first_partition + len(span.offsets) - 1}) of read range {range_doc['index']}, but its "
                f"write task recorded {want}: the object was replaced, emptied or truncated after it "
                "was written."
            )

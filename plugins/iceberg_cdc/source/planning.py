"""Pack a snapshot's changed files into SHUFFLE_WRITE tasks of about ``target_bytes`` each.

One task per data file would drown the scheduler (and the barrier, and the
shuffle reader, which fetches once per map output) when a snapshot touches
many small files; one task for everything would serialize the work. So files
are bin-packed by bytes: each task holds files summing to at most the target,
and a file at or above the target forms a task of its own.

The plan must be reproducible: a retried detect step, or a rerun of the same
snapshot, must produce the same task ids with the same files, because task ids
name the map outputs (a retried task overwrites its own output, and the
barrier waits for exactly the planned names). Hence the total order on input
files before packing, and task ids that hash the files' ``op:path`` strings.
"""

from __future__ import annotations

import bisect
import hashlib
from dataclasses import dataclass, field
from typing import Any, Literal

from iceberg_cdc.source.change_files import (
    DataFileRef,
    PartitionValues,
    SnapshotChanges,
    partition_values_from_dict,
    partition_values_to_dict,
)

Op = Literal["DELETE", "INSERT"]
_OPS: tuple[str, ...] = ("DELETE", "INSERT")


@dataclass(frozen=True)
class InputFile:
    """A data file to read in a write task, and the operation its rows are tagged with.

    ``partition_values`` are the file's identity-partition values (source
    field id -> JSON value), for ``read_data_file(..., partition_values=...)``
    to fill partition columns the file itself lacks (Hive-layout files).
    They are not part of the task id: a path names one file, whose partition
    never changes.

    ``deletes`` / ``require`` (merge-on-read): the delete files whose rows are
    not live, and those a row must match to count (a kept file's newly deleted
    rows); see :class:`~iceberg_cdc.source.changes.DataFileRef`. They are part
    of the task id when present.
    """

    path: str
    size: int
    record_count: int
    op: Op
    partition_values: PartitionValues | None = field(default=None, hash=False)
    deletes: tuple[str, ...] = ()
    require: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise ValueError(f"op must be one of {_OPS}, not {self.op!r}")
        if self.size < 0:
            raise ValueError(f"file size must not be negative: {self.path} has {self.size}")

    def to_dict(self) -> dict[str, Any]:
        data = {"path": self.path, "size": self.size, "record_count": self.record_count, "op": self.op}
        if self.partition_values is not None:  # absent when none: plans stay as they were
            data["partition_values"] = partition_values_to_dict(self.partition_values)
        if self.deletes:
            data["deletes"] = list(self.deletes)
        if self.require:
            data["require"] = list(self.require)
        return data

    @property
    def key(self) -> str:
        """``op:path``, plus the delete files when there are any: what the task id hashes."""
        base = f"{self.op}:{self.path}"
        if not (self.deletes or self.require):
            return base
        return f"{base}|deletes={','.join(self.deletes)}|require={','.join(self.require)}"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InputFile:
        return cls(
            path=str(data["path"]),
            size=int(data["size"]),
            record_count=int(data["record_count"]),
            op=data["op"],
            partition_values=partition_values_from_dict(data.get("partition_values")),
            deletes=tuple(str(p) for p in data.get("deletes", ())),
            require=tuple(str(p) for p in data.get("require", ())),
        )


def task_id_of(files: tuple[InputFile, ...] | list[InputFile]) -> str:
    """First 16 hex digits of sha256 over the sorted :attr:`InputFile.key` strings, one per line."""
    keys = sorted(f.key for f in files)
    return hashlib.sha256("\n".join(keys).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class WriteTask:
    """One SHUFFLE_WRITE task: its deterministic id and the files it reads, in reading order."""

    task_id: str
    files: tuple[InputFile, ...]

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def record_count(self) -> int:
        return sum(f.record_count for f in self.files)

    def to_dict(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "files": [f.to_dict() for f in self.files]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WriteTask:
        """Rebuild a task from its JSON form; a task id that does not match its files is rejected."""
        files = tuple(InputFile.from_dict(f) for f in data["files"])
        task_id = str(data["task_id"])
        if task_id != task_id_of(files):
            raise ValueError(
                f"write task {task_id}: the id does not match its files (corrupt or edited plan)"
            )
        return cls(task_id=task_id, files=files)


def input_files(changes: SnapshotChanges) -> list[InputFile]:
    """The snapshot's removed files as DELETE inputs and its added files as INSERT inputs."""

    def convert(refs: tuple[DataFileRef, ...], op: Op) -> list[InputFile]:
        return [
            InputFile(r.path, r.size, r.record_count, op, r.partition_values, r.deletes, r.require)
            for r in refs
        ]

    return convert(changes.deleted, "DELETE") + convert(changes.added, "INSERT")


def pack_files(files: list[InputFile], target_bytes: int, max_files_per_task: int = 1000) -> list[WriteTask]:
    """Best-fit-decreasing bin packing of ``files`` into tasks of at most ``target_bytes``.

    Why this packing: decreasing order with an any-fit rule is near optimal
    (at most 11/9 of the optimal number of bins, and never two tasks both at
    most half full, so many tiny files become few full tasks); *best* fit
    (the open task with the least room that still fits) finds its task by
    bisection over tasks sorted by room, O(n log n), where first fit needs a
    scan of every open task per file. Determinism comes from a total order:
    files by size descending, then op, then path; ties between tasks with the
    same room go to the older task. Tasks come out in the order they were
    opened, largest files first, which also suits scheduling (longest first).

    A file of ``target_bytes`` or more is a task of its own; a task is closed
    when it holds ``max_files_per_task`` files (each file is one open/GET, and
    a plan entry, so a huge count of empty-ish files stays bounded too).
    """
    if target_bytes <= 0:
        raise ValueError(f"target_bytes must be positive, not {target_bytes}")
    if max_files_per_task <= 0:
        raise ValueError(f"max_files_per_task must be positive, not {max_files_per_task}")
    seen: set[tuple[str, str]] = set()
    for f in files:
        if (f.op, f.path) in seen:
            raise ValueError(f"file listed twice as {f.op}: {f.path}")
        seen.add((f.op, f.path))

    ordered = sorted(files, key=lambda f: (-f.size, f.op, f.path))
    bins: list[list[InputFile]] = []
    room: list[int] = []  # remaining bytes per bin
    open_bins: list[tuple[int, int]] = []  # (room, bin index), sorted
    for f in ordered:
        if f.size >= target_bytes:
            bins.append([f])
            room.append(0)
            continue
        at = bisect.bisect_left(open_bins, (f.size, -1))
        if at < len(open_bins):
            _, index = open_bins.pop(at)
        else:
            index = len(bins)
            bins.append([])
            room.append(target_bytes)
        bins[index].append(f)
        room[index] -= f.size
        if len(bins[index]) < max_files_per_task and room[index] > 0:
            bisect.insort(open_bins, (room[index], index))
    return [WriteTask(task_id=task_id_of(b), files=tuple(b)) for b in bins]


def plan_write_tasks(
    changes: SnapshotChanges, target_bytes: int, max_files_per_task: int = 1000
) -> list[WriteTask]:
    """The SHUFFLE_WRITE tasks of one snapshot: its changed files packed near ``target_bytes`` per task.

    The same changes always give the same tasks, in the same order, whatever
    order pyiceberg listed the files in (see :func:`pack_files`).
    """
    return pack_files(input_files(changes), target_bytes, max_files_per_task)


def plan_to_dict(tasks: list[WriteTask]) -> dict[str, Any]:
    """The plan as a JSON object (the pipeline stores it next to the shuffle files)."""
    return {"tasks": [t.to_dict() for t in tasks]}


def plan_from_dict(data: dict[str, Any]) -> list[WriteTask]:
    return [WriteTask.from_dict(t) for t in data["tasks"]]

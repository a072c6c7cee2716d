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
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from iceberg_cdc.source.change_files import (
    DataFileRef,
    PartitionValues,
    SnapshotChanges,
    read_fields_from_dict,
    read_fields_to_dict,
)
from iceberg_cdc.source.key_ranges import KeyRange, split_by_key_range

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

    ``cancel_group``: files of one partition (spec id and partition tuple,
    as canonical JSON) whose key ranges can overlap (see
    :mod:`iceberg_cdc.source.key_ranges`); the removed and added files of one
    group are planned into one task, which cancels carryover between them
    before the shuffle. None when the file's carryover is left to the shuffle.
    ``first_row_id`` / ``sequence_number``: the file's row lineage inheritance
    (format v3). None of these three is part of the task id (a path names one
    file, whose metadata never changes).
    """

    path: str
    size: int
    record_count: int
    op: Op
    partition_values: PartitionValues | None = field(default=None, hash=False)
    deletes: tuple[str, ...] = ()
    require: tuple[str, ...] = ()
    cancel_group: str | None = field(default=None, compare=False)
    first_row_id: int | None = field(default=None, compare=False)
    sequence_number: int | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise ValueError(f"op must be one of {_OPS}, not {self.op!r}")
        if self.size < 0:
            raise ValueError(f"file size must not be negative: {self.path} has {self.size}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "size": self.size,
            "record_count": self.record_count,
            "op": self.op,
            **read_fields_to_dict(
                self.partition_values, self.deletes, self.require, self.first_row_id, self.sequence_number
            ),
            **({} if self.cancel_group is None else {"cancel_group": self.cancel_group}),
        }

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
            **read_fields_from_dict(data),
            cancel_group=data.get("cancel_group"),
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


def partition_of(ref: DataFileRef) -> str | None:
    """The file's spec id and whole partition tuple as canonical JSON (None when unknown)."""
    if ref.partition is None:
        return None
    return json.dumps([ref.spec_id, list(ref.partition)], sort_keys=True, separators=(",", ":"))


def input_files(changes: SnapshotChanges) -> list[InputFile]:
    """The snapshot's removed files as DELETE inputs and its added files as INSERT inputs.

    Each file's ``cancel_group`` is its partition here; :func:`cancel_groups`
    narrows it to a key range, or clears it.
    """

    def convert(refs: tuple[DataFileRef, ...], op: Op) -> list[InputFile]:
        return [
            InputFile(
                r.path,
                r.size,
                r.record_count,
                op,
                r.partition_values,
                r.deletes,
                r.require,
                partition_of(r),
                r.first_row_id,
                r.sequence_number,
            )
            for r in refs
        ]

    return convert(changes.deleted, "DELETE") + convert(changes.added, "INSERT")


@dataclass(frozen=True)
class CancelPlanning:
    """How detect plans carryover cancelled before the shuffle.

    ``max_group_bytes``: a group of files (a partition, or the part of it whose
    key ranges overlap) with more bytes than this is not kept in one task; its
    files are packed one by one as any other and its carryover is left to the
    shuffle, so no write task runs for much longer than the others.
    ``key_ranges``: file path -> the file's key range from the manifests
    (:mod:`iceberg_cdc.source.key_ranges`), to split partitions where no
    carryover can cross; files without one leave their partition whole.
    """

    max_group_bytes: int
    key_ranges: Mapping[str, KeyRange | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_group_bytes <= 0:
            raise ValueError(f"max_group_bytes must be positive, not {self.max_group_bytes}")


def cancel_groups(
    files: list[InputFile], cancel: CancelPlanning | None, max_files: int
) -> list[list[InputFile]]:
    """The packing items: each group of a partition's files that can share carryover, and single files.

    A partition's files are split into the components of their overlapping
    key ranges (all of them one component when a range is unknown). A
    component with removed and added files is one item, its files tagged with
    their ``cancel_group``; a component too big (bytes or file count) for one
    task, or with files of one operation only, becomes single files without a
    group, as every file is when ``cancel`` is None.
    """
    if cancel is None:
        return [[replace(f, cancel_group=None)] for f in files]
    by_partition: dict[str, list[InputFile]] = {}
    items: list[list[InputFile]] = []
    for f in files:
        if f.cancel_group is None:
            items.append([f])
        else:
            by_partition.setdefault(f.cancel_group, []).append(f)
    for partition, members in by_partition.items():
        ordered = sorted(members, key=lambda f: (f.op, f.path))
        components = split_by_key_range(ordered, lambda f: cancel.key_ranges.get(f.path))
        for index, component in enumerate(components):
            both = {f.op for f in component} == set(_OPS)
            size = sum(f.size for f in component)
            if both and size <= cancel.max_group_bytes and len(component) <= max_files:
                group = partition if len(components) == 1 else f"{partition}#{index}"
                items.append([replace(f, cancel_group=group) for f in component])
            else:
                items.extend([replace(f, cancel_group=None)] for f in component)
    return items


def pack_items(
    items: list[list[InputFile]], target_bytes: int, max_files_per_task: int = 1000
) -> list[WriteTask]:
    """Best-fit-decreasing bin packing of ``items`` (groups of files that stay together) into tasks.

    Why this packing: decreasing order with an any-fit rule is near optimal
    (at most 11/9 of the optimal number of bins, and never two tasks both at
    most half full, so many tiny files become few full tasks); *best* fit
    (the open task with the least room that still fits) finds its task by
    bisection over tasks sorted by room, O(n log n), where first fit needs a
    scan of every open task per file. Determinism comes from a total order:
    files by size descending, then op, then path; ties between tasks with the
    same room go to the older task. Tasks come out in the order they were
    opened, largest files first, which also suits scheduling (longest first).

    An item (a file, or a partition's files kept together so that carryover
    cancels before the shuffle) of ``target_bytes`` or more is a task of its
    own; a task is closed when it holds ``max_files_per_task`` files (each file
    is one open/GET, and a plan entry, so a huge count of empty-ish files stays
    bounded too). An item never exceeds ``max_files_per_task`` files
    (:func:`cancel_groups` splits bigger ones).
    """
    if target_bytes <= 0:
        raise ValueError(f"target_bytes must be positive, not {target_bytes}")
    if max_files_per_task <= 0:
        raise ValueError(f"max_files_per_task must be positive, not {max_files_per_task}")
    seen: set[tuple[str, str]] = set()
    for f in (f for item in items for f in item):
        if (f.op, f.path) in seen:
            raise ValueError(f"file listed twice as {f.op}: {f.path}")
        seen.add((f.op, f.path))

    keyed = []
    for item in items:
        members = sorted(item, key=lambda f: (f.op, f.path))
        keyed.append((sum(f.size for f in members), [(f.op, f.path) for f in members], members))
    keyed.sort(key=lambda k: (-k[0], k[1]))
    bins: list[list[InputFile]] = []
    room: list[int] = []  # remaining bytes per bin
    open_bins: list[tuple[int, int]] = []  # (room, bin index), sorted
    for size, _, members in keyed:
        if size >= target_bytes:
            bins.append(list(members))
            room.append(0)
            continue
        # The open task with the least room that fits the item's bytes and its file count.
        at = bisect.bisect_left(open_bins, (size, -1))
        while at < len(open_bins) and len(bins[open_bins[at][1]]) + len(members) > max_files_per_task:
            at += 1
        if at < len(open_bins):
            _, index = open_bins.pop(at)
        else:
            index = len(bins)
            bins.append([])
            room.append(target_bytes)
        bins[index].extend(members)
        room[index] -= size
        if len(bins[index]) < max_files_per_task and room[index] > 0:
            bisect.insort(open_bins, (room[index], index))
    return [WriteTask(task_id=task_id_of(b), files=tuple(b)) for b in bins]


def plan_write_tasks(
    changes: SnapshotChanges,
    target_bytes: int,
    max_files_per_task: int = 1000,
    cancel: CancelPlanning | None = None,
) -> list[WriteTask]:
    """The SHUFFLE_WRITE tasks of one snapshot: its changed files packed near ``target_bytes`` per task.

    With ``cancel``, the removed and added files of one partition (same spec
    id and partition values) stay in one task, so carryover between them is
    cancelled there (see :mod:`iceberg_cdc.pipeline.map_cancel`). The same
    changes always give the same tasks, in the same order, whatever order
    pyiceberg listed the files in (see :func:`pack_items`).
    """
    files = input_files(changes)
    if cancel is not None and not cancel.key_ranges:
        ranges = {ref.path: ref.key_range for ref in (*changes.deleted, *changes.added)}
        cancel = replace(cancel, key_ranges=ranges)
    return pack_items(cancel_groups(files, cancel, max_files_per_task), target_bytes, max_files_per_task)


def plan_to_dict(tasks: list[WriteTask]) -> dict[str, Any]:
    """The plan as a JSON object (the pipeline stores it next to the shuffle files)."""
    return {"tasks": [t.to_dict() for t in tasks]}


def plan_from_dict(data: dict[str, Any]) -> list[WriteTask]:
    return [WriteTask.from_dict(t) for t in data["tasks"]]

"""The snapshot plan: everything the Spark jobs need, stored as JSON beside the shuffle files.

detect writes it once; every later task reads it by reference, so XCom only
carries the plan's key and small labels. It holds no credentials: Spark jobs
resolve those from their own environment and config.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from iceberg_cdc.coordination.lease import TableLease
from iceberg_cdc.errors import CdcError, CorruptShuffleError, LeaseLostError, ObjectNotFoundError
from iceberg_cdc.pipeline.paths import SnapshotPaths, attempt_name, attempt_of_key
from iceberg_cdc.source.deletes import DeleteFileRef
from iceberg_cdc.source.planning import WriteTask
from iceberg_cdc.storage.base import ObjectStore
from iceberg_cdc.units import format_bytes

PLAN_VERSION = 6  # 3: _commit_timestamp (snapshot_timestamp_ms); 4: carryover cancelled in write tasks;
# 5: sink_field_ids (rows reach sink columns by source field id); 6: bridge
Kind = Literal["with_deletes", "insert_only"]


@dataclass(frozen=True)
class JobGroup:
    """The write (or insert) tasks one Spark application runs; one mapped Airflow task."""

    index: int
    task_ids: tuple[str, ...]
    files: int
    bytes: int

    def label(self, phase: str, count: int) -> str:
        return f"{phase} {self.index + 1}/{count}: {len(self.task_ids)} tasks, {self.files} files, {format_bytes(self.bytes)}"


def group_tasks(tasks: list[WriteTask], parallel_jobs: int) -> list[JobGroup]:
    """Spread tasks over at most ``parallel_jobs`` Spark applications, balancing bytes.

    Largest task first onto the lightest group (LPT); ties by task id, so the
    grouping is deterministic. Each application costs a JVM start (~12 s
    here), which is why tasks are grouped rather than submitted one by one.
    """
    count = max(1, min(parallel_jobs, len(tasks)))
    loads = [0] * count
    members: list[list[WriteTask]] = [[] for _ in range(count)]
    for task in sorted(tasks, key=lambda t: (-t.bytes, t.task_id)):
        lightest = min(range(count), key=lambda i: (loads[i], i))
        members[lightest].append(task)
        loads[lightest] += task.bytes
    return [
        JobGroup(i, tuple(t.task_id for t in group), sum(len(t.files) for t in group), loads[i])
        for i, group in enumerate(members)
        if group
    ]


@dataclass(frozen=True)
class SnapshotPlan:
    source: str
    sink: str
    source_uuid: str
    snapshot_id: int
    parent_id: int | None
    ordinal: int
    operation: str
    kind: Kind
    schema_json: str  # the snapshot's Iceberg schema (pyiceberg Schema JSON)
    sink_schema_json: str  # the sink's schema after evolution
    identifier_columns: list[str] | None
    partitions: int
    duplicate_keys: str
    sink_location: str
    write_tasks: list[WriteTask]
    groups: list[JobGroup]
    initial_load: bool = False
    replace_existing: bool = False  # manual reprocess: replace the snapshot's rows in the sink
    run_id: str = ""
    epoch: int = 0  # the run's lease epoch: its fencing token and the namespace of its objects
    lease_ttl_seconds: float = 300.0
    name_mapping_json: str | None = None  # the source's schema.name-mapping.default, for files without ids
    # Merge-on-read: path -> DeleteFileRef dict of every delete file an input file names.
    delete_files: dict[str, Any] = field(default_factory=dict)
    # Write tasks cancel carryover between a partition's removed and added files before the shuffle,
    # holding at most cancel_memory Arrow bytes (beyond: hash buckets on local disk).
    cancel_before_shuffle: bool = False
    cancel_memory: int = 256 << 20
    row_lineage: bool = False  # format v3: read _row_id / _last_updated_sequence_number to cancel
    # The source snapshot's timestamp-ms: every change row's _commit_timestamp.
    snapshot_timestamp_ms: int | None = None
    # The sink's field-id mapping (sink.field_ids.PROPERTY) after evolution: rows, named by the
    # snapshot's schema, reach sink columns by source field id. None: by name (a sink without one).
    sink_field_ids: str | None = None
    # A bridge over a gap in the source's history (source.history.HistoryGap): reason, from (the
    # watermark's snapshot, whose state the changes start from), common_ancestor; ids as strings.
    bridge: dict[str, Any] | None = None
    version: int = PLAN_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def lease_name(self) -> str:
        """The lease the run holds: its source table's."""
        return self.source

    @property
    def attempt(self) -> str:
        """The namespace of the run that planned this (its lease epoch): names no other run uses."""
        return attempt_name(self.epoch)

    @property
    def paths(self) -> SnapshotPaths:
        """Where this attempt's objects live in the shuffle store."""
        return SnapshotPaths(self.source, self.snapshot_id, self.attempt)

    @property
    def input_records(self) -> int:
        """Rows of every planned input file, from the manifests' record counts."""
        return sum(task.record_count for task in self.write_tasks)

    @property
    def phase(self) -> str:
        return "write" if self.kind == "with_deletes" else "insert"

    def delete_refs(self) -> dict[str, DeleteFileRef]:
        return {path: DeleteFileRef.from_dict(ref) for path, ref in self.delete_files.items()}

    def task(self, task_id: str) -> WriteTask:
        for task in self.write_tasks:
            if task.task_id == task_id:
                return task
        raise KeyError(f"write task {task_id!r} is not in the plan of snapshot {self.snapshot_id}")

    def group_labels(self) -> list[str]:
        return [g.label(self.phase, len(self.groups)) for g in self.groups]

    def to_json(self) -> str:
        data = asdict(self)
        data["write_tasks"] = [t.to_dict() for t in self.write_tasks]
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SnapshotPlan:
        data = json.loads(text)
        if data.get("version") != PLAN_VERSION:
            raise CorruptShuffleError(
                f"the snapshot plan has version {data.get('version')}, but this release of the pipeline reads "
                f"version {PLAN_VERSION}: it was written by another release (the pipeline was upgraded while "
                "the run was in flight). Clear the DAG run from detect, or let the next run start: detect "
                "plans the snapshot again."
            )
        data["write_tasks"] = [WriteTask.from_dict(t) for t in data["write_tasks"]]
        data["groups"] = [
            JobGroup(g["index"], tuple(g["task_ids"]), g["files"], g["bytes"]) for g in data["groups"]
        ]
        return cls(**data)

    def save(self, store: ObjectStore, key: str) -> None:
        store.put(key, self.to_json().encode())

    @classmethod
    def load(cls, store: ObjectStore, key: str) -> SnapshotPlan:
        """The plan at ``key``; a plan that is gone because another run took the table over says so."""
        try:
            return cls.from_json(store.get(key).decode())
        except ObjectNotFoundError:
            raise _plan_gone(store, key) from None


def _plan_gone(store: ObjectStore, key: str) -> CdcError:
    """Why a plan is missing: swept by a run that took the table over (LeaseLostError), or otherwise."""
    table = key.partition("/snapshot-")[0]
    found = attempt_of_key(table, key)
    holder = TableLease(store, table).current() if found is not None else None
    epoch = found[1] if found is not None else ""
    if holder is not None and epoch != attempt_name(holder.epoch):
        return LeaseLostError(
            f"the plan {store.describe(key)} is gone: the run that made it ({epoch}) lost the lease of "
            f"{table}, and {holder.holder()} has taken the table over and swept that run's objects. This "
            "run stops; nothing of it was committed, and the new holder processes the snapshot."
        )
    return ObjectNotFoundError(
        f"the plan {store.describe(key)} does not exist: the run's objects were deleted (cleanup, a "
        "lifecycle rule, or by hand). Nothing was committed; rerun the DAG run from detect."
    )

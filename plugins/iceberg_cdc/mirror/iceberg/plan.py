"""The apply plan of an Iceberg mirror: what the ``mirror_join`` Spark tasks do, stored beside the shuffle files.

``steps.plan`` writes it once per attempt; each Spark task and the commit read
it by key, so XCom carries only the key and the tasks' arguments. It holds no
credentials. Its objects live in one namespace per attempt (the run's lease
epoch), so an overtaken run and the run that took over never touch each
other's objects::

    _mirrors/<mirror>/apply-<changelog snapshot>/epoch-<n>/plan.json           the plan
    _mirrors/<mirror>/apply-<changelog snapshot>/epoch-<n>/keys.parquet        the changed keys
    _mirrors/<mirror>/apply-<changelog snapshot>/epoch-<n>/staged/<unit>.json  each unit's result
    _mirrors/<mirror>/apply-<changelog snapshot>/epoch-<n>/stats/<phase>.json  seconds and figures
    _mirrors/<mirror>/apply-<changelog snapshot>/epoch-<n>/errors/<phase>-<g>.json  a failed group
    _mirrors/<mirror>/apply-<changelog snapshot>/epoch-<n>/commit-pending.json  an unknown commit outcome

**Units.** A ``join`` unit reads the key columns of a bin-pack of the
mirror's data files that pruning could not rule out, finds the live rows
whose key changed, and writes their delete files (or, copy-on-write, the
files rewritten without them). A ``rows`` unit writes one staged part of the
upserts as new data files. Every unit writes under the apply's staging
directory in the mirror's data location, under names no other attempt uses.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from iceberg_cdc.errors import ObjectNotFoundError
from iceberg_cdc.pipeline.paths import attempt_name
from iceberg_cdc.storage import ObjectStore
from iceberg_cdc.units import format_bytes

MIRROR_PLAN_VERSION = 1
MIRRORS_PREFIX = "_mirrors/"
Mode = Literal["merge-on-read", "copy-on-write"]
MODES: tuple[str, ...] = ("merge-on-read", "copy-on-write")


def mirror_prefix(mirror: str) -> str:
    """Every object of every apply of ``mirror`` in the shuffle store (ends with ``/``)."""
    return f"{MIRRORS_PREFIX}{mirror}/"


@dataclass(frozen=True)
class ApplyPaths:
    """Where one attempt of an Iceberg mirror's apply keeps its objects.

    Not :class:`iceberg_cdc.mirror.staging.MirrorPaths`, the mirror DAG's own
    namespace (its staged net changes): an apply's objects sit under that
    namespace's ``join/`` root when the mirror DAG runs it.
    """

    mirror: str
    changelog_snapshot_id: int
    attempt: str
    root: str | None = None  # a namespace the caller gave (the mirror DAG run's ``join/``), else our own

    @property
    def apply_prefix(self) -> str:
        return f"{mirror_prefix(self.mirror)}apply-{self.changelog_snapshot_id}/"

    @property
    def prefix(self) -> str:
        return self.root if self.root else f"{self.apply_prefix}{self.attempt}/"

    @property
    def plan(self) -> str:
        return self.prefix + "plan.json"

    @property
    def keys(self) -> str:
        return self.prefix + "keys.parquet"

    @property
    def staged_prefix(self) -> str:
        return self.prefix + "staged/"

    def staged(self, unit_id: str) -> str:
        return f"{self.staged_prefix}{unit_id}.json"

    def stats(self, phase: str) -> str:
        return self.prefix + f"stats/{phase}.json"

    def group_error(self, phase: str, group: int) -> str:
        return self.prefix + f"errors/{phase}-{group:04d}.json"

    @property
    def commit_pending(self) -> str:
        return self.prefix + "commit-pending.json"


@dataclass(frozen=True)
class CandidateFile:
    """A live data file of the mirror that may hold a changed key, with the deletes that apply to it."""

    path: str
    record_count: int
    size: int
    spec_id: int
    partition: list[Any]  # JSON values (partition_value_to_json)
    manifest: str  # the manifest that lists it: copy-on-write removes it there
    deletes: list[str] = field(default_factory=list)  # keys into ApplyPlan.delete_files

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CandidateFile:
        return cls(**data)


@dataclass(frozen=True)
class Unit:
    unit_id: str
    kind: Literal["join", "rows"]
    files: list[CandidateFile] = field(default_factory=list)  # join
    part: dict[str, Any] | None = None  # rows: {"key": store key, "rows": n}

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Unit:
        return cls(
            unit_id=data["unit_id"],
            kind=data["kind"],
            files=[CandidateFile.from_dict(f) for f in data.get("files", ())],
            part=data.get("part"),
        )


@dataclass(frozen=True)
class ApplyPlan:
    """The Iceberg target's plan of one apply: join units, rows units, groups (the ``mirror_join`` phase).

    Not :class:`iceberg_cdc.mirror.staging.MirrorPlan`, the mirror DAG's record
    of the net changes it staged for whichever target applies them.
    """

    mirror: str
    source: str
    lease_name: str
    run_id: str
    epoch: int
    lease_ttl_seconds: float
    through: dict[str, int]
    key_columns: list[str]
    mode: str
    format_version: int
    base_snapshot_id: int | None
    metadata_json: str  # the mirror's metadata without history: schema, spec, properties
    location: str
    staging_dir: str  # where this attempt's units write (under the mirror's data location)
    key_count: int
    upsert_rows: int
    delete_rows: int
    units: list[Unit]
    groups: list[list[str]]
    # ref key -> DeleteFileRef dict, plus "manifest" and "file_scoped" (whether the commit replaces it)
    delete_files: dict[str, dict[str, Any]] = field(default_factory=dict)
    figures: dict[str, int] = field(default_factory=dict)
    root: str | None = None  # ApplyPaths.root
    repair: str | None = None  # a verification's repair id (StagedNetChanges.repair)
    # The schema change the commit makes (metadata_json holds the new schema), by field id (.schema).
    schema_changed: bool = False
    base_schema_id: int | None = None  # the mirror's schema the change was computed from
    field_ids: str | None = None  # the mapping property to set with the commit (None: keep it)
    version: int = MIRROR_PLAN_VERSION

    @property
    def changelog_snapshot_id(self) -> int:
        return int(self.through["changelog_snapshot_id"])

    @property
    def snapshot_id(self) -> int:
        """What the phase driver's log lines name: the changelog snapshot the apply reaches."""
        return self.changelog_snapshot_id

    @property
    def attempt(self) -> str:
        return attempt_name(self.epoch)

    @property
    def paths(self) -> ApplyPaths:
        return ApplyPaths(self.mirror, self.changelog_snapshot_id, self.attempt, self.root)

    def unit(self, unit_id: str) -> Unit:
        for unit in self.units:
            if unit.unit_id == unit_id:
                return unit
        raise KeyError(f"unit {unit_id!r} is not in the apply plan of mirror {self.mirror}")

    def group_units(self, group: int) -> list[Unit]:
        wanted = set(self.groups[group])
        return [u for u in self.units if u.unit_id in wanted]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ApplyPlan:
        data = json.loads(text)
        if data.get("version") != MIRROR_PLAN_VERSION:
            raise ValueError(
                f"mirror plan version {data.get('version')} is not {MIRROR_PLAN_VERSION}: plan again"
            )
        data["units"] = [Unit.from_dict(u) for u in data["units"]]
        return cls(**data)

    def save(self, store: ObjectStore) -> str:
        store.put(self.paths.plan, self.to_json().encode())
        return self.paths.plan

    @classmethod
    def load(cls, store: ObjectStore, key: str) -> ApplyPlan:
        try:
            return cls.from_json(store.get(key).decode())
        except ObjectNotFoundError:
            raise ObjectNotFoundError(
                f"the mirror apply plan {store.describe(key)} does not exist: the apply's objects were deleted "
                "(cleanup, a lifecycle rule, a run that took the mirror over). Nothing was committed; run the "
                "mirror again from its plan step."
            ) from None


def bin_pack(files: list[Any], target: int) -> list[list[Any]]:
    """Files in order of path, packed into units of about ``target`` bytes (a big file alone)."""
    units: list[list[Any]] = []
    size = 0
    for file in sorted(files, key=lambda f: f.path):
        if not units or size + file.size > target:
            units.append([])
            size = 0
        units[-1].append(file)
        size += file.size
    return units


def spread_groups(units: list[Unit], parallel: int) -> list[list[str]]:
    """Units spread over at most ``parallel`` groups, largest first onto the lightest (deterministic)."""
    count = max(1, min(parallel, len(units)))
    loads, members = [0] * count, [[] for _ in range(count)]
    weight = {u.unit_id: max(u.bytes, int(u.part["rows"]) * 100 if u.part else 0) for u in units}
    for unit in sorted(units, key=lambda u: (-weight[u.unit_id], u.unit_id)):
        lightest = min(range(count), key=lambda i: (loads[i], i))
        members[lightest].append(unit.unit_id)
        loads[lightest] += weight[unit.unit_id]
    return [sorted(m) for m in members if m]


def label(plan: ApplyPlan, group: int) -> str:
    units = plan.group_units(group)
    joins = [u for u in units if u.kind == "join"]
    rows = [u for u in units if u.kind == "rows"]
    size = sum(u.bytes for u in joins)
    parts = []
    if joins:
        parts.append(f"{sum(len(u.files) for u in joins)} files, {format_bytes(size)}")
    if rows:
        parts.append(f"{sum(int(u.part['rows']) for u in rows if u.part)} new rows")
    return f"mirror_join {group + 1}/{len(plan.groups)}: " + ", ".join(parts or ["nothing"])

"""A mirror run's net changes, staged as Parquet in the shuffle store and named by a small JSON plan.

Everything one attempt writes sits under the run's lease epoch, so cleanup is
one prefix delete and an overtaken run can never touch the files of the run
that took over::

    <table>/mirror-<name>/epoch-<n>/plan.json              the plan (plan_apply)
    <table>/mirror-<name>/epoch-<n>/net/upserts.parquet    upserts: mirror columns, one row per key
    <table>/mirror-<name>/epoch-<n>/net/deletes.parquet    deletes: key columns
    <table>/mirror-<name>/epoch-<n>/join/...               the Iceberg target's own objects

XCom carries only the plan's key and a few figures; a target reads the net
changes with :func:`load_net_changes`.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.schema import Schema

from iceberg_cdc.errors import CdcError, ObjectNotFoundError
from iceberg_cdc.mirror.net_changes import ChangelogMark, NetChanges
from iceberg_cdc.pipeline.paths import attempt_name
from iceberg_cdc.storage import ObjectStore

_ATTEMPT = re.compile(r"^(epoch-\d+)/")


def mirror_prefix(table: str, mirror_name: str) -> str:
    """Every object of every attempt of one mirror (ends with ``/``)."""
    return f"{table}/mirror-{mirror_name}/"


@dataclass(frozen=True)
class MirrorPaths:
    table: str  # source identifier
    mirror_name: str
    attempt: str  # attempt_name(epoch)

    @classmethod
    def of(cls, table: str, mirror_name: str, epoch: int) -> MirrorPaths:
        return cls(table, mirror_name, attempt_name(epoch))

    @property
    def prefix(self) -> str:
        return f"{mirror_prefix(self.table, self.mirror_name)}{self.attempt}/"

    @property
    def plan(self) -> str:
        return self.prefix + "plan.json"

    @property
    def upserts(self) -> str:
        return self.prefix + "net/upserts.parquet"

    @property
    def deletes(self) -> str:
        return self.prefix + "net/deletes.parquet"

    @property
    def join_prefix(self) -> str:
        """Where the Iceberg target keeps what its join tasks write."""
        return self.prefix + "join/"


def attempts_of(store: ObjectStore, table: str, mirror_name: str) -> set[str]:
    """The attempts (``epoch-<n>``) that left objects under the mirror's prefix."""
    prefix = mirror_prefix(table, mirror_name)
    found = set()
    for info in store.list(prefix):
        match = _ATTEMPT.match(info.key[len(prefix) :])
        if match:
            found.add(match.group(1))
    return found


@dataclass(frozen=True)
class MirrorPlan:
    """What one mirror run applies: marks, columns, key, and where its net changes are."""

    source: str
    changelog: str
    mirror_type: str
    mirror_table: str
    mirror_name: str
    run_id: str
    epoch: int
    key_columns: list[str]
    columns: list[str]
    changelog_schema_json: str  # the changelog's pyiceberg schema: column types for the target
    base: dict[str, Any] | None
    through: dict[str, Any]
    upserts: str
    deletes: str
    upsert_rows: int
    delete_rows: int
    snapshots: int
    reprocessed: list[str] = field(default_factory=list)
    repair: str | None = None  # a verification's repair: the mirror keeps its watermark (mirror.verify)

    @property
    def base_mark(self) -> ChangelogMark | None:
        return ChangelogMark.from_dict(self.base)

    @property
    def through_mark(self) -> ChangelogMark:
        mark = ChangelogMark.from_dict(self.through)
        assert mark is not None
        return mark

    @property
    def paths(self) -> MirrorPaths:
        return MirrorPaths.of(self.source, self.mirror_name, self.epoch)

    def changelog_schema(self) -> Schema:
        return Schema.model_validate_json(self.changelog_schema_json)

    def fields(self):
        """The mirror's columns as Iceberg fields (names and types), in the plan's order."""
        by_name = {f.name: f for f in self.changelog_schema().fields}
        return [by_name[name] for name in self.columns]

    def save(self, store: ObjectStore, key: str) -> None:
        store.put(key, json.dumps(asdict(self), indent=1).encode())

    @classmethod
    def load(cls, store: ObjectStore, key: str) -> MirrorPlan:
        try:
            return cls(**json.loads(store.get(key)))
        except ObjectNotFoundError:
            raise CdcError(
                f"the mirror plan {store.describe(key)} is gone: its run's cleanup (or a later run's sweep) "
                "removed it, so the run cannot go on; nothing was applied, and the next run plans afresh"
            ) from None


def _write_parquet(store: ObjectStore, key: str, table: pa.Table) -> None:
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="zstd")
    store.put(key, buffer.getvalue())


def _read_parquet(store: ObjectStore, key: str) -> pa.Table:
    return pq.read_table(io.BytesIO(store.get(key)))


def stage_net_changes(
    store: ObjectStore,
    paths: MirrorPaths,
    net: NetChanges,
    *,
    plan_fields: dict[str, Any],
) -> MirrorPlan:
    """Write the net changes and their plan; returns the plan (saved at ``paths.plan``)."""
    _write_parquet(store, paths.upserts, net.upserts)
    _write_parquet(store, paths.deletes, net.deletes)
    plan = MirrorPlan(
        **plan_fields,
        key_columns=list(net.key_columns),
        through=net.through.to_dict(),
        upserts=paths.upserts,
        deletes=paths.deletes,
        upsert_rows=net.upserts.num_rows,
        delete_rows=net.deletes.num_rows,
    )
    plan.save(store, paths.plan)
    return plan


def load_net_changes(store: ObjectStore, plan: MirrorPlan) -> NetChanges:
    """The staged net changes of ``plan``; row counts are checked against the plan."""
    upserts = _read_parquet(store, plan.upserts)
    deletes = _read_parquet(store, plan.deletes)
    if (upserts.num_rows, deletes.num_rows) != (plan.upsert_rows, plan.delete_rows):
        raise CdcError(
            f"the staged net changes of {store.describe(plan.paths.prefix)} hold {upserts.num_rows} upserts and "
            f"{deletes.num_rows} deletes, the plan says {plan.upsert_rows} and {plan.delete_rows}: they were "
            "changed after planning. Nothing was applied; the next run plans afresh."
        )
    return NetChanges(upserts, deletes, tuple(plan.key_columns), plan.through_mark)

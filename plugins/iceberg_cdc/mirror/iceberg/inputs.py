"""What an apply to an Iceberg mirror starts from: net changes staged as Parquet, and the run's lease.

The mirror core (:mod:`iceberg_cdc.mirror.net_changes`) folds the changelog
snapshots after the mirror's watermark into net changes per key and stages
them in the shuffle store; XCom carries only references. The Iceberg target
reads this document (JSON, at the key ``staged["net_changes"]``)::

    {"key_columns": ["id"],
     "through": {"changelog_snapshot_id": 123, "source_snapshot_id": 456, "ordinal": 7},
     "upserts": [{"key": "<store key>.parquet", "rows": 1000}, ...],   # one row per key, every column
     "deletes": [{"key": "<store key>.parquet", "rows": 10}, ...],     # key columns only
     "source": "shop.orders"}                                          # optional, for messages

and the run's lease from ``staged`` itself: ``run_id``, ``epoch``,
``lease_ttl`` and ``lease`` (the lease's name in the shuffle store's
``_leases/``). Only tests and benches stage this document
(``cdc_devtools.staged_inputs.stage_net_changes`` writes it).

The mirror DAG's own staging (:mod:`iceberg_cdc.mirror.staging`) is read as
well: its plan document (``staged["plan"]``) names one ``upserts`` and one
``deletes`` Parquet object with their row counts, the mirror's ``columns``,
and the run (``run_id``, ``epoch``, ``source``, ``mirror_name``); the lease
is then the mirror DAG's (``_mirrors/<source>/<mirror name>``) and the
Iceberg target keeps its objects in that run's namespace (``join/``), which
the DAG's cleanup and sweep remove.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from iceberg_cdc.errors import ConfigError
from iceberg_cdc.storage import ObjectStore


@dataclass(frozen=True)
class Through:
    """The last changelog snapshot the net changes cover: the mirror's watermark once applied."""

    changelog_snapshot_id: int
    source_snapshot_id: int
    ordinal: int

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Through:
        return cls(int(data["changelog_snapshot_id"]), int(data["source_snapshot_id"]), int(data["ordinal"]))

    def to_dict(self) -> dict[str, int]:
        return {
            "changelog_snapshot_id": self.changelog_snapshot_id,
            "source_snapshot_id": self.source_snapshot_id,
            "ordinal": self.ordinal,
        }


@dataclass(frozen=True)
class StagedPart:
    key: str
    rows: int


@dataclass(frozen=True)
class StagedNetChanges:
    """The staged document, parsed: where the rows are and how many each part holds."""

    key_columns: tuple[str, ...]
    through: Through
    upserts: tuple[StagedPart, ...]
    deletes: tuple[StagedPart, ...]
    source: str = ""
    columns: tuple[str, ...] | None = None  # the mirror's columns, when the stager chose them
    run: dict[str, Any] | None = None  # the run that staged them (run_id, epoch, lease), if the document says
    root: str | None = None  # where the target's own objects go, when the stager gives it a namespace
    repair: str | None = None  # a verification's repair id: rewrite keys at the watermark, keeping it
    changelog_schema_json: str | None = None  # the changelog's schema the net changes were read with

    @property
    def upsert_rows(self) -> int:
        return sum(part.rows for part in self.upserts)

    @property
    def delete_rows(self) -> int:
        return sum(part.rows for part in self.deletes)

    @classmethod
    def load(cls, store: ObjectStore, key: str) -> StagedNetChanges:
        data = json.loads(store.get(key))
        if isinstance(data.get("upserts"), str):
            return cls._from_mirror_dag(key, data)
        if not data.get("key_columns"):
            raise ConfigError(
                f"the staged net changes {store.describe(key)} name no key columns: a mirror holds one row "
                "per key, so the table needs identifier columns (tables[].identifier_columns)"
            )
        return cls(
            key_columns=tuple(data["key_columns"]),
            through=Through.from_dict(data["through"]),
            upserts=tuple(StagedPart(p["key"], int(p["rows"])) for p in data.get("upserts", ())),
            deletes=tuple(StagedPart(p["key"], int(p["rows"])) for p in data.get("deletes", ())),
            source=str(data.get("source", "")),
        )

    @classmethod
    def _from_mirror_dag(cls, key: str, data: Mapping[str, Any]) -> StagedNetChanges:
        """The mirror DAG's plan document (:class:`iceberg_cdc.mirror.staging.ApplyPlan`)."""
        return cls(
            key_columns=tuple(data["key_columns"]),
            through=Through.from_dict(data["through"]),
            upserts=(StagedPart(data["upserts"], int(data["upsert_rows"])),),
            deletes=(StagedPart(data["deletes"], int(data["delete_rows"])),),
            source=str(data.get("source", "")),
            columns=tuple(data["columns"]) if data.get("columns") else None,
            run={
                "run_id": data["run_id"],
                "epoch": int(data["epoch"]),
                "lease": f"_mirrors/{data['source']}/{data['mirror_name']}",
            },
            root=key.rsplit("/", 1)[0] + "/join/",
            repair=data.get("repair"),
            changelog_schema_json=data.get("changelog_schema_json"),
        )


@dataclass(frozen=True)
class RunLease:
    """The run's hold on the mirror: renewed with its epoch before anything shared changes."""

    name: str
    run_id: str
    epoch: int
    ttl: float

    @classmethod
    def of(
        cls, staged: Mapping[str, Any], mirror_table: str, run: Mapping[str, Any] | None = None
    ) -> RunLease:
        """From ``staged`` (XCom), completed by the staged document's ``run`` (the mirror DAG's plan)."""
        given = {k: v for k, v in staged.items() if k in ("run_id", "epoch", "lease", "lease_ttl")}
        merged = {**(run or {}), **given}
        if "lease_ttl" not in merged:
            from iceberg_cdc.run.lease import lease_ttl_seconds

            merged["lease_ttl"] = lease_ttl_seconds()
        missing = [k for k in ("run_id", "epoch", "lease") if merged.get(k) in (None, "")]
        if missing:
            raise ValueError(
                f"the staged reference for the mirror {mirror_table} lacks {missing}: the mirror run's "
                "lease (its name, run id and epoch) must come with it"
            )
        return cls(
            str(merged["lease"]),
            str(merged["run_id"]),
            int(merged["epoch"]),
            float(merged["lease_ttl"]),
        )

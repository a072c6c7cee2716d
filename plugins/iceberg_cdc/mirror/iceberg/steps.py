"""The Iceberg mirror's Airflow-free steps: plan, (the ``mirror_join`` Spark tasks), commit, cleanup.

A mirror run calls, in order:

* :func:`plan` -- proves the run's lease, creates or evolves the mirror,
  stops at once when the mirror's watermark already covers the net changes,
  collects the changed keys, prunes the mirror's files (:mod:`.pruning`),
  bin-packs the candidates into join units and the upserts into rows units,
  spreads them over ``spark.parallel_jobs`` groups and saves the plan; its
  answer (small, for XCom) holds ``join_args``: one list of Spark
  application arguments per group
  (``--phase mirror_join --plan <key> --group <n> --label <text>``);
* the mapped Spark tasks run those groups (``spark_app`` / ``connect_app``,
  or :func:`run_units_inline` in process);
* :func:`commit` -- lease, the plan is this run's, conservation
  (:func:`~.commit.build_delta`, files still there), a ``commit-pending``
  marker, the lease again, then the one commit of data, deletes and
  watermark, exactly once (:func:`~.commit.commit_delta`);
* :func:`cleanup` (a teardown: after failures too) -- deletes the attempt's
  objects and the staged files no commit references, unless a commit's
  outcome is unknown; :func:`sweep_attempt` does the same for an attempt
  that died before its cleanup (both in :mod:`.cleanup`, re-exported here).
"""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.schema import Schema
from pyiceberg.types import NestedField

from iceberg_cdc.coordination.commit_in_flight import commit_in_flight
from iceberg_cdc.coordination.lease import TableLease
from iceberg_cdc.errors import ConfigError, LeaseLostError, MirrorStateError
from iceberg_cdc.mirror.iceberg import join
from iceberg_cdc.mirror.iceberg.cleanup import (
    cleanup,
    files_added_by,
    sweep_attempt,
    unit_records,
)
from iceberg_cdc.mirror.iceberg.commit import NOT_COMMITTED, build_delta, check_files_exist, commit_delta
from iceberg_cdc.mirror.iceberg.inputs import RunLease, StagedNetChanges
from iceberg_cdc.mirror.iceberg.phase import PHASE
from iceberg_cdc.mirror.iceberg.plan import (
    MODES,
    ApplyPaths,
    ApplyPlan,
    Unit,
    bin_pack,
    label,
    spread_groups,
)
from iceberg_cdc.mirror.iceberg.pruning import prune
from iceberg_cdc.mirror.iceberg.reads import last_apply, watermark
from iceberg_cdc.mirror.iceberg.schema import mapping_json, planned_schema
from iceberg_cdc.mirror.iceberg.summary import apply_summary
from iceberg_cdc.mirror.iceberg.table import (
    create_or_load,
    evolve,
    read_mirror_watermark,
    source_schema_at,
)
from iceberg_cdc.pipeline.groups import phase_seconds, record_phase
from iceberg_cdc.pipeline.runtime import Runtime
from iceberg_cdc.pyiceberg_internals.commit import set_schema_at
from iceberg_cdc.pyiceberg_internals.data_writer import metadata_for_units
from iceberg_cdc.source.reading import output_schema

log = logging.getLogger("iceberg_cdc.mirror")

DEFAULT_UNIT_BYTES = 256 << 20
STAGING_DIR = "data/_mirror"


def _setting(mirror: Any, name: str, default: Any = None) -> Any:
    if isinstance(mirror, Mapping):
        return mirror.get(name, default)
    return getattr(mirror, name, default)


def _mode(mirror: Any) -> str:
    mode = _setting(mirror, "mode") or "merge-on-read"
    if mode not in MODES:
        raise ConfigError(f"mirror {_setting(mirror, 'table')}: mode {mode!r} is not one of {list(MODES)}")
    return mode


def _lease(ctx: Any, run: RunLease) -> TableLease:
    return TableLease(ctx.runtime.store(), run.name)


def _confirm(ctx: Any, run: RunLease) -> None:
    _lease(ctx, run).renew(run.run_id, run.epoch, run.ttl)


def _changed_keys(store: Any, net: StagedNetChanges, key_types: pa.Schema) -> pa.Table:
    """Distinct keys of every upsert and delete, in the mirror's key types."""
    names = list(net.key_columns)
    # In the key's order: pyiceberg's Schema.select and Parquet's column projection keep their own.
    key_types = pa.schema([key_types.field(name) for name in names])
    parts = [
        pq.read_table(io.BytesIO(store.get(part.key)), columns=names).select(names).cast(key_types)
        for part in (*net.upserts, *net.deletes)
    ]
    if not parts:
        return key_types.empty_table()
    # Grouped by storage type: Arrow cannot group extension types (uuid).
    storage = pa.schema(
        [
            f.with_type(f.type.storage_type if isinstance(f.type, pa.BaseExtensionType) else f.type)
            for f in key_types
        ]
    )
    keys = pa.concat_tables(parts).cast(storage)
    return keys.group_by(names, use_threads=False).aggregate([]).select(names).cast(key_types)


def _sink_fields(net: StagedNetChanges) -> list[NestedField]:
    """The changelog's fields the mirror holds, in the stager's order (its columns)."""
    schema = Schema.model_validate_json(net.changelog_schema_json or "")
    by_name = {f.name: f for f in schema.fields}
    return [by_name[name] for name in (net.columns or [])]


def plan(ctx: Any, mirror: Any, staged: Mapping[str, Any]) -> dict[str, Any]:
    """Plan one apply of the staged net changes to the Iceberg mirror (see module doc)."""
    started = time.perf_counter()
    mirror_table = str(_setting(mirror, "table"))
    mode = _mode(mirror)
    store = ctx.runtime.store()
    net = StagedNetChanges.load(store, staged.get("net_changes") or staged["plan"])
    run = RunLease.of(staged, mirror_table, net.run)
    _confirm(ctx, run)
    source_name = net.source or ctx.table.source
    answer = {
        "mirror": mirror_table,
        "run_id": run.run_id,
        "epoch": run.epoch,
        "lease_ttl": run.ttl,
        "lease": run.name,
        "root": net.root,
        "through": net.through.to_dict(),
        "join_args": [],
        "labels": [],
    }
    catalog = ctx.catalog()
    source = catalog.load_table(source_name)
    source_schema = source_schema_at(source, net.through.source_snapshot_id)
    if net.columns is not None:  # the mirror's columns, as the stager chose them (excluded ones left out)
        present = {f.name for f in source_schema.fields}
        source_schema = source_schema.select(*[c for c in net.columns if c in present])
    table, created = create_or_load(
        catalog,
        mirror_table,
        source_schema=source_schema,
        source_spec=source.spec(),
        key_columns=net.key_columns,
        format_version=int(_setting(mirror, "format_version") or source.metadata.format_version),
    )
    watermark = read_mirror_watermark(table)
    follow = None
    if net.changelog_schema_json is not None:  # by field id, committed with the rows (.schema)
        evolved = False
        sink_fields = _sink_fields(net)
    else:  # a staged document without the changelog's schema: by name, as before field ids
        evolved = evolve(table, source_schema)
        sink_fields = None
    if net.repair is not None:
        if watermark != net.through:
            raise MirrorStateError(
                f"mirror {mirror_table} moved while it was verified (its watermark is {watermark}, the "
                f"verification read {net.through}): nothing was repaired; verify again"
            )
    elif watermark is not None and watermark.ordinal >= net.through.ordinal:
        return {
            **answer,
            "action": "skip",
            "reason": f"the mirror already holds changelog snapshot {watermark.changelog_snapshot_id} "
            f"(ordinal {watermark.ordinal}), at or past {net.through.changelog_snapshot_id}",
        }
    metadata = table.metadata
    if sink_fields is not None:
        follow = planned_schema(table, sink_fields)
        if follow.changed:
            staged_tx = table.transaction()
            set_schema_at(staged_tx, follow.schema, table.metadata.current_schema_id)
            metadata = staged_tx.table_metadata  # what the units write with, and the commit sets
            evolved = follow.schema != table.schema()
    schema = metadata.schema()
    missing = [name for name in net.key_columns if name not in {f.name for f in schema.fields}]
    if missing:
        raise ConfigError(f"mirror {mirror_table}: key columns {missing} are not columns of the mirror")
    key_schema = schema.select(*net.key_columns)
    keys = _changed_keys(store, net, output_schema(key_schema))
    head = table.current_snapshot()
    base = head.snapshot_id if head is not None else None
    pruned = prune(table, base, keys, net.key_columns)
    unit_bytes = int(getattr(getattr(ctx.config, "shuffle", None), "write_task_size", DEFAULT_UNIT_BYTES))
    units = [
        Unit(f"join-{i:05d}", "join", files=files)
        for i, files in enumerate(bin_pack(pruned.candidates, unit_bytes))
    ]
    units += [
        Unit(f"rows-{i:05d}", "rows", part={"key": part.key, "rows": part.rows})
        for i, part in enumerate(net.upserts)
        if part.rows
    ]
    parallel = int(getattr(getattr(ctx.config, "spark", None), "parallel_jobs", 2))
    paths = ApplyPaths(mirror_table, net.through.changelog_snapshot_id, f"epoch-{run.epoch}", net.root)
    apply_plan = ApplyPlan(
        mirror=mirror_table,
        source=source_name,
        lease_name=run.name,
        run_id=run.run_id,
        epoch=run.epoch,
        lease_ttl_seconds=run.ttl,
        through=net.through.to_dict(),
        key_columns=list(net.key_columns),
        mode=mode,
        format_version=int(table.metadata.format_version),
        base_snapshot_id=base,
        metadata_json=metadata_for_units(metadata),
        location=table.location(),
        staging_dir=f"{table.location().rstrip('/')}/{STAGING_DIR}/apply-{net.through.changelog_snapshot_id}/"
        f"epoch-{run.epoch}" + ("/repair" if net.repair else ""),
        key_count=keys.num_rows,
        upsert_rows=net.upsert_rows,
        delete_rows=net.delete_rows,
        units=units,
        groups=spread_groups(units, parallel),
        delete_files=pruned.delete_files,
        figures={**pruned.figures, "created": int(created), "evolved": int(evolved)},
        root=net.root,
        repair=net.repair,
        schema_changed=bool(follow and follow.schema != table.schema()),
        base_schema_id=table.metadata.current_schema_id,
        field_ids=mapping_json(follow.mapping) if follow is not None and follow.changed else None,
    )
    if follow is not None and follow.changed:
        log.info("mirror %s: schema follows the changelog by field id: %s", mirror_table, follow.figures)
    sink = io.BytesIO()
    pq.write_table(keys, sink)
    store.put(paths.keys, sink.getvalue())
    key = apply_plan.save(store)
    record_phase(store, paths, "plan", started, **apply_plan.figures)  # type: ignore[arg-type]
    labels = [label(apply_plan, g) for g in range(len(apply_plan.groups))]
    log.info(
        "mirror %s: apply through changelog snapshot %s: %d keys, %d of %d files to join, %d units in %d groups",
        mirror_table,
        net.through.changelog_snapshot_id,
        keys.num_rows,
        pruned.figures.get("candidate_files", 0),
        pruned.figures.get("data_files", 0),
        len(units),
        len(apply_plan.groups),
    )
    return {
        **answer,
        "action": "apply",
        "plan": key,
        "join_args": [
            ["--phase", PHASE, "--plan", key, "--group", str(g), "--label", labels[g]]
            for g in range(len(apply_plan.groups))
        ],
        "labels": labels,
        "keys": keys.num_rows,
        **{k: v for k, v in pruned.figures.items()},
    }


def run_units_inline(runtime: Runtime, planned: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every group's units in this process, as the Spark tasks run them (tests, bench, small mirrors)."""
    if planned.get("action") != "apply":
        return []
    from iceberg_cdc.pipeline.groups import record_group

    store = runtime.store()
    apply_plan = ApplyPlan.load(store, planned["plan"])
    results = []
    for group in range(len(apply_plan.groups)):
        started = time.perf_counter()
        done = [
            join.run_mirror_join_task(apply_plan, runtime, u.unit_id) for u in apply_plan.group_units(group)
        ]
        record_group(store, apply_plan, PHASE, group, time.perf_counter() - started, done)  # type: ignore[arg-type]
        results.extend(done)
    return results


def _own_plan(store: Any, planned: Mapping[str, Any]) -> ApplyPlan:
    apply_plan = ApplyPlan.load(store, planned["plan"])
    if apply_plan.epoch != int(planned["epoch"]) or apply_plan.run_id != planned["run_id"]:
        raise LeaseLostError(
            f"the mirror plan {planned['plan']} belongs to run {apply_plan.run_id!r} (epoch {apply_plan.epoch}), "
            f"not to this run {planned['run_id']!r} (epoch {planned['epoch']}); nothing was committed"
        )
    return apply_plan


def commit(ctx: Any, mirror: Any, planned: Mapping[str, Any]) -> dict[str, Any]:
    """Check every row, then commit the apply and the watermark once (see module doc)."""
    if planned.get("action") != "apply":
        return {
            "committed": False,
            "reason": planned.get("reason", "nothing to apply"),
            "mirror": planned.get("mirror"),
        }
    run = RunLease(
        str(planned["lease"]), str(planned["run_id"]), int(planned["epoch"]), float(planned["lease_ttl"])
    )
    _confirm(ctx, run)
    store = ctx.runtime.store()
    apply_plan = _own_plan(store, planned)
    paths = apply_plan.paths
    table = ctx.catalog().load_table(apply_plan.mirror)
    records = unit_records(store, paths)
    delta = build_delta(apply_plan, records, table)
    check_files_exist(table, delta.add, apply_plan)
    seconds = phase_seconds(store, paths)  # type: ignore[arg-type]
    summary = apply_summary(
        delta.figures or {},
        seconds,
        keys=apply_plan.key_count,
        files_scanned=apply_plan.figures.get("candidate_files", 0),
        mode=apply_plan.mode,
    )
    started = time.perf_counter()
    result = commit_in_flight(
        store,
        paths.commit_pending,
        run_id=run.run_id,
        epoch=run.epoch,
        confirm_lease=lambda: _confirm(ctx, run),
        commit=lambda: commit_delta(table, apply_plan, delta, summary),
        certainly_not_committed=NOT_COMMITTED,
    )
    log.info(
        "mirror %s: %s through changelog snapshot %s; %s",
        apply_plan.mirror,
        result.reason,
        apply_plan.changelog_snapshot_id,
        ", ".join(f"{k}={v}" for k, v in sorted((delta.figures or {}).items())),
    )
    return {
        "committed": result.committed,
        "reason": result.reason,
        "mirror": apply_plan.mirror,
        "mirror_snapshot_id": str(result.snapshot_id) if result.snapshot_id is not None else None,
        "mirror_location": table.location(),
        "through": apply_plan.through,
        "seconds": {**seconds, "commit": round(time.perf_counter() - started, 3)},
        **(delta.figures or {}),
    }


__all__ = [
    "cleanup",
    "commit",
    "files_added_by",
    "last_apply",
    "plan",
    "run_units_inline",
    "sweep_attempt",
    "watermark",
]

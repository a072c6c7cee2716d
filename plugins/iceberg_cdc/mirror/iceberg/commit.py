"""The apply's one Iceberg commit: new data files, delete files or DVs, removed files and the watermark.

**What is checked first (conservation).** Nothing is committed unless:

* there is a result record for exactly the planned units, each written by
  this attempt (its epoch);
* each join unit scanned exactly its planned files, each file's rows as many
  as its manifest entry says, and each delete it wrote holds the file's old
  deleted positions plus the new ones (a copy-on-write rewrite: rows kept +
  rows deleted = the file's rows);
* the rows units wrote exactly the staged upserts;
* the live rows the commit adds minus the ones it removes (data file records
  minus position deletes, both added and removed) equal the upserts minus
  the rows the join found: every replaced row goes, every upsert comes, and
  nothing else changes;
* every file the units recorded still exists with the recorded size.

**Exactly once.** The new snapshot's summary carries the apply's marker and
the table's properties the watermark, in the same metadata version. Before
each attempt the watermark and the marker are looked up: an apply already
there is not committed again. The commit asserts ``main`` is still at the
snapshot the join read; if anything else moved it, the positions may be
stale and the apply fails with :class:`~iceberg_cdc.errors.MirrorStateError`
(the next run plans again).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation

from iceberg_cdc.errors import ConservationError, MirrorStateError, StaleDeltaError
from iceberg_cdc.mirror.iceberg.datafile_json import data_file_from_json
from iceberg_cdc.mirror.iceberg.inputs import Through
from iceberg_cdc.mirror.iceberg.plan import ApplyPlan
from iceberg_cdc.mirror.iceberg.summary import (
    MAPPING_PROPERTY,
    REPAIR_KEY,
    last_apply_property,
    marker_summary,
    watermark_properties,
)
from iceberg_cdc.mirror.iceberg.table import find_apply, read_mirror_watermark
from iceberg_cdc.pyiceberg_internals.commit import set_schema_at
from iceberg_cdc.pyiceberg_internals.data_writer import parse_metadata
from iceberg_cdc.pyiceberg_internals.format_v3 import writing_v3_metadata
from iceberg_cdc.pyiceberg_internals.manifest_reader import v3_field
from iceberg_cdc.pyiceberg_internals.row_delta import AssertedProperties, FileKey, RowDelta
from iceberg_cdc.retry import MIRROR_COMMIT

DEFAULT_ATTEMPTS = MIRROR_COMMIT.attempts

# What :func:`commit_delta` raises only when nothing was committed: the catalog refused every attempt
# (``CommitFailedException``), or the mirror moved before the catalog call (``MirrorStateError``, from
# the head check or a stale row delta). Anything else may follow a commit that landed, so the
# commit-in-flight marker stays (:mod:`iceberg_cdc.coordination.commit_in_flight`).
NOT_COMMITTED: tuple[type[Exception], ...] = (CommitFailedException, MirrorStateError)


@dataclass
class Delta:
    """What the commit adds and removes, and the figures conservation compares."""

    add: list[DataFile]
    remove: dict[str, list[FileKey]]  # manifest path -> keys
    removed_data_rows: int = 0
    removed_position_deletes: int = 0
    replaced_rows: int = 0  # rows the join found (new deletes)
    upserted_rows: int = 0
    figures: dict[str, int] | None = None


def _fail(plan: ApplyPlan, problem: str) -> ConservationError:
    return ConservationError(
        f"mirror {plan.mirror}, apply through changelog snapshot {plan.changelog_snapshot_id}: {problem}. "
        "Nothing was committed; the next run applies the changes again from its plan step."
    )


def _check_records(plan: ApplyPlan, records: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    by_unit = {r["unit_id"]: r for r in records}
    planned = {u.unit_id for u in plan.units}
    if set(by_unit) != planned or len(by_unit) != len(records):
        missing, extra = sorted(planned - set(by_unit)), sorted(set(by_unit) - planned)
        raise _fail(
            plan, f"unit results do not match the plan (missing {missing[:5]}, unplanned {extra[:5]})"
        )
    stale = [u for u, r in by_unit.items() if int(r["epoch"]) != plan.epoch]
    if stale:
        raise _fail(plan, f"unit results {stale[:5]} were written by another attempt")
    return by_unit


def build_delta(plan: ApplyPlan, records: Sequence[Mapping[str, Any]], table: Table) -> Delta:
    """The commit's files from the units' records, every row accounted for (see module doc)."""
    by_unit = _check_records(plan, records)
    specs, schema = table.specs(), table.schema()
    delta = Delta(add=[], remove={})

    def remove(manifest: str, key: FileKey) -> None:
        delta.remove.setdefault(manifest, []).append(key)

    def remove_old_deletes(file: Any) -> None:
        for key in file.deletes:
            ref = plan.delete_files[key]
            if ref.get("file_scoped"):
                remove(ref["manifest"], (ref["path"], ref.get("content_offset")))
                delta.removed_position_deletes += int(ref["record_count"])

    for unit in plan.units:
        record = by_unit[unit.unit_id]
        added = [
            data_file_from_json(f, specs[int(f["spec_id"])].partition_type(schema)) for f in record["added"]
        ]
        delta.add.extend(added)
        if unit.kind == "rows":
            rows = sum(int(f.record_count) for f in added if f.content == DataFileContent.DATA)
            if rows != int(unit.part["rows"]) if unit.part else rows != 0:
                raise _fail(
                    plan, f"unit {unit.unit_id} wrote {rows} new rows for a staged part of {unit.part}"
                )
            delta.upserted_rows += rows
            continue
        outcomes = record["files"]
        if [o["path"] for o in outcomes] != [f.path for f in unit.files]:
            raise _fail(plan, f"unit {unit.unit_id} scanned other files than planned")
        deletes_for: dict[str, DataFile] = {}
        for data_file in added:
            if data_file.content == DataFileContent.POSITION_DELETES:
                deletes_for[_referenced(data_file)] = data_file
        kept_rows = 0
        for file, outcome in zip(unit.files, outcomes, strict=True):
            if int(outcome["rows_scanned"]) != file.record_count:
                raise _fail(
                    plan, f"{file.path}: scanned {outcome['rows_scanned']} rows of {file.record_count}"
                )
            old, new = int(outcome["old_deleted"]), int(outcome["new_deleted"])
            delta.replaced_rows += new
            action = outcome["action"]
            if action == "none":
                if new:
                    raise _fail(plan, f"{file.path}: {new} rows found but nothing written for them")
                continue
            if action == "deletes":
                written = deletes_for.pop(file.path, None)
                if written is None or int(written.record_count) != old + new:
                    raise _fail(
                        plan,
                        f"{file.path}: its delete holds {getattr(written, 'record_count', 0)} "
                        f"positions, expected {old} deleted before + {new} now",
                    )
                remove_old_deletes(file)
                continue
            if action == "rewrite":
                kept_rows += int(outcome["kept_rows"])
                if int(outcome["kept_rows"]) + old + new != file.record_count:
                    raise _fail(
                        plan,
                        f"{file.path}: rewrite keeps {outcome['kept_rows']} rows + deletes "
                        f"{old + new}, the file has {file.record_count}",
                    )
            elif action == "drop":
                if old + new != file.record_count:
                    raise _fail(
                        plan, f"{file.path}: dropped with {old + new} of {file.record_count} rows deleted"
                    )
            else:
                raise _fail(plan, f"{file.path}: unknown action {action!r}")
            remove(file.manifest, (file.path, None))
            delta.removed_data_rows += file.record_count
            remove_old_deletes(file)
        if deletes_for:
            raise _fail(
                plan, f"unit {unit.unit_id} wrote deletes for unplanned files {sorted(deletes_for)[:3]}"
            )
        rewritten = sum(int(f.record_count) for f in added if f.content == DataFileContent.DATA)
        if rewritten != kept_rows:
            raise _fail(plan, f"unit {unit.unit_id} rewrote {rewritten} rows, its files keep {kept_rows}")
    if delta.upserted_rows != plan.upsert_rows:
        raise _fail(
            plan, f"{delta.upserted_rows} new rows written, the net changes hold {plan.upsert_rows} upserts"
        )
    added_rows = sum(int(f.record_count) for f in delta.add if f.content == DataFileContent.DATA)
    added_deletes = sum(
        int(f.record_count) for f in delta.add if f.content == DataFileContent.POSITION_DELETES
    )
    live_change = (added_rows - delta.removed_data_rows) - (added_deletes - delta.removed_position_deletes)
    if live_change != delta.upserted_rows - delta.replaced_rows:
        raise _fail(
            plan,
            f"the commit would change the live rows by {live_change}, but {delta.upserted_rows} upserts replace "
            f"{delta.replaced_rows} rows ({delta.upserted_rows - delta.replaced_rows:+d})",
        )
    delta.figures = {
        "rows.upserted": delta.upserted_rows,
        "rows.replaced": delta.replaced_rows,
        "rows.live-change": live_change,
        "files.added": len({f.file_path for f in delta.add}),
        "files.removed": sum(len(keys) for keys in delta.remove.values()),
    }
    return delta


def _referenced(data_file: DataFile) -> str:
    return str(v3_field(data_file, "referenced_data_file"))


def check_files_exist(table: Table, files: Sequence[DataFile], plan: ApplyPlan) -> None:
    """Every recorded file is still there with its recorded size (one metadata request each)."""
    sizes = {f.file_path: int(f.file_size_in_bytes) for f in files}

    def size(path: str) -> int | None:
        try:
            return len(table.io.new_input(path))
        except (OSError, FileNotFoundError):
            return None

    with ThreadPoolExecutor(max_workers=16) as pool:
        found = dict(zip(sizes, pool.map(size, sizes), strict=True))
    wrong = [p for p, s in sizes.items() if found[p] != s]
    if wrong:
        raise _fail(plan, f"staged files {wrong[:3]} are missing or changed after their unit wrote them")


def _operation(delta: Delta) -> Operation:
    adds_data = any(f.content == DataFileContent.DATA for f in delta.add)
    if not delta.remove and all(f.content == DataFileContent.DATA for f in delta.add):
        return Operation.APPEND
    if not adds_data:
        return Operation.DELETE
    return Operation.OVERWRITE


@dataclass(frozen=True)
class ApplyResult:
    committed: bool
    reason: str
    snapshot_id: int | None
    attempts: int


def _already(table: Table, through: Through) -> str | None:
    watermark = read_mirror_watermark(table)
    if watermark is not None and watermark.ordinal >= through.ordinal:
        return f"the mirror's watermark is already at ordinal {watermark.ordinal} (changelog snapshot {watermark.changelog_snapshot_id})"
    found = find_apply(table, through)
    if found is not None:
        return f"already applied in mirror snapshot {found.snapshot_id}"
    return None


def _already_repaired(table: Table, plan: ApplyPlan) -> str | None:
    """A repair keeps the watermark, so it is known by its id in a snapshot's summary since the mark."""
    through = Through.from_dict(plan.through)
    watermark = read_mirror_watermark(table)
    snapshot = table.current_snapshot()
    while snapshot is not None:
        if (snapshot.summary or {}).get(REPAIR_KEY) == plan.repair:
            return f"already repaired in mirror snapshot {snapshot.snapshot_id}"
        if snapshot.snapshot_id == plan.base_snapshot_id:
            break
        parent = snapshot.parent_snapshot_id
        snapshot = table.metadata.snapshot_by_id(parent) if parent is not None else None
    if watermark != through:
        raise MirrorStateError(
            f"mirror {plan.mirror} moved while it was verified (its watermark is {watermark}, the repair was "
            f"planned at {through}): nothing was repaired; verify again"
        )
    return None


def commit_delta(
    table: Table,
    plan: ApplyPlan,
    delta: Delta,
    summary: Mapping[str, str],
    *,
    max_attempts: int = DEFAULT_ATTEMPTS,
) -> ApplyResult:
    """Commit ``delta`` and the watermark in one metadata version, exactly once (see module doc)."""
    through = Through.from_dict(plan.through)
    properties = watermark_properties(through, plan.source)
    if plan.field_ids is not None:
        properties[MAPPING_PROPERTY] = plan.field_ids
    marker = {**summary, **marker_summary(through, plan.source)}
    if plan.repair is not None:
        marker[REPAIR_KEY] = plan.repair
    for attempt in range(max_attempts):
        if attempt:
            MIRROR_COMMIT.sleep(attempt - 1)
            table.refresh()
        done = _already_repaired(table, plan) if plan.repair is not None else _already(table, through)
        if done is not None:
            return ApplyResult(False, done, None, attempt + 1)
        head = table.current_snapshot()
        if (head.snapshot_id if head else None) != plan.base_snapshot_id:
            raise MirrorStateError(
                f"mirror {plan.mirror} is at snapshot {head.snapshot_id if head else None}, but the apply was "
                f"planned on {plan.base_snapshot_id}: something else wrote to the mirror. Nothing was committed; "
                "the next run plans again on the mirror's current state"
            )
        snapshot_id: int | None = None
        # The apply is recorded even when no row changed (no snapshot, no summary); a repair is no apply.
        properties.update(last_apply_property(marker, int(time.time() * 1000)))
        try:
            with writing_v3_metadata():
                tx = table.transaction()
                if plan.schema_changed:  # the schema the units wrote with, in the same metadata version
                    assert plan.base_schema_id is not None
                    set_schema_at(tx, parse_metadata(plan.metadata_json).schema(), plan.base_schema_id)
                # The properties first: each update's requirement is checked against the transaction's
                # state, and after the row delta main is no longer at the base.
                AssertedProperties(tx, properties, plan.base_snapshot_id).commit()
                if delta.add or delta.remove:
                    row_delta = RowDelta(
                        tx,
                        base_snapshot_id=plan.base_snapshot_id,
                        add=delta.add,
                        remove=delta.remove,
                        operation=_operation(delta),
                        properties=marker,
                    )
                    row_delta.commit()
                    snapshot_id = row_delta.snapshot_id
                tx.commit_transaction()
        except StaleDeltaError as exc:
            raise MirrorStateError(f"mirror {plan.mirror}: {exc}; the next run plans again") from exc
        except CommitFailedException:
            if attempt == max_attempts - 1:
                raise
            continue
        with contextlib.suppress(Exception):
            table.refresh()
        reason = "committed" if snapshot_id is not None else "no row changed: only the watermark moved"
        return ApplyResult(snapshot_id is not None, reason, snapshot_id, attempt + 1)
    raise AssertionError("unreachable")

"""How detect plans a bridge over a gap in the source's history, and what its records say.

The bridge's changes are the difference between the state the changelog
describes and the target snapshot's. That state is the watermark's snapshot
while the source still has it (:func:`~iceberg_cdc.source.changes.bridge_changes`
diffs the two snapshots' files). When it is gone too -- a sink configured
before the base tag existed -- it is the changelog's own replay
(:mod:`iceberg_cdc.sink.replay`), staged as one Parquet file next to the run's
staged change files (cleanup deletes it with them, never committed) and
planned as the one removed file against the target's whole state, so the
shuffle's carryover removal leaves the net change.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from typing import Any

from pyiceberg.schema import Schema
from pyiceberg.table import Table

from iceberg_cdc.errors import SourceHistoryError
from iceberg_cdc.run.context import Context
from iceberg_cdc.sink import field_ids
from iceberg_cdc.sink.replay import changelog_rows, replayed_state
from iceberg_cdc.sink.staging import staged_file_path, write_staged_file
from iceberg_cdc.source.change_files import DataFileRef, SnapshotChanges
from iceberg_cdc.source.changes import BRIDGE_OPERATION, bridge_changes, initial_load_changes
from iceberg_cdc.source.history import HistoryGap

log = logging.getLogger("iceberg_cdc")

BASE_FROM_SNAPSHOT = "snapshot"
BASE_FROM_CHANGELOG = "changelog replay"
BASE_FILE_ROWS = 1_000_000  # rows per staged file of a replayed base


def bridge_record(gap: HistoryGap) -> dict[str, Any]:
    """A bridge as detect's XCom and the plan carry it (ids as strings: browsers round 19 digits)."""
    return {
        "reason": gap.reason,
        "from": str(gap.base),
        "to": str(gap.target),
        "common_ancestor": None if gap.common_ancestor is None else str(gap.common_ancestor),
        "base": BASE_FROM_CHANGELOG if gap.base_gone else BASE_FROM_SNAPSHOT,
    }


def refuse_large_bridge(ctx: Context, gap: HistoryGap, input_rows: int) -> None:
    """Stop a bridge that reads more rows than ``tables[].bridge_max_rows``, saying its size and the way on."""
    bound = ctx.table.bridge_max_rows
    if bound is None or input_rows <= bound:
        return
    raise SourceHistoryError(
        f"{ctx.table.source}: {gap.describe()}; the bridge from snapshot {gap.base} to {gap.target} would "
        f"read {input_rows:,} rows, above tables[].bridge_max_rows ({bound:,}). Nothing was committed. "
        "To go on, raise or remove bridge_max_rows (the bridge is one commit of the net change), or set "
        "on_history_gap: fail and restart the sink from the current state (start: latest)."
    )


def changelog_columns(source: Table, sink: Table, schema: Schema) -> dict[int, str]:
    """Source field id -> the changelog column that holds it: the sink's field-id mapping, else the name.

    The changelog follows the source's renames (:mod:`iceberg_cdc.sink.field_ids`); a sink made
    before the mapping existed follows the source's current names.
    """
    by_source = field_ids.reverse(field_ids.read(sink.properties) or {})
    sink_schema, current = sink.schema(), source.schema()
    names: dict[int, str] = {}
    for field in schema.fields:
        sink_id = by_source.get(field.field_id)
        name = sink_schema.find_column_name(sink_id) if sink_id is not None else None
        names[field.field_id] = name or current.find_column_name(field.field_id) or field.name
    return names


def bridge_plan_changes(
    ctx: Context, source: Table, sink: Table, gap: HistoryGap, attempt: str, key_id: int | None
) -> SnapshotChanges:
    """The bridge's changes: from the watermark's snapshot, or from the changelog's replay when it is gone."""
    assert gap.target is not None, "a bridge without a target waits (history_gap)"
    if not gap.base_gone:
        return bridge_changes(source, gap.base, gap.target, key_id)
    # Reading the whole changelog is the cost of this base: refuse before reading it.
    refuse_large_bridge(ctx, gap, changelog_rows(sink))
    target = source.metadata.snapshot_by_id(gap.target)
    schemas = source.schemas()
    schema = schemas.get(target.schema_id) if target and target.schema_id is not None else None
    schema = schema or source.schema()
    state = replayed_state(sink, schema, changelog_columns(source, sink, schema))
    # Files of BASE_FILE_ROWS rows: each is one write task's input, so a big base reads in parallel.
    tag = uuid.uuid4().hex[:12]
    bases = []
    for index, start in enumerate(range(0, state.num_rows, BASE_FILE_ROWS)):
        name = f"bridge-base-{tag}-{index:05d}"
        path = staged_file_path(sink.location(), gap.target, name, attempt=attempt)
        staged = write_staged_file(sink.io, path, state.slice(start, BASE_FILE_ROWS))
        bases.append(
            DataFileRef(
                path=staged.path,
                size=staged.file_size,
                record_count=staged.record_count,
                spec_id=source.spec().spec_id,
            )
        )
    log.warning(
        "%s: the bridge's base is the changelog's replay: %d rows read from %s give %d live rows at "
        "snapshot %s (staged as %d file(s) among the run's staged files, deleted by cleanup)",
        ctx.table.source,
        changelog_rows(sink),
        ctx.table.sink,
        state.num_rows,
        gap.base,
        len(bases),
    )
    whole = initial_load_changes(source, gap.target)
    return dataclasses.replace(whole, parent_id=gap.base, operation=BRIDGE_OPERATION, deleted=tuple(bases))

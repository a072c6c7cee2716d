"""Row conservation: every row of a snapshot's files is accounted for before anything is committed.

The manifests say how many rows each removed and added data file holds. A run
may commit only if the rows add up at every hand-over::

    rows of the planned files (manifest record counts)
      = rows masked by delete files + carryover cancelled before the shuffle (per write task)
        + rows written to the shuffle (per map output, recorded by its write task)
    rows written to the shuffle
      = rows read back (per read range, checked against each map output's record)
      = carryover rows + change rows staged (per read range)

and the staged records are exactly the planned read ranges (or insert tasks),
all of this run's epoch. A missing staged record (a read task marked
"success" by hand, an object removed by a lifecycle rule or by another run), a
map output swapped for a valid but empty one, a reader that silently dropped
rows: each breaks one of these equalities, and the run fails naming it
instead of committing a short changelog and moving the watermark past it.

Pure functions over the plan and the small JSON records the tasks leave; the
commit step gathers the records, these functions judge them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from iceberg_cdc.changelog.merge import MergeStats
from iceberg_cdc.errors import ConservationError
from iceberg_cdc.pipeline.plan import SnapshotPlan
from iceberg_cdc.source.planning import WriteTask

_RETRY = (
    "Nothing was committed and the watermark did not move; the next run (or a retry of this one) "
    "processes the snapshot again from detect."
)


def _where(plan: SnapshotPlan) -> str:
    return f"snapshot {plan.snapshot_id} of {plan.source} (run {plan.run_id!r}, epoch {plan.epoch})"


def check_written(
    plan: SnapshotPlan,
    task: WriteTask,
    rows: Mapping[str, int],
    masked: Mapping[str, int] | None = None,
    cancelled: Mapping[str, int] | None = None,
) -> None:
    """A write (or insert) task wrote the rows its files hold, per operation, less those deletes masked
    and those cancelled as carryover before the shuffle (as many DELETEs as INSERTs)."""
    masked, cancelled = masked or {}, cancelled or {}
    if int(cancelled.get("DELETE", 0)) != int(cancelled.get("INSERT", 0)):
        raise ConservationError(
            f"{_where(plan)}: write task {task.task_id} cancelled {cancelled.get('DELETE', 0)} DELETE but "
            f"{cancelled.get('INSERT', 0)} INSERT rows as carryover; carryover cancels in pairs. This is a "
            f"defect of the cancellation; please report it. {_RETRY}"
        )
    for op in ("DELETE", "INSERT"):
        expected = sum(f.record_count for f in task.files if f.op == op)
        got, dropped, gone = int(rows.get(op, 0)), int(masked.get(op, 0)), int(cancelled.get(op, 0))
        if got + dropped + gone != expected:
            by_deletes = f" (+ {dropped} rows not live by delete files)" if dropped else ""
            by_cancel = f" (+ {gone} cancelled as carryover)" if gone else ""
            raise ConservationError(
                f"{_where(plan)}: write task {task.task_id} read {got} {op} rows{by_deletes}{by_cancel} "
                f"from its {sum(1 for f in task.files if f.op == op)} file(s), but their manifests record "
                f"{expected} rows. A data file was replaced after it was committed, or the reader "
                f"dropped rows. {_RETRY}"
            )


def check_merge(plan: SnapshotPlan, range_index: int, stats: MergeStats, change_rows: int) -> None:
    """A read range's rows are all carryover or changes, and the changes are what is staged."""
    changes = stats.deletes + stats.inserts + 2 * stats.updates
    if stats.input_rows != stats.carryover_rows + changes or change_rows != changes:
        raise ConservationError(
            f"{_where(plan)}: read range {range_index} fetched {stats.input_rows} rows but accounts for "
            f"{stats.carryover_rows} carryover + {changes} change rows, and {change_rows} change rows "
            f"were produced. This is a defect of the merge; please report it. {_RETRY}"
        )


@dataclass(frozen=True)
class Conservation:
    """The figures a commit is checked on; they go into the sink snapshot's summary."""

    input_rows: int  # rows of the planned files, from the manifests
    masked_rows: int  # rows of those files that merge-on-read deletes left out (not live, or unchanged)
    shuffled_rows: int  # rows the write tasks wrote to the shuffle (0 on the insert-only path)
    read_rows: int  # rows the read (or insert) tasks read back
    carryover_rows: int  # carryover the read tasks removed (after the shuffle)
    change_rows: int  # rows staged for the sink
    cancelled_rows: int = 0  # carryover the write tasks cancelled before the shuffle

    @property
    def all_carryover_rows(self) -> int:
        """Carryover in all: cancelled before the shuffle and removed after it."""
        return self.cancelled_rows + self.carryover_rows

    def rows(self) -> dict[str, int]:
        """The figures by stage, as the commit summary records them (``cdc.rows.<stage>``).

        input = masked + cancelled + shuffled; shuffled = read; read = carryover + changes.
        """
        return {
            "input": self.input_rows,
            "masked": self.masked_rows,
            "cancelled": self.cancelled_rows,
            "shuffled": self.shuffled_rows,
            "read": self.read_rows,
            "carryover": self.carryover_rows,
            "changes": self.change_rows,
        }


def expected_parts(plan: SnapshotPlan, ranges: Sequence[Mapping[str, Any]] | None) -> set[str]:
    """The staged record names this plan must end with: one per read range, or per insert task."""
    if plan.kind == "insert_only":
        return {f"insert-{task.task_id}" for task in plan.write_tasks}
    return {f"range-{int(r['index']):05d}" for r in ranges or ()}


def check_snapshot(
    plan: SnapshotPlan,
    *,
    written: Mapping[str, Mapping[str, Any]],
    ranges: Sequence[Mapping[str, Any]] | None,
    staged: Sequence[Mapping[str, Any]],
    footer_rows: Mapping[str, int],
) -> Conservation:
    """Check the whole snapshot before its commit; return the figures, or raise ConservationError.

    ``written``: task id -> the write task's record (shuffle path only).
    ``ranges``: coalesce's read ranges (shuffle path only). ``staged``: the
    staged records found. ``footer_rows``: staged file path -> rows in its
    Parquet footer, as the commit is about to add it.
    """
    where = _where(plan)
    found = {str(r["part"]) for r in staged}
    wanted = expected_parts(plan, ranges)
    if found != wanted:
        missing, extra = sorted(wanted - found), sorted(found - wanted)
        raise ConservationError(
            f"{where}: the staged results do not match the plan: missing {missing[:5]}"
            f"{' ...' if len(missing) > 5 else ''} ({len(missing)}), unexpected {extra[:5]} ({len(extra)}). "
            f"A read or insert task did not finish (marked success by hand?) or its record was removed. "
            f"{_RETRY}"
        )
    foreign = sorted(str(r["part"]) for r in staged if int(r.get("epoch", -1)) != plan.epoch)
    if foreign:
        raise ConservationError(
            f"{where}: staged records {foreign[:5]} belong to another run's epoch. {_RETRY}"
        )
    input_rows = plan.input_records
    shuffled = cancelled = 0
    # Rows of the input files that merge-on-read deletes left out: recorded by the write tasks on
    # the shuffle path, by the insert tasks' staged records on the insert-only path.
    masked = sum(int(r["stats"].get("masked_rows", 0)) for r in staged)
    if plan.kind == "with_deletes":
        missing_written = sorted(t.task_id for t in plan.write_tasks if t.task_id not in written)
        if missing_written:
            raise ConservationError(
                f"{where}: no row record for map output(s) {missing_written[:5]}. {_RETRY}"
            )
        masked = sum(
            sum(int(v) for v in written[t.task_id].get("masked", {}).values()) for t in plan.write_tasks
        )
        cancelled = sum(
            sum(int(v) for v in written[t.task_id].get("cancelled", {}).values()) for t in plan.write_tasks
        )
        shuffled = sum(sum(int(v) for v in written[t.task_id]["rows"].values()) for t in plan.write_tasks)
        if shuffled + masked + cancelled != input_rows:
            raise ConservationError(
                f"{where}: the write tasks wrote {shuffled} rows to the shuffle (delete files masked "
                f"{masked}, {cancelled} cancelled as carryover before the shuffle), but the snapshot's "
                f"{sum(len(t.files) for t in plan.write_tasks)} input files hold {input_rows} rows "
                f"(manifest record counts). {_RETRY}"
            )
        planned = sum(int(r["rows"]) for r in ranges or ())
        if planned != shuffled:
            raise ConservationError(
                f"{where}: the read ranges cover {planned} rows of the {shuffled} the map outputs hold "
                f"(coalesce left partitions out). {_RETRY}"
            )
    read = sum(int(r["stats"].get("rows_read", -1)) for r in staged)
    carryover = sum(int(r["stats"].get("carryover_rows", 0)) for r in staged)
    changes = 0
    for record in staged:
        for f in record["files"]:
            rows = footer_rows.get(f["path"])
            if rows is None or rows != int(f["record_count"]):
                raise ConservationError(
                    f"{where}: staged file {f['path']} of {record['part']} holds {rows} rows, but its "
                    f"task staged {f['record_count']}: the file was replaced or is missing. {_RETRY}"
                )
            changes += rows
    if read + masked + cancelled != input_rows or read != carryover + changes:
        raise ConservationError(
            f"{where}: rows do not add up: input files {input_rows} (masked by delete files {masked}, "
            f"cancelled before the shuffle {cancelled}), shuffled {shuffled}, read back {read}, carryover "
            f"{carryover} + changes staged {changes} = {carryover + changes}. {_RETRY}"
        )
    return Conservation(input_rows, masked, shuffled, read, carryover, changes, cancelled)

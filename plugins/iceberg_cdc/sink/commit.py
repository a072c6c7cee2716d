"""Exactly-once commit of one source snapshot's changes to the sink.

One Iceberg commit per source snapshot does all of it at once: it appends the
staged Parquet files, marks the new sink snapshot with the source table,
snapshot id, table uuid and ordinal (its summary), and moves the watermark
(sink table properties). Data and watermark are one metadata version, so a
crash leaves either both or neither.

**Exactly once.** Before committing, the sink's history is searched for the
marker (:func:`~iceberg_cdc.sink.table.find_commit`) and the watermark is
checked: a snapshot already committed, or already passed by the watermark, is
not committed again. A retried DAG run, or a commit whose success was lost on
the way back, therefore changes nothing.

**Concurrency.** The catalog commit is a compare-and-swap on the metadata
location; the append also asserts the branch head it was built on. A commit
that loses the race raises ``CommitFailedException``: the table is reloaded
and the marker and watermark checked again before the next attempt, so a retry
never duplicates. pyiceberg 0.12 has its own retry inside
``Transaction.commit_transaction`` (``commit.retry.num-retries``, default 4)
which rebuilds the append on the new head *without* that check; it is switched
off for these commits by committing through a copy of the table object whose
properties say ``commit.retry.num-retries=0``
(:func:`~iceberg_cdc.pyiceberg_internals.commit.table_without_commit_retry`;
the property is read from the table object, not sent to the catalog, so the
stored table is untouched).

**Watermark-only commits** (a snapshot whose changes all cancelled out, a
skipped ``replace`` snapshot) change only properties: no empty data snapshot
is made, so the sink's history holds only real changes. They assert the branch
head too, so they cannot interleave with a data commit unnoticed; two
watermark-only commits of one source racing each other are excluded by the
per-table lease, since Iceberg has no requirement on a property's value.

**Reprocess** (``replace_existing=True``): one transaction deletes the sink rows
of that source snapshot and appends the new files; the watermark never moves
backwards. Staged files of a reprocess need names no earlier run used.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import EqualTo
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

from iceberg_cdc.errors import CdcError, SinkSchemaError, SourceHistoryError
from iceberg_cdc.pyiceberg_internals.commit import adopt, set_properties_at_head, table_without_commit_retry
from iceberg_cdc.retry import SINK_COMMIT
from iceberg_cdc.sink.datafiles import data_files_from_parquet
from iceberg_cdc.sink.schema import COMMIT_SNAPSHOT_ID
from iceberg_cdc.sink.summary import CommitSummary
from iceberg_cdc.sink.table import find_commit, read_watermark, watermark_properties
from iceberg_cdc.watermark import Watermark

DEFAULT_ATTEMPTS = SINK_COMMIT.attempts

# What :func:`commit_changes` raises only when its outcome is known: the catalog refused every attempt
# (``CommitFailedException``), or a check before the catalog call failed (a staged file that does not
# fit the sink, a watermark of another incarnation of the source). Anything else -- a ``CdcError`` of
# the file IO during the catalog call, ``CommitStateUnknownException`` -- may follow a commit that
# landed, so the commit-in-flight marker stays (:mod:`iceberg_cdc.coordination.commit_in_flight`).
NOT_COMMITTED: tuple[type[Exception], ...] = (CommitFailedException, SinkSchemaError, SourceHistoryError)


@dataclass(frozen=True)
class CommitResult:
    """What :func:`commit_changes` did.

    ``committed`` is True when this call changed the sink's rows. It is False
    when the snapshot was already in the sink (``reason`` says how that was
    recognised) or had no changes (then only the watermark moved). ``sink_snapshot_id`` is the sink snapshot
    holding the changes -- the new one, or the earlier commit that was found.
    """

    committed: bool
    reason: str
    watermark: Watermark
    sink_snapshot_id: int | None = None
    data_files: int = 0
    records: int = 0
    attempts: int = 1


def _backoff(attempt: int) -> None:
    """Wait before attempt number ``attempt`` (1 for the first retry)."""
    SINK_COMMIT.sleep(attempt - 1)


def _current_watermark(sink_table: Table, source_identifier: str, source_uuid: str) -> Watermark | None:
    current = read_watermark(sink_table, source_identifier)
    if current is not None and current.source_uuid != source_uuid:
        raise SourceHistoryError(
            f"the sink's watermark for {source_identifier} belongs to a table with uuid "
            f"{current.source_uuid}, but the source now has uuid {source_uuid}: the source table was "
            "dropped and recreated. To capture the new table, start a new sink: drop the sink table "
            "(the next run creates it again) or point tables[].sink at a new table; clearing only the "
            "watermark would restart the ordinals below the ones the sink already holds"
        )
    return current


def _head(table: Table) -> int | None:
    snapshot = table.current_snapshot()
    return snapshot.snapshot_id if snapshot is not None else None


def commit_changes(
    sink_table: Table,
    *,
    staged_paths: Sequence[str],
    source_identifier: str,
    source_uuid: str,
    snapshot_id: int,
    ordinal: int,
    replace_existing: bool = False,
    summary: CommitSummary | None = None,
    max_attempts: int = DEFAULT_ATTEMPTS,
    data_files: Sequence[DataFile] | None = None,
) -> CommitResult:
    """Commit one source snapshot's staged files and watermark in one atomic Iceberg commit.

    ``summary`` adds figures of the run (counts, seconds per phase) to the
    sink snapshot's summary, so they stay with the data they describe; the
    marker (source table, snapshot id, uuid, ordinal) is set here.
    ``data_files``: the staged files' metadata when the caller already read
    their footers (:func:`~iceberg_cdc.sink.datafiles.data_files_from_parquet`
    of ``staged_paths``), so they are read once.

    Files with no rows are left out (cleanup deletes them). With no files left
    only the watermark moves. ``sink_table`` ends up at the metadata the commit
    produced (or the latest, when nothing was committed).

    Raises ``CommitFailedException`` when every attempt lost a race,
    :class:`~iceberg_cdc.errors.SinkSchemaError` for a staged file that does not
    fit the sink's schema, :class:`~iceberg_cdc.errors.SourceHistoryError` when
    the watermark belongs to another incarnation of the source table. Any other
    failure (e.g. ``CommitStateUnknownException``) is passed on: calling again
    is safe, because the marker check recognises a commit that did land.
    """
    if len(set(staged_paths)) != len(staged_paths):
        raise ValueError("staged_paths contains duplicates")
    target = Watermark(source_uuid, snapshot_id, ordinal)
    record = replace(
        summary or CommitSummary(),
        source_table=source_identifier,
        source_snapshot_id=snapshot_id,
        source_uuid=source_uuid,
        change_ordinal=ordinal,
        replace=replace_existing,
    )
    if data_files is not None:
        data_files = [f for f in data_files if f.record_count > 0]
    for attempt in range(max_attempts):
        if attempt:
            _backoff(attempt)
            sink_table.refresh()
        current = _current_watermark(sink_table, source_identifier, source_uuid)
        if not replace_existing:
            done = _already_committed(sink_table, source_identifier, target, current)
            if done is not None:
                return _finish_skip(sink_table, source_identifier, target, done, attempt, max_attempts)
        if data_files is None:
            # Footers are read once (slow on S3): a retry changes metadata, never the files.
            data_files = [
                f
                for f in data_files_from_parquet(sink_table.io, sink_table.metadata, list(staged_paths))
                if f.record_count > 0
            ]
        if replace_existing:
            skip = _replace_already_done(sink_table, snapshot_id, data_files)
            if skip is not None:
                return CommitResult(False, skip, current or target, attempts=attempt + 1)
        new_watermark = target if current is None or current.ordinal < ordinal else current
        try:
            sink_snapshot_id = _commit_once(
                sink_table,
                data_files,
                summary=record,
                watermark=watermark_properties(source_identifier, new_watermark)
                if new_watermark != current
                else None,
                replace_of=snapshot_id if replace_existing else None,
            )
        except CommitFailedException:
            if attempt == max_attempts - 1:
                raise
            continue
        if replace_existing:
            reason = f"replaced the sink rows of source snapshot {snapshot_id}"
        elif data_files:
            reason = "committed"
        else:
            reason = "no changes (they all cancelled out): only the watermark moved"
        return CommitResult(
            committed=replace_existing or bool(data_files),
            reason=reason,
            watermark=new_watermark,
            sink_snapshot_id=sink_snapshot_id,
            data_files=len(data_files),
            records=sum(f.record_count for f in data_files),
            attempts=attempt + 1,
        )
    raise AssertionError("unreachable")


def _already_committed(
    sink_table: Table, source_identifier: str, target: Watermark, current: Watermark | None
) -> tuple[str, int | None] | None:
    found = find_commit(
        sink_table,
        source_identifier,
        target.snapshot_id,
        ordinal=target.ordinal,
        source_uuid=target.source_uuid,
    )
    if found is not None:
        return f"already committed in sink snapshot {found.snapshot_id}", found.snapshot_id
    if current is not None and current.ordinal >= target.ordinal:
        return (
            f"the watermark is already at ordinal {current.ordinal} (snapshot {current.snapshot_id}), "
            f"past this snapshot's ordinal {target.ordinal}",
            None,
        )
    return None


def _finish_skip(
    sink_table: Table,
    source_identifier: str,
    target: Watermark,
    done: tuple[str, int | None],
    attempt: int,
    max_attempts: int,
) -> CommitResult:
    """A snapshot found in the sink: only make sure the watermark is not behind it."""
    reason, sink_snapshot_id = done
    watermark = advance_watermark(
        sink_table,
        source_identifier,
        target.source_uuid,
        target.snapshot_id,
        target.ordinal,
        max_attempts=max(1, max_attempts - attempt),
    )
    return CommitResult(False, reason, watermark, sink_snapshot_id=sink_snapshot_id, attempts=attempt + 1)


def _replace_already_done(sink_table: Table, snapshot_id: int, data_files: list[DataFile]) -> str | None:
    """For a reprocess: None to go ahead, or why it is already done.

    Staged paths that are already live in the sink mean either this very
    reprocess was committed (then the snapshot's rows are exactly these files)
    or the staged names collide with an earlier run's committed files, which
    must never be overwritten or deleted-and-re-added.
    """
    paths = {f.file_path for f in data_files}
    if not paths:
        return None
    live = {
        task.file.file_path
        for task in sink_table.scan(row_filter=EqualTo(COMMIT_SNAPSHOT_ID, snapshot_id)).plan_files()
    }
    overlap = paths & live
    if not overlap:
        return None
    if live == paths:
        return "already replaced: the snapshot's rows in the sink are exactly these staged files"
    raise CdcError(
        f"staged files {sorted(overlap)[:3]} are already committed to the sink; a reprocess must stage "
        "its files under names no earlier run used (put the run id in the name)"
    )


def _commit_once(
    sink_table: Table,
    data_files: list[DataFile],
    *,
    summary: CommitSummary | None,
    watermark: dict[str, str] | None,
    replace_of: int | None,
) -> int | None:
    """One attempt: build and commit the transaction; returns the new sink snapshot id, if any.

    ``summary`` (with its marker) goes on the appended snapshot; it is needed
    whenever ``data_files`` or ``replace_of`` are given.
    """
    if not data_files and watermark is None and replace_of is None:
        return None
    table = table_without_commit_retry(sink_table)
    tx = table.transaction()
    if watermark is not None:
        set_properties_at_head(tx, watermark, _head(table))
    if replace_of is not None:
        assert summary is not None
        removed = CommitSummary(source_table=summary.source_table, replaced_snapshot_id=replace_of)
        tx.delete(EqualTo(COMMIT_SNAPSHOT_ID, replace_of), snapshot_properties=removed.to_summary())
    snapshot_id: int | None = None
    if data_files:
        assert summary is not None
        with tx.update_snapshot(snapshot_properties=summary.to_summary()).fast_append() as append:
            for data_file in data_files:
                append.append_data_file(data_file)
            snapshot_id = append.snapshot_id
    tx.commit_transaction()
    adopt(sink_table, table)
    return snapshot_id


def advance_watermark(
    sink_table: Table,
    source_identifier: str,
    source_uuid: str,
    snapshot_id: int,
    ordinal: int,
    *,
    max_attempts: int = DEFAULT_ATTEMPTS,
) -> Watermark:
    """Move the watermark to a snapshot without committing data (skipped snapshots).

    Never backwards: a watermark already at or past ``ordinal`` is left as it
    is. Returns the watermark as it now stands.
    """
    target = Watermark(source_uuid, snapshot_id, ordinal)
    for attempt in range(max_attempts):
        if attempt:
            _backoff(attempt)
            sink_table.refresh()
        current = _current_watermark(sink_table, source_identifier, source_uuid)
        if current is not None and current.ordinal >= ordinal:
            return current
        try:
            _commit_once(
                sink_table,
                [],
                summary=None,
                watermark=watermark_properties(source_identifier, target),
                replace_of=None,
            )
            return target
        except CommitFailedException:
            if attempt == max_attempts - 1:
                raise
    raise AssertionError("unreachable")

"""Where each configured table's change capture stands, read from Iceberg alone (no Airflow).

Everything here comes from the catalog: the source table's history, and the
sink table's watermark properties and snapshot summaries, which outlive
Airflow's database (:mod:`iceberg_cdc.sink.table`, :mod:`iceberg_cdc.run.commit_step`).
Per table:

* the **watermark** -- the last source snapshot the sink has processed (id and ordinal);
* the **lag** -- snapshots of the source's current history after the watermark
  (:func:`~iceberg_cdc.source.history.pending_count`), and the age of the
  oldest of them: how long the oldest unprocessed change has been waiting;
* the **last processed snapshots** -- one per sink commit carrying the
  ``cdc.source-snapshot-id`` marker, newest first, with the figures the commit
  recorded: INSERT / DELETE / UPDATE counts, carryover, shuffle bytes, seconds
  per phase, the conservation rows (``cdc.rows.*``) and skew warnings where a
  commit recorded any. Commits made before a figure existed simply lack it
  (shown as unknown, never as zero). Snapshots whose changes all cancelled
  out, and skipped ``replace`` snapshots, move the watermark without a sink
  commit, so they have no entry;
* the table's **lease** (a run holding it now), when the shuffle store can be read.

A problem with one table -- its sink not created yet, its source missing, a
watermark that no longer fits the source's history, an unreachable catalog --
is recorded on that table (:attr:`TableStatus.errors` / :attr:`TableStatus.notes`)
and never stops the others: this module raises nothing for a table's state.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from iceberg_cdc.config import CdcConfig, TableConfig, is_secret_key
from iceberg_cdc.ui.mirrors import MirrorReader, MirrorStatus, default_reader, mirror_statuses
from iceberg_cdc.units import format_bytes

DEFAULT_RECENT = 10
DEFAULT_TIMEOUT_SECONDS = 20.0

# The commit's summary is read through iceberg_cdc.sink.summary.CommitSummary (imported where used:
# it brings pyiceberg). The conservation stages shown:
ROW_STAGES = ("input", "shuffled", "read", "carryover", "changes")
# Phases in the order a run goes through them; others follow alphabetically.
PHASE_ORDER = ("detect", "insert", "write", "coalesce", "read", "commit", "watermark", "cleanup")


@dataclass(frozen=True)
class ProcessedSnapshot:
    """One source snapshot committed to the sink, with the figures its commit recorded."""

    source_snapshot_id: int
    ordinal: int | None
    sink_snapshot_id: int
    committed_at: datetime
    operation: str | None  # the source snapshot's operation (append, overwrite, ...)
    initial_load: bool
    reprocess: bool  # a manual reprocess that replaced the snapshot's earlier rows
    inserts: int | None
    deletes: int | None
    updates: int | None
    carryover_rows: int | None
    shuffle_bytes: int | None
    change_rows: int | None  # rows added to the sink (INSERT + DELETE + 2 x UPDATE)
    seconds: dict[str, float] = field(default_factory=dict)
    # conservation rows: input, shuffled, read, carryover, changes
    rows: dict[str, int] = field(default_factory=dict)
    skew: list[str] = field(default_factory=list)

    @property
    def balanced(self) -> bool | None:
        """Whether the conservation rows add up (None when the commit recorded none).

        input = read = carryover + changes, and the shuffle (when there was one) held every input row.
        """
        if not all(stage in self.rows for stage in ROW_STAGES):
            return None
        r = self.rows
        return (
            r["read"] == r["input"]
            and r["read"] == r["carryover"] + r["changes"]
            and r["shuffled"] in (0, r["input"])
        )

    @property
    def total_seconds(self) -> float | None:
        return round(sum(self.seconds.values()), 2) if self.seconds else None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        # 64-bit ids as strings: JSON readers in browsers lose digits above 2**53.
        out["source_snapshot_id"] = str(self.source_snapshot_id)
        out["sink_snapshot_id"] = str(self.sink_snapshot_id)
        out["committed_at"] = _iso(self.committed_at)
        out["balanced"] = self.balanced
        out["total_seconds"] = self.total_seconds
        return out


@dataclass(frozen=True)
class LeaseStatus:
    """A run holding the table's lease now."""

    owner: str
    epoch: int
    expires_at: datetime
    host: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "owner": self.owner,
            "epoch": self.epoch,
            "expires_at": _iso(self.expires_at),
            "host": self.host,
        }


@dataclass
class TableStatus:
    """One configured table: watermark, lag, recent commits, and what could not be read."""

    source: str
    sink: str
    dag_id: str
    start: str
    checked_at: datetime
    source_exists: bool | None = None
    sink_exists: bool | None = None
    source_snapshot_id: int | None = None  # the source's current snapshot
    source_snapshot_at: datetime | None = None
    watermark_snapshot_id: int | None = None
    watermark_ordinal: int | None = None
    watermark_snapshot_at: datetime | None = None  # when the source made the watermark's snapshot
    pending: int | None = None
    oldest_pending_snapshot_id: int | None = None
    oldest_pending_at: datetime | None = None
    recent: list[ProcessedSnapshot] = field(default_factory=list)
    lease: LeaseStatus | None = None
    lease_checked: bool = False
    # The retention guard (source/retention.py): when a snapshot the sink needs may be expired.
    retention: dict[str, Any] | None = None
    retention_warning: str | None = None
    mirrors: list[MirrorStatus] = field(default_factory=list)  # each mirror's watermark and lag
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def oldest_pending_age_seconds(self) -> float | None:
        if self.oldest_pending_at is None:
            return None
        return max(0.0, (self.checked_at - self.oldest_pending_at).total_seconds())

    @property
    def last_commit(self) -> ProcessedSnapshot | None:
        return self.recent[0] if self.recent else None

    @property
    def state(self) -> str:
        """``error``, ``behind`` (snapshots pending), ``caught-up`` or ``unknown``."""
        if self.errors:
            return "error"
        if self.pending is None:
            return "unknown"
        return "behind" if self.pending else "caught-up"

    @property
    def skewed_commits(self) -> int:
        return sum(1 for s in self.recent if s.skew)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "sink": self.sink,
            "dag_id": self.dag_id,
            "start": self.start,
            "state": self.state,
            "checked_at": _iso(self.checked_at),
            "source_exists": self.source_exists,
            "sink_exists": self.sink_exists,
            "source_snapshot_id": _id(self.source_snapshot_id),
            "source_snapshot_at": _iso(self.source_snapshot_at),
            "watermark": None
            if self.watermark_snapshot_id is None
            else {
                "snapshot_id": _id(self.watermark_snapshot_id),
                "ordinal": self.watermark_ordinal,
                "snapshot_at": _iso(self.watermark_snapshot_at),
            },
            "lag": {
                "pending_snapshots": self.pending,
                "oldest_pending_snapshot_id": _id(self.oldest_pending_snapshot_id),
                "oldest_pending_at": _iso(self.oldest_pending_at),
                "oldest_pending_age_seconds": self.oldest_pending_age_seconds,
            },
            "recent": [s.to_dict() for s in self.recent],
            "lease": self.lease.to_dict() if self.lease else None,
            "retention": self.retention,
            "retention_warning": self.retention_warning,
            "mirrors": [m.to_dict() for m in self.mirrors],
            "errors": list(self.errors),
            "notes": list(self.notes),
        }


def _id(value: int | None) -> str | None:
    return None if value is None else str(value)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat().replace("+00:00", "Z")


def _from_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _phase_key(phase: str) -> tuple[int, str]:
    return (PHASE_ORDER.index(phase) if phase in PHASE_ORDER else len(PHASE_ORDER), phase)


def skew_warnings(summary: Mapping[str, str]) -> list[str]:
    """Skew a commit recorded, as readable warnings; [] when it recorded none (or found none).

    The commit step records how many partitions were skewed, which ones, and
    the largest one's size and ratio to the median partition
    (:class:`iceberg_cdc.sink.summary.Skew`).
    """
    from iceberg_cdc.sink.summary import Skew

    skew = Skew.from_summary(summary)
    if skew is None or not skew.count:
        return []
    listed = [str(p) for p in skew.partitions]
    noun = "partition" if skew.count == 1 else "partitions"
    text = f"{skew.count} skewed {noun}"
    if listed:
        more = ", …" if len(listed) < skew.count else ""
        text += f" ({', '.join(listed)}{more})"
    if skew.max_ratio is not None and skew.max_bytes is not None:
        which = "" if skew.count == 1 else "largest "
        text += f": {which}{format_bytes(skew.max_bytes)}, {skew.max_ratio:.0f}x the median"
    return [text]


def processed_snapshot(snapshot: Any, summary: Mapping[str, str]) -> ProcessedSnapshot | None:
    """The figures of one sink commit (a pyiceberg Snapshot and its summary), or None if it is no CDC commit."""
    from iceberg_cdc.sink.summary import CommitSummary, int_value

    record = CommitSummary.from_summary(summary)
    if record.source_snapshot_id is None:
        return None
    rows = {stage: record.rows[stage] for stage in ROW_STAGES if stage in record.rows}
    change_rows = rows.get("changes")
    if change_rows is None:
        change_rows = int_value(summary.get("added-records"))
    return ProcessedSnapshot(
        source_snapshot_id=record.source_snapshot_id,
        ordinal=record.change_ordinal,
        sink_snapshot_id=snapshot.snapshot_id,
        committed_at=_from_ms(snapshot.timestamp_ms),
        operation=record.operation,
        initial_load=record.initial_load is True,
        reprocess=record.replace,
        inserts=record.inserts,
        deletes=record.deletes,
        updates=record.updates,
        carryover_rows=record.carryover_rows,
        shuffle_bytes=record.shuffle_bytes,
        change_rows=change_rows,
        seconds=dict(sorted(record.seconds.items(), key=lambda item: _phase_key(item[0]))),
        rows=rows,
        skew=skew_warnings(summary),
    )


def recent_commits(sink_table: Any, source: str, limit: int = DEFAULT_RECENT) -> list[ProcessedSnapshot]:
    """The last ``limit`` commits of ``source`` in the sink's current history, newest first."""
    from pyiceberg.table.snapshots import ancestors_of

    from iceberg_cdc.sink.summary import SOURCE_TABLE_KEY
    from iceberg_cdc.sink.table import summary_properties

    found: list[ProcessedSnapshot] = []
    if limit <= 0:
        return found
    for snapshot in ancestors_of(sink_table.current_snapshot(), sink_table.metadata):
        summary = summary_properties(snapshot)
        if summary.get(SOURCE_TABLE_KEY) != source:
            continue
        processed = processed_snapshot(snapshot, summary)
        if processed is not None:
            found.append(processed)
            if len(found) >= limit:
                break
    return found


class _Redactor:
    """Hides the config's secret values in messages shown on the page (an error may quote a URL or a value)."""

    def __init__(self, config: CdcConfig | None) -> None:
        secrets: set[str] = set()
        if config is not None:
            _collect_secrets(config.model_dump(mode="json"), "", secrets)
        self._secrets = sorted((s for s in secrets if len(s) >= 4), key=len, reverse=True)

    def __call__(self, message: str) -> str:
        for secret in self._secrets:
            message = message.replace(secret, "***")
        return re.sub(r"(://[^/:@\s]*:)[^/@\s]+@", r"\1***@", message)


def _collect_secrets(value: Any, key: str, out: set[str]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _collect_secrets(v, str(k), out)
    elif isinstance(value, list):
        for v in value:
            _collect_secrets(v, key, out)
    elif isinstance(value, str) and is_secret_key(key):
        out.add(value)


def describe_error(exc: BaseException) -> str:
    """``Type: first line of the message`` (the rest of a long message is on the run's log)."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    name = type(exc).__name__
    return f"{name}: {first}" if first else name


def table_status(
    catalog: Any,
    table: TableConfig,
    *,
    recent: int = DEFAULT_RECENT,
    now: datetime | None = None,
    lease_reader: Callable[[str], Any] | None = None,
    redact: Callable[[str], str] = str,
    mirror_reader: MirrorReader | None = None,
) -> TableStatus:
    """The status of one table, read through ``catalog`` (a pyiceberg Catalog). Never raises for the table's state."""
    from pyiceberg.exceptions import NoSuchTableError

    from iceberg_cdc.sink.table import read_watermark
    from iceberg_cdc.source.history import next_snapshot, pending_count

    status = TableStatus(
        source=table.source,
        sink=table.sink,
        dag_id=table.dag_id,
        start=table.start,
        checked_at=now or datetime.now(UTC),
    )

    def failed(what: str, exc: BaseException) -> None:
        status.errors.append(redact(f"{what}: {describe_error(exc)}"))

    source_table = sink_table = None
    try:
        source_table = catalog.load_table(table.source)
        status.source_exists = True
    except NoSuchTableError:
        status.source_exists = False
        status.errors.append(f"source table {table.source} does not exist in the catalog")
    except Exception as exc:
        failed(f"cannot load source table {table.source}", exc)
    try:
        sink_table = catalog.load_table(table.sink)
        status.sink_exists = True
    except NoSuchTableError:
        status.sink_exists = False
        status.notes.append(
            f"sink table {table.sink} does not exist yet: the table's first run creates it "
            "(every snapshot counts as pending until then)"
        )
    except Exception as exc:
        failed(f"cannot load sink table {table.sink}", exc)

    watermark = None
    watermark_ok = sink_table is not None or status.sink_exists is False
    if sink_table is not None:
        try:
            watermark = read_watermark(sink_table, table.source)
        except Exception as exc:
            watermark_ok = False
            failed("the sink's watermark cannot be read", exc)
        if watermark is not None:
            status.watermark_snapshot_id = watermark.snapshot_id
            status.watermark_ordinal = watermark.ordinal
        elif watermark_ok:
            status.notes.append("no watermark yet: no snapshot of the source has been processed")
        try:
            status.recent = recent_commits(sink_table, table.source, recent)
        except Exception as exc:
            failed("the sink's history cannot be read", exc)

    if source_table is not None:
        current = source_table.metadata.current_snapshot()
        if current is not None:
            status.source_snapshot_id = current.snapshot_id
            status.source_snapshot_at = _from_ms(current.timestamp_ms)
        if watermark is not None:
            marked = source_table.metadata.snapshot_by_id(watermark.snapshot_id)
            if marked is not None:
                status.watermark_snapshot_at = _from_ms(marked.timestamp_ms)
        if watermark_ok:
            try:
                status.pending = pending_count(source_table, watermark, table.start)
                _retention(status, source_table, watermark, table)
                following = next_snapshot(source_table, watermark, table.start)
                if following is not None:
                    status.oldest_pending_snapshot_id = following.snapshot_id
                    pending_snapshot = source_table.metadata.snapshot_by_id(following.snapshot_id)
                    if pending_snapshot is not None:
                        status.oldest_pending_at = _from_ms(pending_snapshot.timestamp_ms)
            except Exception as exc:
                failed("the watermark does not fit the source's history", exc)

    if lease_reader is not None:
        try:
            held = lease_reader(table.source)
            status.lease_checked = True
            if held is not None:
                status.lease = LeaseStatus(held.owner, held.epoch, held.expires_at, held.host)
        except Exception as exc:
            status.notes.append(redact(f"lease not readable: {describe_error(exc)}"))
    if mirror_reader is not None and table.mirrors:
        status.mirrors = mirror_statuses(
            table,
            reader=mirror_reader,
            changelog_ordinal=watermark.ordinal if watermark is not None else None,
            source_pending=status.pending,
            source_table=source_table,
            redact=redact,
            describe=describe_error,
        )
    return status


def _retention(status: TableStatus, source_table: Any, watermark: Any, table: TableConfig) -> None:
    """How long until a snapshot the sink needs may be expired; the warning below the table's threshold."""
    from iceberg_cdc.source.protection import tag_prefix
    from iceberg_cdc.source.retention import table_outlook

    view = table_outlook(
        source_table,
        watermark,
        table.start,
        protection_prefix=tag_prefix(table.sink) if table.protect_pending else None,
    )
    now_ms = int(status.checked_at.timestamp() * 1000)
    status.retention = view.to_dict(now_ms)
    status.retention_warning = view.warning(now_ms, table.retention_warning)


def _lease_reader(config: CdcConfig, connections: Any = None) -> Callable[[str], Any]:
    """A function from a source table to the run holding its lease now (None when free)."""
    from iceberg_cdc.coordination.lease import TableLease
    from iceberg_cdc.pipeline.runtime import runtime_from_config

    runtime = runtime_from_config(config, connections)

    def held(source: str) -> Any:
        return TableLease.open(runtime.shuffle_uri, runtime.shuffle_properties, source).held()

    return held


def _default_catalog(config: CdcConfig) -> Any:
    from iceberg_cdc.pipeline.runtime import load_catalog_from_config

    return load_catalog_from_config(config)


def collect_status(
    config: CdcConfig,
    *,
    tables: Iterable[str] | None = None,
    recent: int = DEFAULT_RECENT,
    catalog_factory: Callable[[CdcConfig], Any] = _default_catalog,
    with_lease: bool = True,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    now: datetime | None = None,
    connections: Any = None,
) -> list[TableStatus]:
    """The status of the configured tables (or of ``tables``, by source identifier), in config order.

    ``connections`` resolves the connections the config names (the Airflow hook's, in the view).

    Tables are read in parallel. A catalog that cannot be loaded, and a table
    whose reads take longer than ``timeout_seconds`` (an unreachable
    endpoint retrying), are errors on the tables concerned.
    """
    wanted = None if tables is None else set(tables)
    selected = [t for t in config.tables if wanted is None or t.source in wanted]
    now = now or datetime.now(UTC)
    redact = _Redactor(config)

    def blank(table: TableConfig, error: str) -> TableStatus:
        status = TableStatus(table.source, table.sink, table.dag_id, table.start, checked_at=now)
        status.errors.append(redact(error))
        return status

    if not selected:
        return []
    try:
        catalog = catalog_factory(config)
    except Exception as exc:
        return [
            blank(t, f"catalog {config.catalog.name!r} unreachable: {describe_error(exc)}") for t in selected
        ]
    lease_reader = None
    lease_error = None
    if with_lease:
        try:
            lease_reader = _lease_reader(config, connections)
        except Exception as exc:
            lease_error = redact(f"lease not readable: {describe_error(exc)}")

    mirror_reader = default_reader(config, connections) if any(t.mirrors for t in selected) else None

    def one(table: TableConfig) -> TableStatus:
        return table_status(
            catalog,
            table,
            recent=recent,
            now=now,
            lease_reader=lease_reader,
            redact=redact,
            mirror_reader=mirror_reader,
        )

    pool = ThreadPoolExecutor(max_workers=min(4, len(selected)), thread_name_prefix="cdc-ui-status")
    try:
        futures = [pool.submit(one, table) for table in selected]
        deadline = time.monotonic() + timeout_seconds
        results = []
        for table, future in zip(selected, futures, strict=True):
            try:
                results.append(future.result(timeout=max(0.0, deadline - time.monotonic())))
            except FutureTimeout:
                results.append(
                    blank(table, f"no answer from the catalog or storage within {timeout_seconds:g} s")
                )
            except Exception as exc:  # table_status catches the table's own problems; this is a bug
                results.append(blank(table, f"status failed: {describe_error(exc)}"))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    if lease_error:
        for status in results:
            status.notes.append(lease_error)
    return results

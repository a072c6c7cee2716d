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
  recorded (:mod:`iceberg_cdc.ui.sink_history`); a commit a later reprocess
  replaced is marked so. Snapshots whose changes all cancelled out, and
  skipped ``replace`` snapshots, move the watermark without a sink commit, so
  they have no entry;
* **foreign commits** -- sink snapshots the pipeline did not write
  (:mod:`iceberg_cdc.sink.foreign`), as a warning;
* the table's **lease** (a run holding it now), when the shuffle store can be read;
* each **mirror**'s watermark, lag (snapshots and time) and last apply (:mod:`iceberg_cdc.ui.mirrors`).

Every message shown goes through :mod:`iceberg_cdc.redaction` with the config's
secrets; error lines come from :mod:`iceberg_cdc.error_lines`.

A problem with one table -- its sink not created yet, its source missing, a
watermark that no longer fits the source's history, an unreachable catalog --
is recorded on that table (:attr:`TableStatus.errors` / :attr:`TableStatus.notes`)
and never stops the others: this module raises nothing for a table's state.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import UTC, datetime
from typing import Any

from iceberg_cdc.config import CdcConfig, TableConfig
from iceberg_cdc.error_lines import line_of
from iceberg_cdc.redaction import Redactor, secret_values
from iceberg_cdc.ui.mirrors import (
    ApplyReader,
    MirrorReader,
    VerificationReader,
    default_applies,
    default_reader,
    default_verifications,
    mirror_statuses,
)
from iceberg_cdc.ui.sink_history import DEFAULT_RECENT, recent_commits
from iceberg_cdc.ui.table_status import LeaseStatus, TableStatus, from_ms

__all__ = [
    "DEFAULT_RECENT",
    "DEFAULT_TIMEOUT_SECONDS",
    "LeaseStatus",
    "TableStatus",
    "collect_status",
    "table_status",
]

DEFAULT_TIMEOUT_SECONDS = 20.0


def table_status(
    catalog: Any,
    table: TableConfig,
    *,
    recent: int = DEFAULT_RECENT,
    now: datetime | None = None,
    lease_reader: Callable[[str], Any] | None = None,
    redact: Callable[[str], str] | None = None,
    mirror_reader: MirrorReader | None = None,
    verification_reader: VerificationReader | None = None,
    apply_reader: ApplyReader | None = None,
) -> TableStatus:
    """The status of one table, read through ``catalog`` (a pyiceberg Catalog). Never raises for the table's state."""
    from pyiceberg.exceptions import NoSuchTableError

    from iceberg_cdc.sink.foreign import foreign_commits
    from iceberg_cdc.sink.table import read_watermark
    from iceberg_cdc.source.history import next_snapshot, pending_count

    redact = redact or Redactor()
    status = TableStatus(
        source=table.source,
        sink=table.sink,
        dag_id=table.dag_id,
        start=table.start,
        checked_at=now or datetime.now(UTC),
        freshness_slo=table.freshness_slo,
    )

    def failed(what: str, exc: BaseException) -> None:
        status.errors.append(redact(f"{what}: {line_of(exc)}"))

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
            status.foreign = foreign_commits(sink_table, table.source)
        except Exception as exc:
            failed("the sink's history cannot be read", exc)

    if source_table is not None:
        current = source_table.metadata.current_snapshot()
        if current is not None:
            status.source_snapshot_id = current.snapshot_id
            status.source_snapshot_at = from_ms(current.timestamp_ms)
        if watermark is not None:
            marked = source_table.metadata.snapshot_by_id(watermark.snapshot_id)
            if marked is not None:
                status.watermark_snapshot_at = from_ms(marked.timestamp_ms)
        if watermark_ok:
            try:
                bridge = table.on_history_gap == "bridge"
                status.pending = pending_count(source_table, watermark, table.start, bridge=bridge)
                _retention(status, source_table, watermark, table)
                following = next_snapshot(source_table, watermark, table.start, bridge=bridge)
                if following is not None:
                    status.oldest_pending_snapshot_id = following.snapshot_id
                    pending_snapshot = source_table.metadata.snapshot_by_id(following.snapshot_id)
                    if pending_snapshot is not None:
                        status.oldest_pending_at = from_ms(pending_snapshot.timestamp_ms)
            except Exception as exc:
                failed("the watermark does not fit the source's history", exc)

    if lease_reader is not None:
        try:
            held = lease_reader(table.source)
            status.lease_checked = True
            if held is not None:
                status.lease = LeaseStatus(held.owner, held.epoch, held.expires_at, held.host)
        except Exception as exc:
            status.notes.append(redact(f"lease not readable: {line_of(exc)}"))
    if mirror_reader is not None and table.mirrors:
        status.mirrors = mirror_statuses(
            table,
            reader=mirror_reader,
            changelog_ordinal=watermark.ordinal if watermark is not None else None,
            source_pending=status.pending,
            source_table=source_table,
            redact=redact,
            describe=line_of,
            verifications=verification_reader,
            applies=apply_reader,
            now=status.checked_at,
        )
    return status


def _retention(status: TableStatus, source_table: Any, watermark: Any, table: TableConfig) -> None:
    """How long until a snapshot the sink needs may be expired; the warning below the table's threshold."""
    from iceberg_cdc.source.protection import own_tag_prefixes
    from iceberg_cdc.source.retention import table_outlook

    view = table_outlook(
        source_table,
        watermark,
        table.start,
        protection_prefix=own_tag_prefixes(table.sink)
        if table.protect_pending or table.protect_base
        else None,
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
    redact = Redactor(secret_values(config.model_dump(mode="json")))

    def blank(table: TableConfig, error: str) -> TableStatus:
        status = TableStatus(table.source, table.sink, table.dag_id, table.start, checked_at=now)
        status.errors.append(redact(error))
        return status

    if not selected:
        return []
    try:
        catalog = catalog_factory(config)
    except Exception as exc:
        return [blank(t, f"catalog {config.catalog.name!r} unreachable: {line_of(exc)}") for t in selected]
    lease_reader = None
    lease_error = None
    if with_lease:
        try:
            lease_reader = _lease_reader(config, connections)
        except Exception as exc:
            lease_error = redact(f"lease not readable: {line_of(exc)}")

    mirror_reader = default_reader(config, connections) if any(t.mirrors for t in selected) else None
    verification_reader = default_verifications(config, connections) if mirror_reader is not None else None
    apply_reader = default_applies(config, connections) if mirror_reader is not None else None

    def one(table: TableConfig) -> TableStatus:
        return table_status(
            catalog,
            table,
            recent=recent,
            now=now,
            lease_reader=lease_reader,
            redact=redact,
            mirror_reader=mirror_reader,
            verification_reader=verification_reader,
            apply_reader=apply_reader,
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
                results.append(blank(table, f"status failed: {line_of(exc)}"))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    if lease_error:
        for status in results:
            status.notes.append(lease_error)
    return results

"""Verify one mirror against its source, and repair the keys that drifted.

1. The mirror's watermark names the source snapshot it holds. Both sides are
   read once, streamed, into per-bucket digests (:mod:`.digest`) over the
   columns both hold in the source's current schema (minus
   ``exclude_columns``; a column the source dropped is history, not compared).
2. Only the buckets whose digests differ are read again on both sides and
   compared key by key (:mod:`.drift`): changed, missing and foreign keys,
   named up to a limit.
3. With ``repair``, the drifted keys are rewritten from the source rows at
   that snapshot -- upserts of the keys the source holds, deletes of the
   others -- in one transaction (PostgreSQL) or one commit (Iceberg), at the
   same watermark, under the mirror's lease (:mod:`.repair`). Then the
   drifted buckets are read again on the mirror and compared once more.

The caller holds the mirror's lease: no apply interleaves.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from iceberg_cdc.config import MirrorConfig
from iceberg_cdc.errors import CdcError
from iceberg_cdc.mirror.columns import mirror_fields, mirror_key
from iceberg_cdc.mirror.net_changes import ChangelogMark
from iceberg_cdc.mirror.postgres.connection import dsn_for
from iceberg_cdc.mirror.targets import read_mirror_mark
from iceberg_cdc.mirror.verify.digest import Digests, bucket_count
from iceberg_cdc.mirror.verify.drift import Collected, Drift, describe_keys, find_drift
from iceberg_cdc.mirror.verify.sides import (
    Columns,
    Hashed,
    hash_batch,
    iceberg_batches,
    iceberg_rows_for_keys,
    postgres_batches,
    postgres_key,
    postgres_rows_for_keys,
    rebatched,
)
from iceberg_cdc.run.context import Context
from iceberg_cdc.source.tables import load_source_table
from iceberg_cdc.verify_status import VerifyStatus

log = logging.getLogger("iceberg_cdc.mirror")

KEY_LIMIT = 20
# Up to this many keys in the differing buckets, their rows are fetched by key (a join in PostgreSQL,
# a pruned scan in Iceberg); beyond it, both sides are read whole once more (a large drift).
KEYED_LIMIT = 200_000
Hook = Callable[[str], None]


@dataclass
class Verification:
    """What one verification found and did (JSON-able: the task's XCom, the CLI's report)."""

    mirror: str
    mirror_table: str
    status: VerifyStatus
    at: dict[str, Any] | None = None  # the mirror's watermark (ChangelogMark.to_dict)
    rows_source: int = 0
    rows_mirror: int = 0
    buckets: int = 0
    differing_buckets: int = 0
    drifted_keys: int = 0
    drift: dict[str, int] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)
    repaired_keys: int = 0
    left_keys: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    verified_at: float = 0.0
    mirror_location: str | None = None  # an Iceberg mirror's location (its lineage dataset's name)

    @property
    def equal(self) -> bool:
        return self.status.is_equal

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "status": VerifyStatus(self.status).value}  # a plain string for XCom and JSON

    def line(self) -> str:
        """One line for logs, run notes and the CLI."""
        where = f"at source snapshot {self.at['source_snapshot_id']}" if self.at else "never applied"
        head = f"{self.mirror}: {self.rows_mirror:,} rows {where}, {self.buckets:,} buckets"
        if self.status is VerifyStatus.NOT_APPLIED:
            return f"{self.mirror}: never applied, nothing to verify"
        if self.status is VerifyStatus.EQUAL:
            return f"{head}: equal to the source"
        drift = ", ".join(f"{n} {k}" for k, n in self.drift.items() if n)
        named = "; ".join(self.keys) + (" ..." if self.drifted_keys > len(self.keys) else "")
        if self.status is VerifyStatus.REPAIRED:
            return f"{head}: {self.drifted_keys} keys differed ({drift}) and were repaired: {named}"
        return f"{head}: {self.drifted_keys} keys differ ({drift}): {named}"


@dataclass
class Sides:
    """How to read each side of one mirror: whole, key columns only, or the rows of given keys.

    ``mirror(after_repair)``, ``mirror_keys()`` and ``mirror_for(keys, after_repair)``
    read the mirror's head as the verification found it, or after its repair.
    Keys for ``mirror_for`` are in :meth:`mirror_key_form` (PostgreSQL's
    ``SELECT`` forms for a PostgreSQL mirror).
    """

    columns: Columns
    source: Callable[[], Iterator[pa.RecordBatch]]
    source_keys: Callable[[], Iterator[pa.RecordBatch]]
    source_for: Callable[[pa.Table], Iterator[pa.RecordBatch]]
    mirror: Callable[..., Iterator[pa.RecordBatch]]
    mirror_keys: Callable[[], Iterator[pa.RecordBatch]]
    mirror_for: Callable[..., Iterator[pa.RecordBatch]]
    mirror_is_postgres: bool
    location: str | None = None

    def mirror_key_form(self, keys: pa.Table) -> pa.Table:
        if not self.mirror_is_postgres:
            return keys
        return pa.table({k: postgres_key(keys.column(k), self.columns.types[k]) for k in self.columns.key})


def compared_columns(ctx: Context, mirror: MirrorConfig) -> tuple[Columns, list[Any], Any]:
    """The compared columns, the mirror's fields (the changelog's, minus exclusions) and the source table."""
    catalog = ctx.catalog()
    source = load_source_table(catalog, ctx.table)
    changelog_schema = catalog.load_table(ctx.table.sink).schema()
    schema = source.schema()
    key = mirror_key(ctx.table, mirror, schema)
    fields = mirror_fields(changelog_schema, mirror, key)
    held = {f.name for f in fields}
    current = [f for f in schema.fields if f.name in held]
    names = tuple(key) + tuple(f.name for f in current if f.name not in key)
    types = {f.name: f.field_type for f in current}
    return Columns(names, types, tuple(key), json_nested=mirror.type == "postgres"), fields, source


def _sides(ctx: Context, mirror: MirrorConfig, columns: Columns, source: Any, mark: ChangelogMark) -> Sides:
    snapshot = mark.source_snapshot_id
    key = list(columns.key)
    key_columns = Columns(columns.key, columns.types, columns.key, columns.json_nested)
    common = {
        "columns": columns,
        "source": lambda: iceberg_batches(source, snapshot, columns.names),
        "source_keys": lambda: iceberg_batches(source, snapshot, key),
        "source_for": lambda keys: iceberg_rows_for_keys(source, snapshot, columns, keys),
    }
    if mirror.type == "postgres":
        dsn = dsn_for(mirror)
        return Sides(
            **common,
            mirror=lambda after_repair=False: postgres_batches(dsn, mirror.table, columns),
            mirror_keys=lambda: postgres_batches(dsn, mirror.table, key_columns),
            mirror_for=lambda keys, after_repair=False: postgres_rows_for_keys(
                dsn, mirror.table, columns, keys
            ),
            mirror_is_postgres=True,
        )
    table = ctx.catalog().load_table(mirror.table)
    head = table.current_snapshot()
    head_id = head.snapshot_id if head is not None else None

    def at(after_repair: bool) -> tuple[Any, int | None]:
        # Every pass reads the snapshot the digest read; after a repair, the repair's own.
        return (ctx.catalog().load_table(mirror.table), None) if after_repair else (table, head_id)

    return Sides(
        **common,
        mirror=lambda after_repair=False: iceberg_batches(*at(after_repair), columns.names),
        mirror_keys=lambda: iceberg_batches(table, head_id, key),
        mirror_for=lambda keys, after_repair=False: iceberg_rows_for_keys(*at(after_repair), columns, keys),
        mirror_is_postgres=False,
        location=table.location(),
    )


def _keys_in(
    rows: Iterator[pa.RecordBatch], columns: Columns, buckets: int, pg: bool, differing: np.ndarray
) -> pa.Table:
    """The distinct keys of the rows in ``differing`` buckets, read from key columns only."""
    only = Columns(columns.key, columns.types, columns.key, columns.json_nested)
    found = _collect(rows, only, buckets, pg, differing, list(columns.key))
    kept = found.kept()
    # Extension types (uuid) as their storage: Arrow groups neither them nor hands them to pyiceberg filters.
    kept = pa.table(
        {
            name: kept.column(name).cast(kept.column(name).type.storage_type)
            if isinstance(kept.column(name).type, pa.BaseExtensionType)
            else kept.column(name)
            for name in columns.key
        }
    )
    if not kept.num_rows:
        return kept
    return kept.group_by(list(columns.key), use_threads=False).aggregate([]).select(list(columns.key))


def _digests(rows: Iterator[pa.RecordBatch], columns: Columns, buckets: int, pg: bool) -> Digests:
    digests = Digests.empty(buckets)
    for batch in rebatched(rows):
        hashed = hash_batch(batch, columns, buckets, from_postgres=pg)
        digests.add(hashed.buckets, hashed.row_hashes)
        digests.bytes += batch.nbytes
    return digests


def _timed_digests(
    read: Callable[[], Iterator[pa.RecordBatch]], columns: Columns, buckets: int, pg: bool
) -> tuple[Digests, float]:
    started = time.perf_counter()
    digests = _digests(read(), columns, buckets, pg)
    return digests, round(time.perf_counter() - started, 3)


def _collect(
    rows: Iterator[pa.RecordBatch],
    columns: Columns,
    buckets: int,
    pg: bool,
    differing: np.ndarray,
    keep: list[str],
) -> Collected:
    collected = Collected()
    for batch in rebatched(rows):
        hashed: Hashed = hash_batch(batch, columns, buckets, from_postgres=pg)
        collected.add(hashed, differing, keep)
    return collected


def verify_mirror(
    ctx: Context,
    mirror: MirrorConfig,
    *,
    repair: bool,
    run_id: str,
    epoch: int,
    key_limit: int = KEY_LIMIT,
    hook: Hook | None = None,
) -> Verification:
    """Verify ``mirror`` (the caller holds its lease at ``epoch``), repairing drift when ``repair``."""
    call = hook or (lambda point: None)
    clock = started = time.perf_counter()
    seconds: dict[str, float] = {}

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        seconds[name] = round(now - clock, 3)
        clock = now
        call(name)

    result = Verification(mirror.mirror_name, mirror.table, VerifyStatus.NOT_APPLIED, verified_at=time.time())
    mark = read_mirror_mark(ctx, mirror)
    if mark is None:
        return result
    result.at = mark.to_dict()
    columns, fields, source = compared_columns(ctx, mirror)
    sides = _sides(ctx, mirror, columns, source, mark)
    result.mirror_location = sides.location
    snapshot = source.snapshot_by_id(mark.source_snapshot_id)
    if snapshot is None:
        raise CdcError(
            f"{mirror.describe()}: the source snapshot {mark.source_snapshot_id} the mirror holds is no longer "
            f"in {ctx.table.source}'s history (expired): nothing can be verified at it. Let the mirror apply the "
            "next changelog snapshot, then verify again"
        )
    total = int((snapshot.summary or {}).get("total-records", 0) or 0) if snapshot.summary else 0
    buckets = bucket_count(total)
    result.buckets = buckets
    pg = sides.mirror_is_postgres
    # Both sides at once: reading one (I/O, Arrow decoding, the server) overlaps hashing the other.
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="cdc-verify") as pool:
        reading = [
            pool.submit(_timed_digests, sides.source, columns, buckets, False),
            pool.submit(_timed_digests, sides.mirror, columns, buckets, pg),
        ]
        (source_digests, source_seconds), (mirror_digests, mirror_seconds) = (r.result() for r in reading)
    lap("digests")
    seconds["digest_source"], seconds["digest_mirror"] = source_seconds, mirror_seconds
    call("digest_source")
    call("digest_mirror")
    result.rows_source, result.rows_mirror = source_digests.rows, mirror_digests.rows
    differing = source_digests.differing(mirror_digests)
    result.differing_buckets = len(differing)
    seconds["digest_mb_per_s"] = round(
        (source_digests.bytes + mirror_digests.bytes) / 1e6 / max(seconds["digests"], 1e-6), 1
    )
    if not len(differing):
        result.status = VerifyStatus.EQUAL
        result.seconds = {**seconds, "total": round(time.perf_counter() - started, 3)}
        return result
    keep_source = [f.name for f in fields if f.name in columns.types]
    key = list(columns.key)
    source_keys = _keys_in(sides.source_keys(), columns, buckets, False, differing)
    mirror_keys = _keys_in(sides.mirror_keys(), columns, buckets, pg, differing)
    keyed = source_keys.num_rows + mirror_keys.num_rows <= KEYED_LIMIT
    if keyed:  # a few drifted buckets: fetch their rows by key instead of reading both sides again
        wanted = (
            pa.concat_tables([sides.mirror_key_form(source_keys), mirror_keys], promote_options="permissive")
            if source_keys.num_rows and mirror_keys.num_rows
            else (sides.mirror_key_form(source_keys) if source_keys.num_rows else mirror_keys)
        )

        def read_mirror(after_repair: bool = False) -> Iterator[pa.RecordBatch]:
            return sides.mirror_for(wanted, after_repair) if wanted.num_rows else iter(())

        source_rows_read = sides.source_for(source_keys) if source_keys.num_rows else iter(())
    else:

        def read_mirror(after_repair: bool = False) -> Iterator[pa.RecordBatch]:
            return sides.mirror(after_repair)

        source_rows_read = sides.source()
    found_source = _collect(source_rows_read, columns, buckets, False, differing, keep_source)
    found_mirror = _collect(read_mirror(), columns, buckets, pg, differing, key)
    drift = find_drift(
        found_source.table(len(columns.key)), found_mirror.table(len(columns.key)), len(columns.key)
    )
    lap("compare")
    source_rows, mirror_rows = found_source.kept(), found_mirror.kept()
    result.drifted_keys = drift.keys
    result.drift = drift.counts
    result.keys = _named(drift, source_rows, mirror_rows, columns.key, key_limit)
    result.status = VerifyStatus.DRIFT
    if drift.keys and repair:
        from iceberg_cdc.mirror.verify.repair import repair_keys

        repair_keys(
            ctx, mirror, fields, columns, mark, drift, source_rows, mirror_rows, run_id, epoch, hook=call
        )
        lap("repair")
        again = _collect(read_mirror(after_repair=True), columns, buckets, pg, differing, key)
        left = find_drift(
            found_source.table(len(columns.key)), again.table(len(columns.key)), len(columns.key)
        )
        lap("reverify")
        result.repaired_keys = drift.keys - left.keys
        result.left_keys = left.keys
        result.status = VerifyStatus.REPAIRED if not left.keys else VerifyStatus.DRIFT
    else:
        result.left_keys = drift.keys
    result.seconds = {**seconds, "total": round(time.perf_counter() - started, 3)}
    return result


def _named(
    drift: Drift, source_rows: pa.Table, mirror_rows: pa.Table, key: tuple[str, ...], limit: int
) -> list[str]:
    named: list[str] = []
    for label, rows, indices in (
        ("changed", source_rows, drift.changed_source),
        ("missing", source_rows, drift.missing),
        ("foreign", mirror_rows, drift.foreign),
    ):
        if len(named) >= limit or not len(indices):
            continue
        named += [f"{label} {k}" for k in describe_keys(rows, key, indices, limit - len(named))]
    return named

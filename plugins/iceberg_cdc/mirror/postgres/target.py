"""Apply net changes to a PostgreSQL mirror: one transaction with the watermark.

In one transaction, in this order:

1. an advisory lock on the mirror table (every writer of it queues here);
2. the state table and the mirror table created or evolved (:mod:`.ddl`): the
   columns follow the changelog by field id (renamed, added, widened), and the
   mapping is written with the watermark in step 6, so a kill leaves table,
   mapping and mark all old or all new;
3. the mirror's mark read from the state table and compared with the mark the
   net changes were computed from: equal -- go on; already the target mark --
   this apply already committed (a retry after a lost answer, a cleared task),
   so nothing is done; anything else -- another run moved the mirror, so
   :class:`~iceberg_cdc.errors.MirrorStateError` and nothing is done. A run
   whose lease epoch is below the last apply's is refused the same way;
4. the net changes bulk-loaded into two temporary tables in Arrow's binary form
   (ADBC's PostgreSQL driver: binary ``COPY``; no row-by-row INSERT);
5. ``DELETE ... USING`` the deleted keys and the upserted keys (their old
   versions), then ``INSERT ... SELECT`` the upserts. Under the advisory lock
   and after that delete, no upserted key can be in the table, so the insert is
   a plain one: at 1 M changed rows it took 1.9 s against 4.0 s for
   ``INSERT ... ON CONFLICT (key) DO UPDATE`` and 3.5 s for ``MERGE``
   (``bench/mirror_bench.py``'s table). A key twice among the upserts would
   fail the insert, and with it the transaction: nothing is applied;
6. the new mark written to the state table, with this apply's time, row
   counts and seconds (what the CDC view shows of it), then ``COMMIT``.

A crash, a kill or a server restart anywhere before the commit leaves the
mirror and its mark as they were (PostgreSQL rolls the transaction back); a
retry repeats the whole transaction. After the commit, the mark says so: a
retry finds the target mark and does nothing. So each net change is applied
exactly once.

``hook(point)`` is called at each named point (:data:`POINTS`) for fault tests.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import pyarrow as pa
from pyiceberg.types import NestedField

from iceberg_cdc.errors import MirrorKeyError, MirrorSchemaError, MirrorStateError
from iceberg_cdc.mirror.net_changes import ChangelogMark, NetChanges
from iceberg_cdc.mirror.postgres import ddl
from iceberg_cdc.mirror.postgres.connection import connect
from iceberg_cdc.mirror.postgres.types import load_columns, qualified, quote
from iceberg_cdc.mirror.schema_changes import mapping_from_json, mapping_to_json

POINTS = ("connected", "locked", "ensured", "loaded", "deleted", "upserted", "marked", "committed")
_UPSERTS = "cdc_net_upserts"
_DELETES = "cdc_net_deletes"
Hook = Callable[[str], None]


@dataclass
class ApplyResult:
    applied: bool
    reason: str
    upserted: int = 0
    deleted: int = 0
    schema: dict[str, list[str]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class MirrorState:
    """The state row of one mirror table."""

    mark: ChangelogMark | None
    changelog_table: str
    source_table: str
    epoch: int
    run_id: str | None
    mapping: dict[int, str] | None = None  # changelog field id -> column name (None: not mapped yet)
    applied_at: datetime | None = None  # when the last apply's transaction began (the server's clock)
    upserted: int | None = None  # the last apply's rows inserted and deleted
    deleted: int | None = None
    seconds: float | None = (
        None  # the last apply's transaction, start to mark (None: written before it was kept)
    )


def _ingest(cursor: Any, name: str, load: Any) -> None:
    """Binary COPY of ``load`` into a temporary table; a NUL character in text is named with its column."""
    try:
        cursor.adbc_ingest(name, load.table(), mode="create", temporary=True)
    except Exception as exc:
        found = re.search(r"0x00.*?column (c\d+)", str(exc), re.S)
        if found is None:
            raise
        flat = found.group(1)
        column = next((n for n, e in load.expressions.items() if re.search(rf"\.{flat}\b", e)), flat)
        raise MirrorSchemaError(
            f"column {column!r} holds a NUL character (\\x00), which PostgreSQL's text cannot store; nothing "
            f"was applied. Leave the column out of the mirror (tables[].mirrors[].exclude_columns: [{column}]) "
            "or remove the NUL characters in the source"
        ) from None


class PostgresTarget:
    """One mirror table in one PostgreSQL database, fed from one changelog."""

    def __init__(self, dsn: str, table: str, *, changelog: str, source: str) -> None:
        self.dsn = dsn
        self.table = table
        self.changelog = changelog
        self.source = source

    def __repr__(self) -> str:  # the DSN may hold a password
        return f"PostgresTarget(table={self.table!r}, changelog={self.changelog!r})"

    # -- reading -------------------------------------------------------------------------------

    def state(self) -> MirrorState | None:
        """The state row, or None when the mirror was never applied (no state table or row)."""
        connection = connect(self.dsn)
        try:
            cursor = connection.cursor()
            cursor.execute("SELECT to_regclass($1) IS NOT NULL", (ddl.state_table(self.table),))
            if not cursor.fetchone()[0]:
                return None
            return self._state(cursor)
        finally:
            connection.close()

    def read_mark(self) -> ChangelogMark | None:
        state = self.state()
        return state.mark if state is not None else None

    def _state(self, cursor: Any) -> MirrorState | None:
        cursor.execute(
            f"SELECT changelog_snapshot_id, source_snapshot_id, change_ordinal, changelog_table, source_table, "
            # to_jsonb(s): a state table from before the mapping (not migrated yet) reads as unmapped
            f"epoch, run_id, (to_jsonb(s) -> '{ddl.MAPPING_COLUMN}')::text, applied_at, upserted, deleted, "
            f"(to_jsonb(s) ->> '{ddl.SECONDS_COLUMN}')::double precision "
            f"FROM {ddl.state_table(self.table)} AS s WHERE mirror_table = $1",
            (self.table,),
        )
        row = cursor.fetchone()
        if row is None:
            return None
        changelog_id, source_id, ordinal, changelog, source, epoch, run_id, mapping, *applied = row
        mark = None if ordinal is None else ChangelogMark(int(changelog_id), int(source_id), int(ordinal))
        fields = mapping_from_json(json.loads(mapping)) if mapping not in (None, "null") else None
        applied_at, upserted, deleted, seconds = applied
        return MirrorState(
            mark,
            changelog,
            source,
            int(epoch),
            run_id,
            fields,
            applied_at=applied_at,
            upserted=None if upserted is None else int(upserted),
            deleted=None if deleted is None else int(deleted),
            seconds=None if seconds is None else float(seconds),
        )

    # -- writing -------------------------------------------------------------------------------

    def apply(
        self,
        net: NetChanges,
        *,
        base: ChangelogMark | None,
        fields: list[NestedField],
        epoch: int,
        run_id: str,
        hook: Hook | None = None,
        replace_all: bool = False,
        repair: bool = False,
    ) -> ApplyResult:
        """Apply ``net`` (computed from ``base``) and move the mark to ``net.through``, in one transaction.

        ``replace_all`` (a rebuild): every row of the mirror is replaced by
        ``net.upserts``, whatever the mark was. ``repair`` (a verification's
        repair of drifted keys): the mirror must still be at ``net.through``,
        which it keeps; its keys are rewritten like any apply's.
        """
        call = hook or (lambda point: None)
        seconds: dict[str, float] = {}
        clock = began = time.perf_counter()

        def lap(point: str) -> None:
            nonlocal clock
            now = time.perf_counter()
            seconds[point] = round(now - clock, 4)
            clock = now
            call(point)

        self._check_keys(net)
        types = {f.name: f.field_type for f in fields}
        connection = connect(self.dsn)
        try:
            cursor = connection.cursor()
            lap("connected")
            ddl.lock(cursor, self.table)
            ddl.ensure_state_table(cursor, self.table)
            lap("locked")
            state = self._state(cursor)
            if repair:
                self._check_repair(state, net.through, epoch)
                done = None
            else:
                done = None if replace_all else self._compare(state, base, net.through, epoch)
            if done is not None:
                connection.rollback()
                return ApplyResult(False, done, seconds=seconds)
            schema, mapping = ddl.ensure_mirror_table(
                cursor, self.table, fields, net.key_columns, state.mapping if state is not None else None
            )
            lap("ensured")
            relation = qualified(self.table)
            upserts = load_columns(net.upserts, types) if net.upserts.num_rows else None
            deletes = load_columns(net.deletes, types, alias="d") if net.deletes.num_rows else None
            for name, load in ((_UPSERTS, upserts), (_DELETES, deletes)):
                if load is not None:
                    cursor.execute(f"DROP TABLE IF EXISTS pg_temp.{name}")
                    _ingest(cursor, name, load)
            lap("loaded")
            deleted = 0
            if replace_all:
                cursor.execute(f"DELETE FROM {relation}")
                deleted = max(cursor.rowcount, 0)
            elif deletes is not None:
                match = " AND ".join(f"m.{quote(k)} = {deletes.expressions[k]}" for k in net.key_columns)
                cursor.execute(f"DELETE FROM {relation} AS m USING pg_temp.{_DELETES} AS d WHERE {match}")
                deleted = max(cursor.rowcount, 0)
            if upserts is not None and not replace_all:
                match = " AND ".join(f"m.{quote(k)} = {upserts.expressions[k]}" for k in net.key_columns)
                cursor.execute(f"DELETE FROM {relation} AS m USING pg_temp.{_UPSERTS} AS n WHERE {match}")
            lap("deleted")
            upserted = 0
            if upserts is not None:
                cursor.execute(self._insert_sql(relation, upserts.expressions))
                upserted = max(cursor.rowcount, 0)
            lap("upserted")
            took = round(time.perf_counter() - began, 4)
            self._write_state(cursor, net.through, epoch, run_id, (upserted, deleted, took), mapping)
            for name, load in ((_UPSERTS, upserts), (_DELETES, deletes)):
                if load is not None:
                    cursor.execute(f"DROP TABLE pg_temp.{name}")
            lap("marked")
            connection.commit()
            lap("committed")
            reason = "rebuilt" if replace_all else "repaired" if repair else "applied"
            return ApplyResult(True, reason, upserted, deleted, schema, seconds)
        finally:
            connection.close()

    def _check_keys(self, net: NetChanges) -> None:
        for part in (net.upserts, net.deletes):
            for key in net.key_columns:
                if part.num_rows and part.column(key).null_count:
                    raise MirrorKeyError(
                        f"{part.column(key).null_count} changelog row(s) have null in the key column {key!r}: a "
                        f"PostgreSQL mirror's primary key cannot hold null. Choose identifier_columns that are "
                        "never null (Iceberg's identifier fields are required)."
                    )

    def _compare(
        self, state: MirrorState | None, base: ChangelogMark | None, through: ChangelogMark, epoch: int
    ) -> str | None:
        """None to go on, or why nothing is to be done; MirrorStateError when the plan is stale."""
        if state is not None and (state.changelog_table, state.source_table) != (self.changelog, self.source):
            raise MirrorStateError(
                f"PostgreSQL table {self.table} is the mirror of {state.source_table} (changelog "
                f"{state.changelog_table}), not of {self.source}: point the mirror at another table, or delete "
                f"its row from {ddl.state_table(self.table)} (and the table) to reuse the name. Nothing was applied."
            )
        current = state.mark if state is not None else None
        if current == through:
            return f"already applied: the mirror is at source snapshot {through.source_snapshot_id}"
        if current != base:
            raise MirrorStateError(
                f"the mirror {self.table} moved while this run worked (it is at {current}, the run planned from "
                f"{base}): another run applied first. Nothing was applied; the next run plans afresh."
            )
        if state is not None and state.epoch > epoch:
            raise MirrorStateError(
                f"run {state.run_id!r} with lease epoch {state.epoch} wrote the mirror {self.table} after this run "
                f"(epoch {epoch}) took its lease: this run was overtaken. Nothing was applied."
            )
        return None

    def _check_repair(self, state: MirrorState | None, at: ChangelogMark, epoch: int) -> None:
        """A repair rewrites keys at the mark it verified: refused when the mirror moved since."""
        current = state.mark if state is not None else None
        if current != at:
            raise MirrorStateError(
                f"the mirror {self.table} moved while it was verified (it is at {current}, the verification "
                f"read {at}): nothing was repaired; verify again"
            )
        if state is not None and state.epoch > epoch:
            raise MirrorStateError(
                f"run {state.run_id!r} with lease epoch {state.epoch} wrote the mirror {self.table} after this "
                f"verification (epoch {epoch}) took its lease: nothing was repaired; verify again"
            )

    def _insert_sql(self, relation: str, expressions: dict[str, str]) -> str:
        names = list(expressions)
        columns = ", ".join(quote(n) for n in names)
        values = ", ".join(expressions[n] for n in names)
        return f"INSERT INTO {relation} ({columns}) SELECT {values} FROM pg_temp.{_UPSERTS} AS n"

    def _write_state(
        self,
        cursor: Any,
        mark: ChangelogMark,
        epoch: int,
        run_id: str,
        applied: tuple[int, int, float],
        mapping: dict[int, str],
    ) -> None:
        """The state row: the mark, and ``applied`` -- this apply's (upserted, deleted, seconds)."""
        upserted, deleted, took = applied
        cursor.execute(
            f"INSERT INTO {ddl.state_table(self.table)} AS s (mirror_table, changelog_table, source_table, "
            "changelog_snapshot_id, source_snapshot_id, change_ordinal, epoch, run_id, applied_at, upserted, deleted, "
            f"{ddl.MAPPING_COLUMN}, {ddl.SECONDS_COLUMN}) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now(), $9, $10, $11::text::jsonb, $12) "
            "ON CONFLICT (mirror_table) DO UPDATE SET "
            "changelog_table = EXCLUDED.changelog_table, source_table = EXCLUDED.source_table, "
            "changelog_snapshot_id = EXCLUDED.changelog_snapshot_id, source_snapshot_id = EXCLUDED.source_snapshot_id, "
            "change_ordinal = EXCLUDED.change_ordinal, epoch = GREATEST(s.epoch, EXCLUDED.epoch), "
            "run_id = EXCLUDED.run_id, applied_at = EXCLUDED.applied_at, upserted = EXCLUDED.upserted, "
            f"deleted = EXCLUDED.deleted, {ddl.MAPPING_COLUMN} = EXCLUDED.{ddl.MAPPING_COLUMN}, "
            f"{ddl.SECONDS_COLUMN} = EXCLUDED.{ddl.SECONDS_COLUMN}",
            (
                self.table,
                self.changelog,
                self.source,
                mark.changelog_snapshot_id,
                mark.source_snapshot_id,
                mark.ordinal,
                epoch,
                run_id,
                upserted,
                deleted,
                json.dumps(mapping_to_json(mapping)),
                took,
            ),
        )

    def read_rows(self) -> pa.Table | None:
        """Every row of the mirror table, as Arrow (for checks and the demo); None when it does not exist."""
        connection = connect(self.dsn)
        try:
            cursor = connection.cursor()
            cursor.execute("SELECT to_regclass($1) IS NOT NULL", (qualified(self.table),))
            if not cursor.fetchone()[0]:
                return None
            cursor.execute(f"SELECT * FROM {qualified(self.table)}")
            return cursor.fetch_arrow_table()
        finally:
            connection.close()

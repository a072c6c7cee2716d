"""Applies to an Iceberg mirror through its steps, in process, with net changes made from source states.

The mirror core that folds the changelog into net changes is built apart; the
Iceberg target only needs its output's shape (``NetChanges``: upserts with
one row per key, deletes with key columns, the changelog mark they reach).
:class:`StandInNetChanges` has exactly that shape, and :meth:`MirrorHarness.net_changes`
makes one from two states of the source the way a changelog folds: every key
whose row changed or appeared is upserted, every key that went is deleted,
plus what a real fold also produces -- some unchanged rows upserted (updates
that were later reverted) and deletes of keys the mirror never held (rows
inserted and deleted within the window).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc_devtools.replay import multiset
from cdc_devtools.staged_inputs import default_lease_name, stage_net_changes
from iceberg_cdc.coordination.lease import TableLease
from iceberg_cdc.mirror.iceberg import steps
from iceberg_cdc.run.context import Context


@dataclass(frozen=True)
class ChangelogMark:
    changelog_snapshot_id: int
    source_snapshot_id: int
    ordinal: int


@dataclass(frozen=True)
class StandInNetChanges:
    upserts: pa.Table
    deletes: pa.Table
    key_columns: tuple[str, ...]
    through: ChangelogMark


@dataclass(frozen=True)
class MirrorTarget:
    table: str
    mode: str = "merge-on-read"
    type: str = "iceberg"
    format_version: int | None = None


def _key_strings(table: pa.Table, keys: tuple[str, ...]) -> list[tuple]:
    from cdc_devtools.oracle import row_key

    return [row_key(r, keys) for r in table.select(list(keys)).to_pylist()]


class MirrorHarness:
    """One source table, one Iceberg mirror, and the applies between them."""

    def __init__(self, config: Any, source: str, target: MirrorTarget, key_columns: tuple[str, ...]) -> None:
        self.ctx = Context.of(config, source)
        self.target = target
        self.key_columns = key_columns
        self.applied: pa.Table | None = None  # the source's rows the mirror should hold
        self.ordinal = 0
        self.runs = 0

    def net_changes(
        self, rng: random.Random, new_state: pa.Table, source_snapshot_id: int
    ) -> StandInNetChanges:
        keys = self.key_columns
        old = self.applied
        new_by_key = dict(zip(_key_strings(new_state, keys), range(new_state.num_rows), strict=True))
        old_rows = {}
        if old is not None:
            from cdc_devtools.oracle import row_key

            names = old.column_names
            old_rows = {row_key(r, keys): row_key(r, names) for r in old.to_pylist()}
        from cdc_devtools.oracle import row_key

        names = new_state.column_names
        take = []
        for i, row in enumerate(new_state.to_pylist()):
            key = row_key(row, keys)
            if old_rows.get(key) != row_key(row, names) or rng.random() < 0.1:
                take.append(i)
        upserts = new_state.take(pa.array(take, pa.int64())) if take else new_state.schema.empty_table()
        gone = [k for k in old_rows if k not in new_by_key]
        deletes = (
            old.filter(
                pa.array(
                    [row_key(r, keys) in set(gone) for r in old.select(list(keys)).to_pylist()], pa.bool_()
                )
            ).select(list(keys))
            if old is not None and gone
            else new_state.select(list(keys)).schema.empty_table()
        )
        # keys inserted and deleted within the window: deleted, never held
        ghost = [10_000_000 + rng.randint(0, 1000) for _ in range(rng.randint(0, 2))]
        if ghost and keys == ("id",):
            extra = pa.table({"id": pa.array(ghost, deletes.schema.field("id").type)})
            deletes = pa.concat_tables([deletes, extra.cast(deletes.schema)])
        self.ordinal += 1
        mark = ChangelogMark(rng.getrandbits(62), source_snapshot_id, self.ordinal)
        return StandInNetChanges(upserts, deletes, keys, mark)

    def lease(self) -> TableLease:
        return TableLease(self.ctx.runtime.store(), default_lease_name(self.target.table))

    def stage(self, net: StandInNetChanges, run_id: str, epoch: int) -> dict[str, Any]:
        store = self.ctx.runtime.store()
        prefix = f"_mirror_inputs/{self.target.table}/{net.through.changelog_snapshot_id}/{run_id}"
        key = stage_net_changes(store, prefix, net, source=self.ctx.table.source, part_rows=700)
        lease = default_lease_name(self.target.table)
        return {"net_changes": key, "run_id": run_id, "epoch": epoch, "lease_ttl": 300.0, "lease": lease}

    def apply(
        self,
        net: StandInNetChanges,
        new_state: pa.Table | None = None,
        *,
        fail_at: str | None = None,
        run_units: Callable[[dict[str, Any]], Any] | None = None,
    ) -> dict:
        """One mirror run: lease, stage, plan, units, commit, cleanup; ``fail_at`` raises after that step.

        ``run_units(planned)`` runs the ``mirror_join`` groups (default: in this process).
        """
        self.runs += 1
        run_id = f"mirror_test__{uuid.uuid4().hex[:8]}"
        lease = self.lease()
        info = lease.acquire(run_id, 300.0)
        staged = self.stage(net, run_id, info.epoch)
        planned: dict[str, Any] = {}
        try:
            planned = steps.plan(self.ctx, self.target, staged)
            if fail_at == "plan":
                raise RuntimeError("killed after plan")
            if run_units is not None and planned.get("action") == "apply":
                run_units(planned)
            else:
                steps.run_units_inline(self.ctx.runtime, planned)
            if fail_at == "join":
                raise RuntimeError("killed after join")
            committed = steps.commit(self.ctx, self.target, planned)
            if fail_at == "commit":
                raise RuntimeError("killed after commit")
        finally:
            if planned:
                steps.cleanup(self.ctx, self.target, planned)
            lease.release(run_id, info.epoch)
        if new_state is not None:
            self.applied = new_state
        return {"planned": planned, "committed": committed}

    def mirror(self):
        return self.ctx.catalog().load_table(self.target.table)

    def assert_equal(self, expected: pa.Table) -> None:
        """The mirror holds exactly ``expected`` (whole rows, as multisets, over the source's columns)."""
        mirror = self.mirror()
        rows = mirror.scan().to_arrow() if mirror.current_snapshot() else None
        names = expected.column_names
        got = multiset(rows, names) if rows is not None else multiset(expected.schema.empty_table(), names)
        want = multiset(expected, names)
        assert got == want, (
            f"mirror differs: missing {list((want - got).items())[:3]}, extra {list((got - want).items())[:3]}"
        )
        keys = (
            pc.count_distinct(rows.column(self.key_columns[0])).as_py()
            if rows is not None and len(self.key_columns) == 1
            else None
        )
        if keys is not None:
            assert keys == rows.num_rows, "the mirror holds a key twice"

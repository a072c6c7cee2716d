"""An Iceberg mirror follows the changelog's schema changes by field id, in the same commit as its rows.

Real pyiceberg tables in a SQLite catalog; the changelog pipeline and the
mirror's DAG steps run in process (the ``mirror_join`` units inline). The
sink's side is simulated as in the PostgreSQL case: a rename is made in the
source and as a metadata-only rename of the same field in the changelog, so
changelog files written before it carry the old name. After every apply the
mirror must equal the source under the current names; a kill before the
commit must leave schema, mapping, rows and watermark all old.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from pyiceberg.types import IntegerType, LongType, NestedField, StringType, StructType

from cdc_devtools.cow import cow_merge
from cdc_devtools.inline_mirror import MirrorRun, run_mirror
from cdc_devtools.inline_pipeline import SOURCE, InlinePipeline
from cdc_devtools.mirror_check import compare
from cdc_devtools.orders import BY_REGION, SCHEMA, rows
from iceberg_cdc.errors import MirrorSchemaError
from iceberg_cdc.mirror.iceberg import commit as commit_module
from iceberg_cdc.mirror.iceberg.steps import watermark
from iceberg_cdc.mirror.iceberg.summary import MAPPING_PROPERTY
from iceberg_cdc.run.context import Context

MIRROR = "mirrors.orders"


class Killed(RuntimeError):
    pass


class IcebergMirrorPipeline(InlinePipeline):
    def __init__(self, tmp, mode: str = "merge-on-read") -> None:
        mirror = {"type": "iceberg", "table": MIRROR, "name": "ice", "mode": mode}
        super().__init__(tmp, table={"mirrors": [mirror]})
        self.catalog.create_namespace_if_not_exists("mirrors")

    def mirror(self) -> MirrorRun:
        return run_mirror(self.config, SOURCE, "ice")

    def sync(self) -> MirrorRun:
        self.catch_up()
        return self.mirror()

    @property
    def table(self):
        return self.catalog.load_table(MIRROR)

    def check(self) -> None:
        ctx = Context.of(self.config, SOURCE)
        result = compare(
            self.source, watermark(ctx, ctx.table.mirror("ice")), self.table.scan().to_arrow(), pg=False
        )
        assert result.exact, result

    def mapping(self) -> dict[int, int]:
        return {int(k): v for k, v in json.loads(self.table.metadata.properties[MAPPING_PROPERTY]).items()}

    def values(self, column: str) -> dict[int, object]:
        data = self.table.scan().to_arrow()
        return dict(zip(data.column("id").to_pylist(), data.column(column).to_pylist(), strict=True))


def rename_both(p: InlinePipeline, old: str, new: str) -> None:
    """The source renames a column; the sink, following it by field id, renames its own (metadata only)."""
    for table in (p.source, p.sink):
        with table.update_schema() as update:
            update.rename_column(old, new)
    p.source.refresh()


def upsert(p: InlinePipeline, data: dict) -> None:
    cow_merge(p.source, upserts=pa.table(data).cast(p.source.schema().as_arrow()))


@pytest.mark.parametrize("mode", ["merge-on-read", "copy-on-write"])
def test_a_rename_is_a_metadata_rename_committed_with_the_rows(tmp_path, mode):
    p = IcebergMirrorPipeline(tmp_path, mode)
    p.create_source(SCHEMA, partition_spec=BY_REGION)
    p.source.append(rows(range(12), region=["us", "eu"] * 6, status="old"))
    p.sync()
    p.check()
    status_id = p.table.schema().find_field("status").field_id
    sink_status = p.sink.schema().find_field("status").field_id
    assert p.mapping()[sink_status] == status_id
    rename_both(p, "status", "label")
    upsert(p, {"id": [0, 1, 40], "region": ["us", "us", "eu"], "label": ["moved", "same", "new"]})
    p.catch_up()
    versions = len(p.table.metadata.metadata_log)
    p.mirror()
    table = p.table
    assert len(table.metadata.metadata_log) == versions + 1  # schema, mapping, rows and watermark: one commit
    assert [f.name for f in table.schema().fields] == ["id", "region", "label"]
    assert table.schema().find_field("label").field_id == status_id  # renamed, not added
    head = table.current_snapshot()
    assert head.schema_id == table.metadata.current_schema_id
    values = p.values("label")
    assert values[2] == "old" and values[3] == "old"  # rows written before the rename, read by id
    assert values[0] == "moved" and values[40] == "new"
    assert p.mapping()[sink_status] == status_id
    p.check()
    # an added column and then its widening follow the same way
    with p.source.update_schema() as update:
        update.add_column("qty", IntegerType())
        update.add_column("address", StructType(NestedField(100, "city", StringType(), required=False)))
    p.source.refresh()
    upsert(
        p,
        {
            "id": [5, 41],
            "region": ["eu", "us"],
            "label": ["q", "r"],
            "qty": [3, None],
            "address": [{"city": "Oslo"}, None],
        },
    )
    p.sync()
    p.check()
    with p.source.update_schema() as update:
        update.update_column("qty", LongType())
    p.source.refresh()
    upsert(p, {"id": [5], "region": ["eu"], "label": ["w"], "qty": [2**40], "address": [{"city": "Bergen"}]})
    p.sync()
    assert str(p.table.schema().find_field("qty").field_type) == "long"
    p.check()
    # a nested field renamed in the changelog is renamed inside the mirror's struct
    rename_both(p, "address.city", "town")
    upsert(p, {"id": [41], "region": ["us"], "label": ["t"], "qty": [1], "address": [{"town": "Bodø"}]})
    p.sync()
    assert [f.name for f in p.table.schema().find_field("address").field_type.fields] == ["town"]
    assert p.values("address")[5] == {"town": "Bergen"}
    p.check()


def test_a_kill_before_the_commit_leaves_schema_mapping_rows_and_watermark_old(tmp_path, monkeypatch):
    p = IcebergMirrorPipeline(tmp_path)
    p.create_source(SCHEMA, partition_spec=BY_REGION)
    p.source.append(rows(range(6), status="old"))
    p.sync()
    before = p.table.metadata
    rename_both(p, "status", "label")
    upsert(p, {"id": [1, 9], "region": ["us", "us"], "label": ["x", "y"]})
    p.catch_up()

    def killed(self):  # the transaction holds the schema change; its commit never happens
        raise Killed("before the commit")

    with monkeypatch.context() as patch:
        patch.setattr(commit_module.AssertedProperties, "commit", killed)
        with pytest.raises(Killed):
            p.mirror()
    after = p.table.metadata
    assert (
        after.metadata_log == before.metadata_log and after.current_snapshot_id == before.current_snapshot_id
    )
    assert after.schema() == before.schema() and after.properties == before.properties
    p.check()  # still equal to the source at the old watermark
    p.mirror()
    assert [f.name for f in p.table.schema().fields] == ["id", "region", "label"]
    p.check()


def test_a_rename_onto_a_column_added_by_hand_fails_and_changes_nothing(tmp_path):
    p = IcebergMirrorPipeline(tmp_path)
    p.create_source(SCHEMA, partition_spec=BY_REGION)
    p.source.append(rows(range(4), status="old"))
    p.sync()
    with p.table.update_schema() as update:
        update.add_column("label", StringType())
    before = p.table.metadata
    rename_both(p, "status", "label")
    upsert(p, {"id": [7], "region": ["us"], "label": ["n"]})
    p.catch_up()
    with pytest.raises(MirrorSchemaError, match=r"'status' was renamed to 'label'.*rename or drop"):
        p.mirror()
    assert p.table.metadata.metadata_log == before.metadata_log
    p.check()
    with p.table.update_schema() as update:  # the fix the error names
        update.rename_column("label", "label_by_hand")
    p.mirror()
    assert p.values("label")[0] == "old" and p.values("label")[7] == "n"
    p.check()


def test_an_incompatible_existing_column_fails_naming_it_and_changes_nothing(tmp_path):
    """A mirror from before the mapping, with a column added by hand that the changelog then gets too."""
    p = IcebergMirrorPipeline(tmp_path)
    p.create_source(SCHEMA, partition_spec=BY_REGION)
    p.source.append(rows(range(3), status="a"))
    p.sync()
    with p.table.transaction() as tx:
        tx.remove_properties(MAPPING_PROPERTY)
    with p.table.update_schema() as update:
        update.add_column("qty", StringType())
    before = p.table.metadata
    with p.source.update_schema() as update:
        update.add_column("qty", LongType())
    p.source.refresh()
    upsert(p, {"id": [2], "region": ["us"], "status": ["b"], "qty": [3]})
    p.catch_up()
    with pytest.raises(
        MirrorSchemaError,
        match=r"column 'qty' is string in the mirror, long in the changelog.*rename the mirror's",
    ):
        p.mirror()
    assert p.table.metadata.metadata_log == before.metadata_log
    assert p.table.metadata.properties == before.properties
    with p.table.update_schema() as update:  # the fix the error names
        update.rename_column("qty", "qty_by_hand")
    p.mirror()
    p.check()


def test_a_mirror_without_a_mapping_is_mapped_by_name_in_its_next_commit(tmp_path):
    p = IcebergMirrorPipeline(tmp_path)
    p.create_source(SCHEMA, partition_spec=BY_REGION)
    p.source.append(rows(range(4), status="old"))
    p.sync()
    with p.table.transaction() as tx:  # as a mirror built before the mapping
        tx.remove_properties(MAPPING_PROPERTY)
    assert MAPPING_PROPERTY not in p.table.metadata.properties
    p.source.append(rows([10], status="new"))
    p.sync()
    sink = p.sink.schema()
    assert p.mapping() == {
        sink.find_field(n).field_id: p.table.schema().find_field(n).field_id
        for n in ("id", "region", "status")
    }
    p.check()

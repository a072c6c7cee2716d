"""A snapshot's changed files, read from real manifests of a SQLite-catalog table."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from pyiceberg.manifest import ManifestEntryStatus
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.update.snapshot import _OverwriteFiles
from pyiceberg.transforms import BucketTransform, IdentityTransform
from pyiceberg.types import ListType, LongType, NestedField, StringType, StructType

from cdc_devtools import mor
from iceberg_cdc.changelog.merge import merge_changes
from iceberg_cdc.config import TableConfig
from iceberg_cdc.errors import ConfigError, SourceHistoryError, UnsupportedSnapshotError
from iceberg_cdc.shuffle.partitioner import HashPartitioner
from iceberg_cdc.shuffle.rows import OP_COLUMN, Op
from iceberg_cdc.source import changes as changes_module
from iceberg_cdc.source.change_files import DataFileRef, SnapshotChanges
from iceberg_cdc.source.changes import (
    initial_load_changes,
    require_supported,
    snapshot_changes,
)
from iceberg_cdc.source.deletes import DeleteFileRef
from iceberg_cdc.source.reading import read_data_file
from iceberg_cdc.source.tables import load_source_table, resolve_identifier_columns
from tests.support.iceberg_tables import (
    add_deletion_vector,
    add_equality_deletes,
    add_orc_position_deletes,
    add_position_deletes,
    cow_rewrite,
    create_table,
    current_id,
    live_files,
    orders,
    replace_files,
    sql_catalog,
    write_data_files,
)


@pytest.fixture
def catalog(tmp_path):
    return sql_catalog(tmp_path)


def paths(refs) -> set[str]:
    return {r.path for r in refs}


def test_first_append_is_insert_only_without_parent(catalog):
    table = create_table(catalog, "t")
    table.append(orders([1, 2, 3]))
    changes = snapshot_changes(table, current_id(table))
    assert changes.parent_id is None
    assert changes.operation == "append"
    assert changes.kind == "insert_only"
    assert paths(changes.added) == {f.file_path for f in live_files(table)}
    assert changes.deleted == () and changes.delete_files == ()
    (ref,) = changes.added
    (data_file,) = live_files(table)
    assert ref == DataFileRef(data_file.file_path, data_file.file_size_in_bytes, 3, 0)
    assert changes.schema_id == table.schema().schema_id
    require_supported(changes)


def test_later_append_lists_only_its_own_files(catalog):
    table = create_table(catalog, "t")
    table.append(orders([1, 2]))
    before = {f.file_path for f in live_files(table)}
    table.append(orders([3, 4, 5]))
    changes = snapshot_changes(table, current_id(table))
    assert changes.kind == "insert_only"
    assert paths(changes.added) == {f.file_path for f in live_files(table)} - before
    assert [r.record_count for r in changes.added] == [3]
    assert changes.parent_id is not None


def test_copy_on_write_snapshot_as_spark_merge_commits_it(catalog):
    table = create_table(catalog, "t")
    table.append(orders([1, 2, 3]))
    table.append(orders([4, 5, 6]))
    first, second = live_files(table)
    snapshot_id = cow_rewrite(table, [first], orders([1, 3], note="v2"))
    added_now = {f.file_path for f in live_files(table)} - {first.file_path, second.file_path}

    changes = snapshot_changes(table, snapshot_id)
    assert changes.operation == "overwrite"
    assert changes.kind == "with_deletes"
    assert paths(changes.deleted) == {first.file_path}
    assert paths(changes.added) == added_now and len(added_now) == 1
    assert changes.deleted[0].record_count == first.record_count
    require_supported(changes)


def test_pyiceberg_delete_and_overwrite_snapshots_are_each_classified(catalog):
    table = create_table(catalog, "t")
    table.append(orders([1, 2, 3]))
    (original,) = live_files(table)

    table.delete("id = 2")  # rewrites the file without row 2: one snapshot, deleted + added
    (rewritten,) = live_files(table)
    partial = snapshot_changes(table, current_id(table))
    assert partial.kind == "with_deletes"
    assert paths(partial.deleted) == {original.file_path}
    assert paths(partial.added) == {rewritten.file_path}

    # overwrite = a delete snapshot of every live file, then an append snapshot. pyiceberg carries
    # the earlier delete manifest into the next snapshot's list: it must not count again.
    table.overwrite(orders([9], note="new"))
    appended = table.current_snapshot()
    removed_all = table.metadata.snapshot_by_id(appended.parent_snapshot_id)
    assert removed_all.summary.operation == Operation.DELETE
    delete_step = snapshot_changes(table, removed_all.snapshot_id)
    assert delete_step.kind == "with_deletes"
    assert paths(delete_step.deleted) == {rewritten.file_path}
    assert delete_step.added == ()
    append_step = snapshot_changes(table, appended.snapshot_id)
    assert append_step.kind == "insert_only"
    assert append_step.deleted == ()
    assert paths(append_step.added) == {f.file_path for f in live_files(table)}

    table.delete("id = 9")  # removes the only file whole: a delete without added files
    whole = snapshot_changes(table, current_id(table))
    assert whole.kind == "with_deletes" and whole.added == ()
    assert paths(whole.deleted) == paths(append_step.added)


def test_existing_entries_of_merged_manifests_are_not_added(catalog):
    table = create_table(
        catalog,
        "t",
        properties={"commit.manifest-merge.enabled": "true", "commit.manifest.min-count-to-merge": "2"},
    )
    for start in (1, 10, 20):
        table.append(orders([start, start + 1]))
    snapshot = table.current_snapshot()
    own = [m for m in snapshot.manifests(table.io) if m.added_snapshot_id == snapshot.snapshot_id]
    statuses = [e.status for m in own for e in m.fetch_manifest_entry(table.io, discard_deleted=False)]
    assert statuses.count(ManifestEntryStatus.EXISTING) == 2, "setup: the merged manifest carries old files"

    changes = snapshot_changes(table, snapshot.snapshot_id)
    assert changes.kind == "insert_only"
    assert len(changes.added) == 1 and changes.added[0].record_count == 2
    assert changes.deleted == ()


class _LegacyOverwrite(_OverwriteFiles):
    """Writes DELETED entries with the parent's snapshot id, as pyiceberg <= 0.11 did."""

    def _deleted_entries(self):
        entries = super()._deleted_entries()
        for entry in entries:
            entry.snapshot_id = self._parent_snapshot_id
        return entries


def test_deleted_entries_are_attributed_by_manifest_not_by_their_snapshot_id(catalog):
    table = create_table(catalog, "t")
    table.append(orders([1, 2]))
    (old,) = live_files(table)
    new_files = write_data_files(table, orders([1], note="v2"))
    with table.transaction() as tx, _LegacyOverwrite(Operation.OVERWRITE, tx, table.io) as rewrite:
        rewrite.delete_data_file(old)
        for data_file in new_files:
            rewrite.append_data_file(data_file)
    snapshot = table.current_snapshot()
    wrong_ids = {
        e.snapshot_id
        for m in snapshot.manifests(table.io)
        for e in m.fetch_manifest_entry(table.io, discard_deleted=False)
        if e.status == ManifestEntryStatus.DELETED
    }
    assert wrong_ids == {snapshot.parent_snapshot_id}, "setup: the legacy quirk is reproduced"

    changes = snapshot_changes(table, snapshot.snapshot_id)
    assert paths(changes.deleted) == {old.file_path}
    assert paths(changes.added) == {f.file_path for f in new_files}


def test_replace_snapshot_is_skipped_and_supported(catalog):
    table = create_table(catalog, "t")
    table.append(orders([1]))
    table.append(orders([2]))
    files = live_files(table)
    snapshot_id = replace_files(table, files, orders([1, 2]))
    changes = snapshot_changes(table, snapshot_id)
    assert changes.operation == "replace"
    assert changes.kind == "replace"
    assert paths(changes.deleted) == {f.file_path for f in files}
    require_supported(changes)


def test_position_delete_of_a_kept_file_requires_the_new_delete(catalog):
    table = create_table(catalog, "t")
    table.append(orders([1, 2, 3]))
    (data_file,) = live_files(table)
    snapshot_id, delete_path = add_position_deletes(table, data_file.file_path, [1])
    assert table.scan().to_arrow().column("id").to_pylist() == [1, 3], "setup: a valid delete file"

    changes = snapshot_changes(table, snapshot_id)
    assert changes.delete_files == (delete_path,)
    assert changes.kind == "with_deletes" and changes.added == ()
    (kept,) = changes.deleted
    assert (kept.path, kept.deletes, kept.require) == (data_file.file_path, (), (delete_path,))
    assert set(changes.delete_refs) == {delete_path}
    assert changes.delete_refs[delete_path].kind == "position"
    require_supported(changes)


def test_rewriting_a_file_that_has_live_deletes_applies_them_until_compaction(catalog):
    table = create_table(catalog, "t")
    table.append(orders([1, 2, 3]))
    (data_file,) = live_files(table)
    _, delete_path = add_position_deletes(table, data_file.file_path, [1])

    rewrite = snapshot_changes(table, cow_rewrite(table, [data_file], orders([1, 3], note="v2")))
    (removed,) = rewrite.deleted
    assert removed.deletes == (delete_path,) and removed.require == ()
    assert all(ref.deletes == () for ref in rewrite.added)  # the delete names the old file only

    # Compaction writes new files (newer sequence number): the old delete file no longer applies.
    replace_files(table, live_files(table), orders([1, 3], note="v2"))
    after = snapshot_changes(table, cow_rewrite(table, live_files(table), orders([1], note="v3")))
    assert all(ref.deletes == () for ref in after.deleted) and after.delete_refs == {}


def test_equality_deletes_apply_to_older_rows_only(catalog):
    table = create_table(catalog, "t")
    table.append(orders([1, 2, 3]))
    (old,) = live_files(table)
    snapshot_id, delete_path = add_equality_deletes(table, [2])
    changes = snapshot_changes(table, snapshot_id)
    (kept,) = changes.deleted
    assert kept.path == old.file_path and kept.require == (delete_path,)
    assert changes.delete_refs[delete_path].kind == "equality"
    # A file appended after the delete has a higher sequence number: the delete never applies to it.
    table.append(orders([2]))
    newer = snapshot_changes(table, current_id(table))
    assert newer.kind == "insert_only" and newer.added[0].deletes == ()


def test_initial_load_lists_every_live_file(catalog):
    table = create_table(catalog, "t")
    table.append(orders([1, 2]))
    table.append(orders([3]))
    cow_rewrite(table, [live_files(table)[0]], orders([4]))
    changes = initial_load_changes(table, current_id(table))
    assert changes.kind == "insert_only"
    assert paths(changes.added) == {f.file_path for f in live_files(table)}
    assert changes.deleted == ()
    assert sum(r.record_count for r in changes.added) == table.scan().to_arrow().num_rows
    require_supported(changes)


def test_kept_files_are_looked_for_only_in_manifests_of_the_deletes_partitions(catalog, monkeypatch):
    """Appends by region, each its own manifest; an equality delete in one region reads one data manifest."""
    schema = Schema(NestedField(1, "id", LongType()), NestedField(2, "region", StringType()))
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "region"))
    table = catalog.create_table("db.by_region", schema=schema, partition_spec=spec)
    for i, region in enumerate(["us", "eu", "apac", "latam"]):
        table.append(pa.table({"id": pa.array([i * 10, i * 10 + 1], pa.int64()), "region": [region] * 2}))
    eu = next(f for f in live_files(table) if f.partition[0] == "eu")
    delete_file = mor.equality_delete_file(
        table, pa.table({"id": pa.array([10], pa.int64())}), spec_id=spec.spec_id, partition=eu.partition
    )
    snapshot_id = mor.commit_row_delta(table, add=[delete_file], operation=Operation.DELETE)
    read: list[str] = []
    real = changes_module.manifest_entries

    def counting(io, manifest, format_version, **kw):
        read.append(manifest.content.name)
        return real(io, manifest, format_version, **kw)

    monkeypatch.setattr(changes_module, "manifest_entries", counting)
    changes = snapshot_changes(table, snapshot_id)
    assert [ref.path for ref in changes.deleted] == [eu.file_path]
    assert changes.deleted[0].require == (delete_file.file_path,)
    # Its own manifest (the delete), the parent's and its deletes (none), one of four data manifests.
    assert read.count("DATA") == 1


def test_initial_load_applies_live_delete_files(catalog):
    table = create_table(catalog, "t")
    table.append(orders([1, 2, 3]))
    (data_file,) = live_files(table)
    snapshot_id, delete_path = add_position_deletes(table, data_file.file_path, [0])
    changes = initial_load_changes(table, snapshot_id)
    assert changes.added[0].deletes == (delete_path,)
    require_supported(changes)


def test_orc_delete_file_is_rejected_with_the_way_out(catalog):
    table = create_table(catalog, "t")
    table.append(orders([1, 2, 3]))
    snapshot_id, orc_path = add_orc_position_deletes(table, live_files(table)[0])
    changes = snapshot_changes(table, snapshot_id)
    with pytest.raises(UnsupportedSnapshotError) as raised:
        require_supported(changes)
    message = str(raised.value)
    assert str(snapshot_id) in message and orc_path in message and "write.delete.format.default" in message


def test_deletion_vector_applies_to_its_data_file_and_replaces_position_deletes(catalog):
    table = create_table(catalog, "t", properties={"format-version": "2"})
    table.append(orders([1, 2, 3, 4]))
    (data_file,) = live_files(table)
    _, pos_path = add_position_deletes(table, data_file.file_path, [0])
    table, snapshot_id, dv_path = add_deletion_vector(table, data_file.file_path, [0, 2])
    changes = snapshot_changes(table, snapshot_id)
    require_supported(changes)
    ((kept,),) = [changes.deleted]
    (dv_key,) = kept.require
    assert kept.path == data_file.file_path and kept.deletes == (pos_path,)
    assert dv_key.startswith(f"{dv_path}#")
    ref = changes.delete_refs[dv_key]
    assert (ref.kind, ref.referenced_data_file, ref.record_count) == ("dv", data_file.file_path, 2)
    # Once a DV applies, the file's position delete file no longer does (the DV holds its positions).
    later = initial_load_changes(table, snapshot_id)
    assert later.added[0].deletes == (dv_key,)


def test_two_live_deletion_vectors_for_one_data_file_are_rejected(catalog):
    table = create_table(catalog, "t", properties={"format-version": "2"})
    table.append(orders([1, 2, 3]))
    (data_file,) = live_files(table)
    table, _, _ = add_deletion_vector(table, data_file.file_path, [0])
    table, snapshot_id, _ = add_deletion_vector(table, data_file.file_path, [1])  # the first is not removed
    with pytest.raises(UnsupportedSnapshotError, match="two live deletion vectors"):
        require_supported(snapshot_changes(table, snapshot_id))


def test_expired_snapshot_cannot_be_read(catalog):
    table = create_table(catalog, "t")
    table.append(orders([1]))
    first = current_id(table)
    table.append(orders([2]))
    table.maintenance.expire_snapshots().by_id(first).commit()
    with pytest.raises(SourceHistoryError, match=str(first)):
        snapshot_changes(table, first)


def _changes(**kw) -> SnapshotChanges:
    base = dict(
        snapshot_id=5,
        parent_id=4,
        operation="overwrite",
        sequence_number=3,
        timestamp_ms=1,
        schema_id=0,
        added=(),
        deleted=(),
    )
    return SnapshotChanges(**{**base, **kw})


def test_kind_rules():
    ref = DataFileRef("s3://b/f.parquet", 10, 2, 0)
    assert _changes().kind == "empty"
    assert _changes(added=(ref,)).kind == "insert_only"
    assert _changes(deleted=(ref,)).kind == "with_deletes"
    assert _changes(added=(ref,), deleted=(ref,)).kind == "with_deletes"
    # Delete files that apply to no data file change no row.
    assert _changes(delete_files=("d.parquet",)).kind == "empty"
    assert _changes(operation="replace", added=(ref,), deleted=(ref,)).kind == "replace"
    require_supported(_changes(operation="replace", unsupported=("d.puffin is a deletion vector",)))
    with pytest.raises(UnsupportedSnapshotError, match=r"d\.puffin"):
        require_supported(_changes(deleted=(ref,), unsupported=("d.puffin is a deletion vector",)))


def test_json_round_trip():
    changes = _changes(
        added=(DataFileRef("s3://b/a.parquet", 10, 2, 0, deletes=("s3://b/x.parquet",)),),
        deleted=(DataFileRef("s3://b/d.parquet", 20, 4, 1, require=("s3://b/x.parquet",)),),
        delete_files=("s3://b/x.parquet",),
        delete_refs={"s3://b/x.parquet": DeleteFileRef("s3://b/x.parquet", "equality", 9, 3, 7, (1, 2))},
        parent_id=None,
    )
    assert SnapshotChanges.from_dict(json.loads(json.dumps(changes.to_dict()))) == changes
    ref = changes.added[0]
    assert DataFileRef.from_dict(json.loads(json.dumps(ref.to_dict()))) == ref


def test_json_round_trip_with_partition_values_and_old_documents():
    ref = DataFileRef("s3://b/a.parquet", 10, 2, 1, {4: "US", 5: 19723})
    document = json.loads(json.dumps(ref.to_dict()))
    assert document["partition_values"] == {"4": "US", "5": 19723}
    assert DataFileRef.from_dict(document) == ref
    old = {"path": "s3://b/a.parquet", "size": 10, "record_count": 2, "spec_id": 1}
    assert DataFileRef.from_dict(old).partition_values is None
    assert "partition_values" not in DataFileRef.from_dict(old).to_dict()
    changes = _changes(added=(ref,), deleted=(DataFileRef.from_dict(old),))
    assert SnapshotChanges.from_dict(json.loads(json.dumps(changes.to_dict()))) == changes


def test_identity_partition_values_come_from_the_file_spec(catalog):
    schema = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "region", StringType(), required=False),
    )
    spec = PartitionSpec(
        PartitionField(2, 1000, IdentityTransform(), "region"),
        PartitionField(1, 1001, BucketTransform(2), "id_bucket"),  # not a column's value: left out
    )
    table = catalog.create_table("db.parts", schema=schema, partition_spec=spec)
    table.append(pa.table({"id": pa.array([1, 2], pa.int64()), "region": ["US", None]}))
    region_id = table.schema().find_field("region").field_id
    for changes in (
        snapshot_changes(table, current_id(table)),
        initial_load_changes(table, current_id(table)),
    ):
        values = [ref.partition_values for ref in changes.added]
        assert {region_id: "US"} in values
        assert all(v is None or v == {region_id: "US"} for v in values), "null regions carry nothing"

    unpartitioned = create_table(catalog, "flat")
    unpartitioned.append(orders([1]))
    (ref,) = snapshot_changes(unpartitioned, current_id(unpartitioned)).added
    assert ref.partition_values is None


# --- the configured source table and its identifier columns (source/tables.py) -------------------


def table_config(source: str = "db.orders", identifier_columns: list[str] | None = None) -> TableConfig:
    return TableConfig(source=source, sink=f"{source}_changes", identifier_columns=identifier_columns)


def test_missing_source_table_names_the_key_catalog_and_neighbours(catalog):
    for name in ("orders_v2", "customers", "order"):
        create_table(catalog, name)
    assert load_source_table(catalog, table_config("db.orders_v2")).name() == ("db", "orders_v2")
    with pytest.raises(ConfigError) as raised:
        load_source_table(catalog, table_config("db.orders"))
    message = str(raised.value)
    assert message.startswith("tables[].source: table 'db.orders' does not exist in catalog 'test'.")
    assert "Namespace 'db' holds 3 table(s): db.order, db.orders_v2" in message, "closest first"
    assert "db.customers" in message and "Fix tables[].source" in message


def test_missing_source_namespace_lists_the_namespaces(catalog):
    catalog.create_namespace("shop")
    with pytest.raises(
        ConfigError, match=r"Namespace 'dbx' does not exist; the catalog's namespaces are: db, shop"
    ):
        load_source_table(catalog, table_config("dbx.orders"))


def test_many_tables_are_counted_not_listed(catalog):
    for i in range(12):
        create_table(catalog, f"t{i:02d}")
    with pytest.raises(ConfigError, match=r"holds 12 table\(s\): .*\(and 4 more\)"):
        load_source_table(catalog, table_config("db.nope"))


NESTED = Schema(
    NestedField(
        1,
        "k",
        StructType(
            NestedField(2, "tenant", StringType(), required=True),
            NestedField(3, "id", LongType(), required=True),
        ),
        required=True,
    ),
    NestedField(4, "note", StringType(), required=False),
    NestedField(5, "tags", ListType(6, StringType(), element_required=False), required=False),
    identifier_field_ids=[3],
)


def test_identifier_columns_configured_or_from_the_table():
    flat = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "b", StringType()),
        identifier_field_ids=[1],
    )
    assert resolve_identifier_columns(table_config(), flat) == ["id"]
    assert resolve_identifier_columns(table_config(identifier_columns=["b", "id"]), flat) == ["b", "id"]
    assert resolve_identifier_columns(table_config(), Schema(NestedField(1, "id", LongType()))) is None
    # nested identifier fields: Iceberg's full name, resolved through the struct
    assert resolve_identifier_columns(table_config(), NESTED) == ["k.id"]
    assert resolve_identifier_columns(table_config(identifier_columns=["k.tenant", "k.id"]), NESTED) == [
        "k.tenant",
        "k.id",
    ]


def test_identifier_columns_that_do_not_exist_or_sit_in_a_list_are_refused():
    with pytest.raises(
        ConfigError,
        match=r"table db\.orders: identifier column 'k\.idd' \(tables\[\]\.identifier_columns\) does not exist"
        r".*Did you mean 'k\.id'",
    ):
        resolve_identifier_columns(table_config(identifier_columns=["k.idd"]), NESTED)
    with pytest.raises(ConfigError, match=r"'tags\.element' .* is inside a list or a map"):
        resolve_identifier_columns(table_config(identifier_columns=["tags.element"]), NESTED)


def test_nested_identifier_field_works_from_files_to_changes(catalog):
    # A table whose identifier field sits in a struct: read the snapshot's files as write tasks do,
    # partition on the nested key, merge each partition: the update pairs, the carryover cancels.
    table = catalog.create_table("db.nested", schema=NESTED)
    key_type = table.schema().as_arrow().field("k").type
    arrow_schema = table.schema().as_arrow()

    def rows(keys: list[tuple[str, int]], notes: list[str]) -> pa.Table:
        struct = pa.array([{"tenant": t, "id": i} for t, i in keys], key_type)
        return pa.Table.from_arrays(
            [
                struct,
                pa.array(notes, pa.large_string()),
                pa.nulls(len(keys), arrow_schema.field("tags").type),
            ],
            schema=arrow_schema,
        )

    table.append(rows([("a", 1), ("b", 2), ("c", 3)], ["x", "y", "z"]))
    ids = resolve_identifier_columns(table_config("db.nested"), table.schema())
    assert ids == ["k.id"]
    # one CoW snapshot: id 1 updated (and moved to another tenant), id 2 carried over, id 3 deleted
    snapshot = cow_rewrite(table, live_files(table), rows([("z", 1), ("b", 2)], ["x2", "y"]))
    changes = snapshot_changes(table, snapshot)
    schema = table.schema()
    partitioner = HashPartitioner(7, ids)
    shuffled: dict[int, list[pa.Table]] = {}
    for ref, op in [(r, Op.DELETE) for r in changes.deleted] + [(r, Op.INSERT) for r in changes.added]:
        for batch in read_data_file(table.io, ref.path, schema):
            parts = partitioner.partitions(batch)
            tagged = pa.Table.from_batches([batch]).append_column(
                OP_COLUMN, pa.array([int(op)] * batch.num_rows, pa.int8())
            )
            for p in set(parts.tolist()):
                shuffled.setdefault(p, []).append(tagged.filter(pa.array(parts == p)))
    out = [
        (r["k"]["tenant"], r["k"]["id"], r["note"], r["_change_type"])
        for p in sorted(shuffled)
        for r in merge_changes(pa.concat_tables(shuffled[p]), ids, where="table db.nested")[0].to_pylist()
    ]
    assert sorted(out) == sorted(
        [("a", 1, "x", "UPDATE_BEFORE"), ("z", 1, "x2", "UPDATE_AFTER"), ("c", 3, "z", "DELETE")]
    )

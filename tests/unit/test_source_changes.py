"""A snapshot's changed files, read from real manifests of a SQLite-catalog table."""

from __future__ import annotations

import json

import pytest
from pyiceberg.manifest import ManifestEntryStatus
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.update.snapshot import _OverwriteFiles

from iceberg_cdc.errors import SourceHistoryError, UnsupportedSnapshotError
from iceberg_cdc.source.changes import (
    DataFileRef,
    SnapshotChanges,
    initial_load_changes,
    require_supported,
    snapshot_changes,
)
from tests.support.iceberg_tables import (
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


def test_position_delete_file_is_rejected_with_the_fix(catalog):
    table = create_table(catalog, "t")
    table.append(orders([1, 2, 3]))
    (data_file,) = live_files(table)
    snapshot_id, delete_path = add_position_deletes(table, data_file.file_path, [1])
    assert table.scan().to_arrow().column("id").to_pylist() == [1, 3], "setup: a valid delete file"

    changes = snapshot_changes(table, snapshot_id)
    assert changes.delete_files == (delete_path,)
    assert changes.kind == "with_deletes"
    with pytest.raises(UnsupportedSnapshotError) as raised:
        require_supported(changes)
    message = str(raised.value)
    assert str(snapshot_id) in message and delete_path in message
    assert "1 delete file" in message and "copy-on-write" in message


def test_rewriting_a_file_that_has_live_deletes_is_rejected_until_compaction(catalog):
    table = create_table(catalog, "t")
    table.append(orders([1, 2, 3]))
    (data_file,) = live_files(table)
    _, delete_path = add_position_deletes(table, data_file.file_path, [1])

    rewrite = snapshot_changes(table, cow_rewrite(table, [data_file], orders([1, 3], note="v2")))
    assert rewrite.inherited_delete_files == (delete_path,)
    with pytest.raises(UnsupportedSnapshotError, match="already deleted"):
        require_supported(rewrite)

    # Compaction writes new files (newer sequence number): the old delete file no longer applies.
    replace_files(table, live_files(table), orders([1, 3], note="v2"))
    after = snapshot_changes(table, cow_rewrite(table, live_files(table), orders([1], note="v3")))
    assert after.inherited_delete_files == ()
    require_supported(after)


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


def test_initial_load_with_live_delete_files_is_rejected(catalog):
    table = create_table(catalog, "t")
    table.append(orders([1, 2, 3]))
    (data_file,) = live_files(table)
    snapshot_id, delete_path = add_position_deletes(table, data_file.file_path, [0])
    changes = initial_load_changes(table, snapshot_id)
    assert changes.inherited_delete_files == (delete_path,)
    with pytest.raises(UnsupportedSnapshotError):
        require_supported(changes)


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
    assert _changes(delete_files=("d.parquet",)).kind == "with_deletes"
    assert _changes(operation="replace", added=(ref,), deleted=(ref,)).kind == "replace"
    require_supported(_changes(operation="replace", delete_files=("d.parquet",)))


def test_json_round_trip():
    changes = _changes(
        added=(DataFileRef("s3://b/a.parquet", 10, 2, 0),),
        deleted=(DataFileRef("s3://b/d.parquet", 20, 4, 1),),
        delete_files=("s3://b/x.parquet",),
        parent_id=None,
    )
    assert SnapshotChanges.from_dict(json.loads(json.dumps(changes.to_dict()))) == changes
    ref = changes.added[0]
    assert DataFileRef.from_dict(json.loads(json.dumps(ref.to_dict()))) == ref

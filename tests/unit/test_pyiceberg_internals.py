"""Every assumption :mod:`iceberg_cdc.pyiceberg_internals` makes about pyiceberg, pinned.

A pyiceberg release that changes one of them fails a test here, by name,
instead of silently changing what the pipeline reads or commits. The most
important one: pyiceberg's own commit retry stays off for sink commits, so a
commit that lost a race is decided again by the sink's marker check.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.avro.file import AvroOutputFile
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.io import load_file_io
from pyiceberg.io.pyarrow import (
    ArrowProjectionVisitor,
    PyArrowFile,
    PyArrowFileIO,
    _import_retry_strategy,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
    pyarrow_to_schema,
)
from pyiceberg.manifest import (
    DATA_FILE_TYPE,
    DEFAULT_READ_VERSION,
    MANIFEST_ENTRY_SCHEMAS,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
)
from pyiceberg.schema import Schema
from pyiceberg.table import Table, TableProperties, Transaction
from pyiceberg.table.update import UpdateTableMetadata
from pyiceberg.typedef import Record
from pyiceberg.types import (
    DoubleType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
)

from iceberg_cdc import pyiceberg_internals
from iceberg_cdc.errors import UnsupportedDependencyError, is_final
from iceberg_cdc.pyiceberg_internals import commit as commit_door
from iceberg_cdc.pyiceberg_internals.datafiles import data_file_from_footer
from iceberg_cdc.pyiceberg_internals.file_io import pyarrow_file_arguments
from iceberg_cdc.pyiceberg_internals.manifest_reader import manifest_entries, v3_field
from iceberg_cdc.pyiceberg_internals.projection import project_batch
from iceberg_cdc.sink import commit as commit_module
from iceberg_cdc.sink.commit import commit_changes
from iceberg_cdc.sink.datafiles import data_files_from_parquet
from iceberg_cdc.sink.table import ensure_sink_table, find_commit
from iceberg_cdc.storage.retrying_io import ONE_ATTEMPT_S3_RETRY_STRATEGY_IMPL, OneAttemptS3RetryStrategy
from tests.support.sink_tables import (
    SINK,
    SOURCE,
    SOURCE_UUID,
    change_rows,
    make_catalog,
    sink_rows,
    source_schema,
    stage,
)

REPO = Path(__file__).resolve().parents[2]
V3_FIELDS = ("first_row_id", "referenced_data_file", "content_offset", "content_size_in_bytes")


def _parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


# ----------------------------------------------------------------------------- supported versions


def test_the_installed_pyiceberg_is_supported():
    pyiceberg_internals.check_pyiceberg_version()


@pytest.mark.parametrize("version", ["0.12.0", "0.12.7", "0.12.1.dev3"])
def test_versions_inside_the_range_pass(version):
    pyiceberg_internals.check_pyiceberg_version(version)


@pytest.mark.parametrize("version", ["0.11.2", "0.13.0", "0.13.0rc1", "1.0.0", "unknown"])
def test_versions_outside_the_range_fail_naming_both(version):
    with pytest.raises(UnsupportedDependencyError) as caught:
        pyiceberg_internals.check_pyiceberg_version(version)
    message = str(caught.value)
    assert f"pyiceberg {version} is installed" in message
    assert pyiceberg_internals.SUPPORTED in message and "pyiceberg==0.12.0" in message
    assert is_final(caught.value), "a retry of the same install fails the same way: fail at once"


def test_the_declared_range_is_the_doors():
    """requirements.txt declares exactly the door's range: a wider one would install what cannot import."""
    text = (REPO / "requirements.txt").read_text()
    match = re.search(r"^pyiceberg(?:\[[^\]]*\])?(\S+)", text, re.MULTILINE)
    assert match, "requirements.txt declares no pyiceberg"
    assert match.group(1) == pyiceberg_internals.SUPPORTED


@pytest.mark.parametrize("name", ["constraints.txt", "constraints-min.txt"])
def test_the_pins_fall_inside_the_supported_range(name):
    """The door's range and the pins move together: a pin outside it would fail every import."""
    text = (REPO / name).read_text()
    match = re.search(r"^pyiceberg(?:\[[^\]]*\])?==(\S+)", text, re.MULTILINE)
    assert match, f"{name} pins no pyiceberg"
    release = pyiceberg_internals.release_of(match.group(1))
    assert release is not None
    assert pyiceberg_internals.MIN_VERSION <= release < pyiceberg_internals.MAX_VERSION
    assert pyiceberg_internals.SUPPORTED in (pyiceberg_internals.__doc__ or "")


# ----------------------------------------------------------------------------- commit: no retry inside pyiceberg


@pytest.fixture
def catalog(tmp_path):
    return make_catalog(tmp_path)


@pytest.fixture
def sink(catalog):
    return ensure_sink_table(catalog, SINK, source_schema())


@pytest.fixture
def catalog_commits(catalog, monkeypatch):
    """Every call pyiceberg makes to the catalog's ``commit_table``, in order: True when it succeeded."""
    calls: list[bool] = []
    original = catalog.commit_table

    def counting(*args, **kwargs):
        try:
            response = original(*args, **kwargs)
        except CommitFailedException:
            calls.append(False)
            raise
        calls.append(True)
        return response

    monkeypatch.setattr(catalog, "commit_table", counting)
    return calls


def _append(table: Table, data_files: list[DataFile]) -> None:
    tx = table.transaction()
    with tx.update_snapshot().fast_append() as append:
        for data_file in data_files:
            append.append_data_file(data_file)
    tx.commit_transaction()


def _files(sink: Table, snapshot_id: int, ids: range) -> list[DataFile]:
    paths = stage(sink, snapshot_id, 1, [change_rows(ids)])
    return data_files_from_parquet(sink.io, sink.metadata, paths)


def _commit(table: Table, paths: list[str]):
    """The sink's commit of source snapshot 1001 (ordinal 1) from ``paths``."""
    return commit_changes(
        table,
        staged_paths=paths,
        source_identifier=SOURCE,
        source_uuid=SOURCE_UUID,
        snapshot_id=1001,
        ordinal=1,
    )


def test_pyiceberg_retries_a_lost_race_on_its_own_by_default(catalog, sink, catalog_commits):
    """The control: without the door, pyiceberg itself retries and rebuilds the append on the new head."""
    stale = catalog.load_table(SINK)
    _append(sink, _files(sink, 1001, range(3)))
    _append(stale, _files(sink, 1002, range(10, 12)))
    assert catalog_commits == [True, False, True]  # the stale append was rebuilt inside pyiceberg
    assert len(catalog.load_table(SINK).metadata.snapshots) == 2


def test_a_table_without_commit_retry_commits_once_and_reports_the_lost_race(catalog, sink, catalog_commits):
    """The door's table object: a lost race reaches the caller after one catalog call, nothing was rebuilt."""
    stale = catalog.load_table(SINK)
    _append(sink, _files(sink, 1001, range(3)))
    with pytest.raises(CommitFailedException):
        _append(commit_door.table_without_commit_retry(stale), _files(sink, 1002, range(10, 12)))
    assert catalog_commits == [True, False]
    assert len(catalog.load_table(SINK).metadata.snapshots) == 1


def test_a_sink_commit_that_lost_the_race_is_decided_by_the_marker_check(
    catalog, sink, catalog_commits, monkeypatch
):
    """Directly: pyiceberg does not retry the sink's commit; the sink's loop looks for the marker again.

    Another writer commits the same source snapshot first. The stale commit
    loses the race once (one catalog call, not pyiceberg's five), reloads,
    runs the marker check a second time, finds the other commit and stops:
    one sink snapshot, no duplicate rows.
    """
    monkeypatch.setattr(commit_module, "_backoff", lambda attempt: None)
    marker_checks = []

    def counting_find_commit(*args, **kwargs):
        found = find_commit(*args, **kwargs)
        marker_checks.append(found is not None)
        return found

    monkeypatch.setattr(commit_module, "find_commit", counting_find_commit)
    stale = catalog.load_table(SINK)
    paths = stage(sink, 1001, 1, [change_rows(range(6))])
    first = _commit(sink, paths)
    assert first.committed and catalog_commits == [True] and marker_checks == [False]

    second = _commit(stale, paths)
    assert catalog_commits == [True, False]  # the stale attempt: one call, no retry inside pyiceberg
    assert marker_checks == [False, False, True]  # ... then the marker check ran again and found it
    assert not second.committed and second.sink_snapshot_id == first.sink_snapshot_id
    fresh = catalog.load_table(SINK)
    assert len(fresh.metadata.snapshots) == 1 and len(sink_rows(fresh)) == 6


def test_the_retry_setting_never_reaches_the_catalog(catalog, sink):
    paths = stage(sink, 1001, 1, [change_rows(range(2))])
    _commit(sink, paths)
    assert TableProperties.COMMIT_NUM_RETRIES not in catalog.load_table(SINK).properties
    assert TableProperties.COMMIT_NUM_RETRIES not in sink.properties


def test_the_commit_retry_is_read_from_the_transactions_table_object():
    """What :func:`table_without_commit_retry` relies on, in pyiceberg's source and names."""
    assert TableProperties.COMMIT_NUM_RETRIES == "commit.retry.num-retries"
    source = inspect.getsource(Transaction.commit_transaction)
    assert "self._table.metadata.properties" in source and "COMMIT_NUM_RETRIES" in source
    assert {"identifier", "metadata", "metadata_location", "io", "catalog", "config"} <= set(
        _parameters(Table)
    )


def test_properties_at_head_commit_on_the_head_and_fail_on_a_moved_one(catalog, sink):
    stale = catalog.load_table(SINK)
    _append(sink, _files(sink, 1001, range(3)))
    head = sink.current_snapshot().snapshot_id

    tx = commit_door.table_without_commit_retry(stale).transaction()
    commit_door.set_properties_at_head(tx, {"cdc.test": "stale"}, None)  # decided on the empty table
    with pytest.raises(CommitFailedException):
        tx.commit_transaction()

    fresh = commit_door.table_without_commit_retry(sink)
    tx = fresh.transaction()
    commit_door.set_properties_at_head(tx, {"cdc.test": "current"}, head)
    tx.commit_transaction()
    commit_door.adopt(sink, fresh)
    assert catalog.load_table(SINK).properties["cdc.test"] == "current"
    assert sink.metadata_location == catalog.load_table(SINK).metadata_location
    assert "_commit" in UpdateTableMetadata.__abstractmethods__


def test_properties_for_schema_require_the_schema_the_transaction_started_from(catalog, sink):
    """Alone, or after a staged schema change, the requirement names the schema the transaction began on."""
    from pyiceberg.table.update import AssertCurrentSchemaId
    from pyiceberg.types import StringType

    base = sink.schema().schema_id
    alone = sink.transaction()
    commit_door.set_properties_for_schema(alone, {"cdc.test": "a"})
    with_change = sink.transaction()
    with with_change.update_schema() as update:
        update.add_column("extra_a", StringType())
    commit_door.set_properties_for_schema(with_change, {"cdc.test": "b"})
    for tx in (alone, with_change):
        asserted = [r for r in tx._requirements if isinstance(r, AssertCurrentSchemaId)]
        assert [r.current_schema_id for r in asserted] == [base]
    # A concurrent schema change makes the mapping-only update fail, not land on the other schema.
    with catalog.load_table(SINK).update_schema() as update:
        update.add_column("extra_b", StringType())
    moved = catalog.load_table(SINK).metadata
    with pytest.raises(CommitFailedException):
        for requirement in alone._requirements:
            requirement.validate(moved)


# ----------------------------------------------------------------------------- projection


def test_projection_visitor_takes_the_arguments_and_hooks_the_door_uses():
    assert {
        "file_schema",
        "downcast_ns_timestamp_to_us",
        "allow_timestamp_tz_mismatch",
        "projected_missing_fields",
    } <= set(_parameters(ArrowProjectionVisitor.__init__))
    assert _parameters(ArrowProjectionVisitor.list) == [
        "self",
        "list_type",
        "list_array",
        "value_array",
    ]
    assert _parameters(ArrowProjectionVisitor.map) == [
        "self",
        "map_type",
        "map_array",
        "key_result",
        "value_result",
    ]


def _nested_schema() -> Schema:
    return Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(
            2, "items", ListType(3, StructType(NestedField(4, "sku", StringType())), element_required=False)
        ),
        NestedField(
            5, "tags", MapType(6, StringType(), 7, StructType(NestedField(8, "n", IntegerType())), False)
        ),
    )


def _nested_batch() -> pa.RecordBatch:
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    return pa.RecordBatch.from_pylist(
        [
            {"id": 1, "items": None, "tags": None},
            {"id": 2, "items": [{"sku": "a"}], "tags": [("k", {"n": 1})]},
            {"id": 3, "items": [], "tags": []},
        ],
        schema=schema_to_pyarrow(_nested_schema()),
    )


def test_null_lists_and_maps_stay_null_through_the_projection():
    schema = _nested_schema()
    projected = project_batch(schema, schema, _nested_batch(), downcast_ns=True, constants={})
    assert projected.column("items").to_pylist() == [None, [{"sku": "a"}], []]
    assert projected.column("tags").to_pylist() == [None, [("k", {"n": 1})], []]


def test_pyiceberg_still_loses_null_lists_which_is_why_the_door_overrides_its_visitor():
    """apache/iceberg-python#3833. When this fails, pyiceberg keeps nulls itself: drop NullKeepingProjection."""
    from pyiceberg.io.pyarrow import ArrowAccessor
    from pyiceberg.schema import visit_with_partner

    schema = _nested_schema()
    plain = pa.RecordBatch.from_struct_array(
        visit_with_partner(schema, _nested_batch(), ArrowProjectionVisitor(schema), ArrowAccessor(schema))
    )
    assert plain.column("items").to_pylist()[0] == []


def test_missing_columns_come_from_the_constants():
    file_schema = Schema(NestedField(1, "id", LongType(), required=True))
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(9, "region", StringType()))
    batch = pa.RecordBatch.from_pylist(
        [{"id": 1}, {"id": 2}], schema=pa.schema([pa.field("id", pa.int64(), False)])
    )
    projected = project_batch(schema, file_schema, batch, downcast_ns=True, constants={9: "EU"})
    assert projected.to_pylist() == [{"id": 1, "region": "EU"}, {"id": 2, "region": "EU"}]


# ----------------------------------------------------------------------------- manifests


def test_manifest_schemas_have_the_ids_and_positions_the_reader_uses():
    entry = MANIFEST_ENTRY_SCHEMAS[3]
    assert entry.find_field(0).name == "status" and entry.find_field(2).name == "data_file"
    data_file = entry.find_field(2).field_type
    assert data_file.field(101).name == "file_format"
    assert data_file.field(134).name == "content"
    v2 = [f.name for f in DATA_FILE_TYPE[2].fields]
    v3 = [f.name for f in DATA_FILE_TYPE[3].fields]
    assert v3[: len(v2)] == v2  # v3 only appends: the v2 properties of DataFile read the right positions
    assert set(V3_FIELDS) <= set(v3[len(v2) :])
    assert DEFAULT_READ_VERSION == 2  # why the fork exists: pyiceberg's reader drops the v3 fields


def _write_v3_manifest(tmp_path: Path) -> tuple[ManifestFile, DataFile]:
    io = load_file_io({}, str(tmp_path))
    path = str(tmp_path / "deletes-m0.avro")
    dv = DataFile.from_args(
        _table_format_version=3,
        content=DataFileContent.POSITION_DELETES,
        file_path=str(tmp_path / "dv.puffin"),
        file_format=FileFormat.PUFFIN,
        partition=Record(),
        record_count=3,
        file_size_in_bytes=120,
        referenced_data_file=str(tmp_path / "data.parquet"),
        content_offset=4,
        content_size_in_bytes=44,
    )
    entry = ManifestEntry.from_args(
        _table_format_version=3, status=ManifestEntryStatus.ADDED, snapshot_id=7, data_file=dv
    )
    schema = MANIFEST_ENTRY_SCHEMAS[3]
    with AvroOutputFile[ManifestEntry](
        io.new_output(path), schema, "manifest_entry", metadata={"format-version": "3", "content": "deletes"}
    ) as writer:
        writer.write_block([entry])
    manifest = ManifestFile.from_args(
        manifest_path=path,
        manifest_length=len(io.new_input(path)),
        partition_spec_id=0,
        content=ManifestContent.DELETES,
        sequence_number=1,
        min_sequence_number=1,
        added_snapshot_id=7,
    )
    return manifest, dv


def test_v3_manifests_are_read_with_their_deletion_vector_fields(tmp_path):
    manifest, dv = _write_v3_manifest(tmp_path)
    io = load_file_io({}, str(tmp_path))
    (entry,) = manifest_entries(io, manifest, 3)
    assert entry.status == ManifestEntryStatus.ADDED and entry.snapshot_id == 7
    data_file = entry.data_file
    assert (
        data_file.content == DataFileContent.POSITION_DELETES and data_file.file_format == FileFormat.PUFFIN
    )
    assert (data_file.file_path, data_file.record_count) == (dv.file_path, 3)
    assert v3_field(data_file, "referenced_data_file") == str(tmp_path / "data.parquet")
    assert (v3_field(data_file, "content_offset"), v3_field(data_file, "content_size_in_bytes")) == (4, 44)
    # pyiceberg's own reader loses them (the v2 schema): the reason this reader exists
    (theirs,) = manifest.fetch_manifest_entry(io)
    assert v3_field(theirs.data_file, "content_offset") is None
    # a v2 table's manifest read the v2 way has no v3 fields at all
    (v2_entry,) = manifest_entries(io, manifest, 2)
    assert all(v3_field(v2_entry.data_file, name) is None for name in V3_FIELDS)


# ----------------------------------------------------------------------------- file io


def test_file_arguments_are_the_ones_pyiceberg_builds_its_files_with(tmp_path):
    assert {"location", "path", "fs", "buffer_size"} <= set(_parameters(PyArrowFile.__init__))
    for properties, location in (
        ({}, str(tmp_path / "f.parquet")),
        ({}, f"file://{tmp_path}/g.parquet"),
        ({"s3.region": "us-east-1", "buffer-size": "65536"}, "s3://bucket/key/h.parquet"),
    ):
        io = PyArrowFileIO(properties)
        theirs = io.new_input(location)
        ours = pyarrow_file_arguments(io, location)
        assert ours["location"] == theirs.location
        assert ours["path"] == theirs._path
        assert ours["fs"] is theirs._filesystem  # the same cached filesystem
        assert ours["buffer_size"] == theirs._buffer_size


def test_pyiceberg_instantiates_the_s3_retry_strategy_without_arguments():
    strategy = _import_retry_strategy(ONE_ATTEMPT_S3_RETRY_STRATEGY_IMPL)
    assert isinstance(strategy, OneAttemptS3RetryStrategy)


# ----------------------------------------------------------------------------- data files from footers


def test_statistics_functions_take_the_arguments_the_door_passes():
    wanted = {"parquet_metadata", "stats_columns", "parquet_column_mapping"}
    assert wanted <= set(_parameters(data_file_statistics_from_parquet_metadata))
    assert _parameters(compute_statistics_plan)[:2] == ["schema", "table_properties"]
    assert _parameters(parquet_path_to_id_mapping) == ["schema"]


def test_a_data_file_from_its_footer_equals_the_one_pyiceberg_writes(catalog):
    """The entry built from a footer is the entry pyiceberg's own append recorded for the same file."""
    catalog.create_namespace_if_not_exists("db")
    table = catalog.create_table(
        "db.stats",
        Schema(
            NestedField(1, "id", LongType(), required=True),
            NestedField(2, "name", StringType()),
            NestedField(3, "score", DoubleType()),
        ),
    )
    table.append(
        pa.table(
            {
                "id": pa.array([3, 1, 2], pa.int64()),
                "name": ["c", None, "a" * 40],
                "score": [1.5, float("nan"), None],
            },
            schema=table.schema().as_arrow(),
        )
    )
    (task,) = table.scan().plan_files()
    theirs = task.file
    with table.io.new_input(theirs.file_path).open() as stream:
        metadata = pq.read_metadata(stream)
    ours = data_file_from_footer(
        theirs.file_path,
        metadata,
        pyarrow_to_schema(metadata.schema.to_arrow_schema()),
        table.metadata,
        len(table.io.new_input(theirs.file_path)),
    )
    assert ours.spec_id == theirs.spec_id == table.metadata.default_spec_id
    # the door sets spec_id as an attribute because from_args ignores it as an argument
    assert getattr(DataFile.from_args(file_path="x", spec_id=7), "spec_id", None) != 7
    # the statistics the door computes are the writer's (every field, every type: test_sink_datafiles.py)
    assert _statistics(ours) == _statistics(theirs)


_STATISTICS = "record_count file_size_in_bytes value_counts null_value_counts nan_value_counts lower_bounds upper_bounds"


def _statistics(data_file: DataFile) -> tuple:
    return tuple(getattr(data_file, name) for name in [*_STATISTICS.split(), "split_offsets", "partition"])

"""The bad-input catalogue: each bad input fails with an error naming the thing and the fix, and loses nothing.

Every case runs the real pipeline in process (SQLite catalog, real pyiceberg
snapshots, file:// or moto S3 shuffle) and checks three things:

* the error: its type, and that the message names what is wrong (the column,
  snapshot, object key, config key...) and how to get out of it;
* nothing lost: the sink's snapshot list, rows and watermark are the same
  before and after the failed run, and no shuffle object is left behind;
* recovery: after the input is fixed (or the documented way out is taken), a
  good run processes the snapshot exactly once -- one sink commit carrying its
  marker, rows that satisfy the replay invariant, and nothing pending after.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pyarrow as pa
import pytest
import yaml
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

from cdc_devtools.cow import cow_merge
from cdc_devtools.inline_pipeline import SINK, SOURCE, InlinePipeline
from cdc_devtools.local_s3 import LocalS3Server
from cdc_devtools.oracle import expected_changes, row_key
from cdc_devtools.replay import assert_replay, changes_of
from iceberg_cdc.config import load_config
from iceberg_cdc.errors import (
    AmbiguousUpdateError,
    ConfigError,
    CorruptDeleteFileError,
    CorruptShuffleError,
    SinkSchemaError,
    SourceFileMissingError,
    SourceHistoryError,
    StorageError,
    UnsupportedSnapshotError,
    is_final,
)
from iceberg_cdc.pipeline import executor_tasks
from iceberg_cdc.pipeline.plan import SnapshotPlan
from iceberg_cdc.run import steps
from iceberg_cdc.shuffle.layout import data_key, index_key
from iceberg_cdc.shuffle.reader import read_index
from iceberg_cdc.sink.schema import sink_schema_for
from iceberg_cdc.sink.table import (
    SOURCE_SNAPSHOT_ID_KEY,
    SOURCE_TABLE_KEY,
    read_watermark,
    summary_properties,
)
from iceberg_cdc.watermark import Watermark
from tests.support.auth_s3 import auth_s3_server
from tests.support.iceberg_tables import (
    add_deletion_vector,
    add_equality_deletes,
    add_orc_position_deletes,
    add_position_deletes,
    cow_rewrite,
    live_files,
)

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "status", StringType(), required=False),
    identifier_field_ids=[1],
)
NAMES = ["id", "status"]
SECRET = "TOPSECRET-9f2c7e1a-do-not-log"


def rows(ids: Sequence[int], status: str = "new") -> pa.Table:
    ids = list(ids)
    return pa.Table.from_pydict({"id": ids, "status": [status] * len(ids)}, schema=SCHEMA.as_arrow())


# -- what "nothing lost" and "exactly once" mean -----------------------------------------------------


@dataclass(frozen=True)
class SinkState:
    """Everything a failed run must leave as it was: sink history, rows and watermark.

    A sink that does not exist and one that detect created empty (no snapshot,
    no watermark) are the same state: nothing was written and nothing is lost.
    """

    snapshots: tuple[int, ...] = ()
    rows: tuple[tuple[Any, int], ...] = ()
    watermark: Watermark | None = None


def sink_state(pipeline: InlinePipeline) -> SinkState:
    if not pipeline.catalog.table_exists(SINK):
        return SinkState()
    sink = pipeline.sink
    table = sink.scan().to_arrow()
    counted = Counter(row_key(r, table.column_names) for r in table.to_pylist())
    return SinkState(
        snapshots=tuple(s.snapshot_id for s in sink.snapshots()),
        rows=tuple(sorted(counted.items(), key=repr)),
        watermark=read_watermark(sink, SOURCE),
    )


def shuffle_leftovers(pipeline: InlinePipeline) -> list[str]:
    """Shuffle objects other than leases and the base tags' record (a failed run's cleanup must remove them)."""
    from tests.support.bookkeeping import is_bookkeeping

    store = steps.Context.of(pipeline.config, SOURCE).runtime.store()
    return sorted(info.key for info in store.list("") if not is_bookkeeping(info.key))


def fails_cleanly(
    pipeline: InlinePipeline, error: type[Exception], run: Callable[[], Any] | None = None
) -> str:
    """Run once, expect ``error``; check the sink and the shuffle store are as before. Returns the message."""
    before = sink_state(pipeline)
    with pytest.raises(error) as raised:
        (run or pipeline.run)()
    assert sink_state(pipeline) == before, "a failed run changed the sink"
    assert shuffle_leftovers(pipeline) == [], "a failed run left shuffle objects behind"
    message = str(raised.value)
    assert SECRET not in message
    return message


def commits_of(pipeline: InlinePipeline, snapshot_id: int) -> list[int]:
    """Sink snapshots whose marker names ``snapshot_id`` of the source."""
    sink = pipeline.sink
    return [
        s.snapshot_id
        for s in sink.snapshots()
        if summary_properties(s).get(SOURCE_TABLE_KEY) == SOURCE
        and summary_properties(s).get(SOURCE_SNAPSHOT_ID_KEY) == str(snapshot_id)
    ]


def processed_once(
    pipeline: InlinePipeline, snapshot_id: int, ids: Sequence[str] | None = ("id",)
) -> Counter:
    """The snapshot is in the sink exactly once, correct, and the pipeline has nothing left to do."""
    counts = assert_replay(pipeline.source, pipeline.sink, snapshot_id, list(ids) if ids else None)
    assert len(commits_of(pipeline, snapshot_id)) == (1 if counts else 0)
    mark = pipeline.watermark()
    assert mark is not None and mark.snapshot_id == pipeline.source.current_snapshot().snapshot_id
    assert pipeline.run().action == "caught_up"
    return counts


def started(pipeline: InlinePipeline, n: int = 20) -> int:
    """A source with ``n`` rows, processed: returns the first snapshot id."""
    source = pipeline.create_source(SCHEMA)
    source.append(rows(range(n)))
    first = source.current_snapshot().snapshot_id
    assert [r.action for r in pipeline.catch_up()] == ["insert"]
    return first


# -- 1. identifier columns that do not exist ---------------------------------------------------------


def test_identifier_column_that_does_not_exist(tmp_path):
    good = InlinePipeline(tmp_path, table={"identifier_columns": ["id"]})
    started(good)
    merge = cow_merge(good.source, upserts=rows([1, 2], "shipped"), delete_keys=[5])
    bad = InlinePipeline(tmp_path, table={"identifier_columns": ["nope"]})
    message = fails_cleanly(bad, ConfigError)
    assert "'nope'" in message and SOURCE in message and "tables[].identifier_columns" in message
    assert "'id'" in message and "'status'" in message  # the columns that do exist
    assert good.run().action == "shuffle"
    assert processed_once(good, merge) == Counter({"UPDATE_BEFORE": 2, "UPDATE_AFTER": 2, "DELETE": 1})


# -- 2. merge-on-read delete files ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["position", "equality", "deletion vector"])
def test_merge_on_read_deletes_are_captured(tmp_path, kind):
    pipeline = InlinePipeline(tmp_path)
    started(pipeline)
    source = pipeline.source
    if kind == "position":
        deleted, _ = add_position_deletes(source, live_files(source)[0].file_path, [0, 3])
    elif kind == "deletion vector":
        _, deleted, _ = add_deletion_vector(source, live_files(source)[0].file_path, [0, 3])
    else:
        deleted, _ = add_equality_deletes(source, [0, 3, 999])  # 999: a key the table never had
    assert [r.snapshot_id for r in pipeline.catch_up()] == [deleted]
    assert processed_once(pipeline, deleted) == Counter({"DELETE": 2})
    removed = changes_of(pipeline.sink, deleted)
    assert sorted(removed.column("id").to_pylist()) == [0, 3]
    assert set(removed.column("status").to_pylist()) == {"new"}  # full row images


def test_orc_delete_files_fail_until_the_change_is_redone(tmp_path):
    pipeline = InlinePipeline(tmp_path)
    first = started(pipeline)
    source = pipeline.source
    bad, orc_path = add_orc_position_deletes(source, live_files(source)[0])
    message = fails_cleanly(pipeline, UnsupportedSnapshotError)
    assert str(bad) in message and orc_path in message and "ORC" in message
    assert f"rollback_to_snapshot({first})" in message and "compact" in message
    # The way out the message gives: roll back, and make the same change again.
    pipeline.source.manage_snapshots().rollback_to_snapshot(first).commit()
    redo = cow_merge(pipeline.source, delete_keys=[0, 3])
    assert [r.snapshot_id for r in pipeline.catch_up()] == [redo]
    assert processed_once(pipeline, redo) == Counter({"DELETE": 2})
    assert not commits_of(pipeline, bad)


def test_a_damaged_deletion_vector_fails_naming_it_until_restored(tmp_path):
    pipeline = InlinePipeline(tmp_path)
    started(pipeline)
    source = pipeline.source
    _, deleted, puffin_path = add_deletion_vector(source, live_files(source)[0].file_path, [0, 3])
    local = Path(puffin_path.removeprefix("file://"))
    intact = local.read_bytes()
    damaged = bytearray(intact)
    damaged[12] ^= 0xFF  # inside the only blob, which starts after the 4-byte magic
    local.write_bytes(bytes(damaged))
    message = fails_cleanly(pipeline, CorruptDeleteFileError)
    assert puffin_path in message and "blob at byte 4" in message and "CRC" in message
    assert "nothing was committed" in message and "roll the table back" in message
    local.write_bytes(intact)
    assert [r.snapshot_id for r in pipeline.catch_up()] == [deleted]
    assert processed_once(pipeline, deleted) == Counter({"DELETE": 2})


@pytest.mark.parametrize("which", ["added", "removed"])
def test_a_missing_source_data_file_names_the_file_and_the_fix(tmp_path, which):
    """An added file, or a removed file the MERGE's DELETE rows are read from, gone from storage."""
    pipeline = InlinePipeline(tmp_path)
    started(pipeline)
    before = {f.file_path for f in live_files(pipeline.source)}
    merge = cow_merge(pipeline.source, upserts=rows([1, 2], "shipped"), delete_keys=[5])
    after = {f.file_path for f in live_files(pipeline.source)}
    [path] = sorted(after - before) if which == "added" else sorted(before - after)
    local = Path(path.removeprefix("file://"))
    kept = local.read_bytes()
    local.unlink()
    message = fails_cleanly(pipeline, SourceFileMissingError)
    assert path in message and SOURCE in message
    assert f"restore the file, or roll the source back past snapshot {merge}" in message.lower()
    assert is_final(SourceFileMissingError(message))  # no retry: it cannot bring the file back
    local.write_bytes(kept)  # the fix the message names
    assert [r.snapshot_id for r in pipeline.catch_up()] == [merge]
    assert processed_once(pipeline, merge) == Counter({"UPDATE_BEFORE": 2, "UPDATE_AFTER": 2, "DELETE": 1})


def test_initial_load_over_live_delete_files_loads_the_live_rows(tmp_path):
    pipeline = InlinePipeline(tmp_path, table={"start": "latest"})
    source = pipeline.create_source(SCHEMA)
    source.append(rows(range(10)))
    loaded, _ = add_position_deletes(source, live_files(source)[0].file_path, [1])
    assert [r.snapshot_id for r in pipeline.catch_up()] == [loaded]
    sink_rows = changes_of(pipeline.sink, loaded)
    assert sorted(sink_rows.column("id").to_pylist()) == [i for i in range(10) if i != 1]
    assert set(sink_rows.column("_change_type").to_pylist()) == {"INSERT"}
    assert len(commits_of(pipeline, loaded)) == 1 and pipeline.run().action == "caught_up"


# -- 3. expired snapshots ---------------------------------------------------------------------------


@pytest.mark.parametrize("expire", ["next", "watermark_and_next"])
def test_expired_history_after_the_watermark(tmp_path, expire):
    """With on_history_gap: fail (and no base tag, so the watermark's snapshot can go too): the error."""
    pipeline = InlinePipeline(tmp_path, table={"on_history_gap": "fail", "protect_base": False})
    first = started(pipeline)
    second = cow_merge(pipeline.source, upserts=rows([1], "shipped"))
    third = cow_merge(pipeline.source, upserts=rows([2], "shipped"), delete_keys=[3])
    gone = [second] if expire == "next" else [first, second]
    pipeline.source.maintenance.expire_snapshots().by_ids(gone).commit()
    message = fails_cleanly(pipeline, SourceHistoryError)
    assert "expired" in message and str(first) in message and SOURCE in message
    assert str(third) in message  # the oldest snapshot still there
    assert "start: latest" in message and "drop the sink" in message
    # The way out: a new sink that starts from the current state.
    pipeline.catalog.drop_table(SINK)
    restarted = InlinePipeline(tmp_path, table={"start": "latest"})
    assert [(r.action, r.snapshot_id) for r in restarted.catch_up()] == [("insert", third)]
    loaded = changes_of(restarted.sink, third)
    assert Counter(row_key(r, NAMES) for r in loaded.select(NAMES).to_pylist()) == Counter(
        row_key(r, NAMES) for r in restarted.source.scan().to_arrow().to_pylist()
    )
    assert len(commits_of(restarted, third)) == 1 and restarted.run().action == "caught_up"


# -- 4. source dropped and recreated ------------------------------------------------------------------


def test_source_dropped_and_recreated(tmp_path):
    pipeline = InlinePipeline(tmp_path)
    started(pipeline)
    old_uuid = str(pipeline.source.metadata.table_uuid)
    pipeline.catalog.drop_table(SOURCE)
    recreated = pipeline.create_source(SCHEMA)
    recreated.append(rows(range(100, 105)))
    new_first = recreated.current_snapshot().snapshot_id
    message = fails_cleanly(pipeline, SourceHistoryError)
    assert old_uuid in message and str(recreated.metadata.table_uuid) in message and SOURCE in message
    assert "dropped and recreated" in message and "drop the sink" in message
    pipeline.catalog.drop_table(SINK)
    assert [r.snapshot_id for r in pipeline.catch_up()] == [new_first]
    assert processed_once(pipeline, new_first) == Counter({"INSERT": 5})


# -- 5. duplicate keys ------------------------------------------------------------------------------


def expected_unpaired(deleted: pa.Table, inserted: pa.Table, ids: Sequence[str]) -> Counter:
    """The oracle's semantics with ``emit_unpaired``: ambiguous keys become plain DELETE/INSERT rows."""
    whole_rows = expected_changes(deleted.to_pylist(), inserted.to_pylist(), NAMES, None)
    by_key: dict[tuple, Counter] = defaultdict(Counter)
    positions = [NAMES.index(i) for i in ids]
    for (row, change), n in whole_rows.items():
        by_key[tuple(row[p] for p in positions)][(row, change)] += n
    out: Counter = Counter()
    for changes in by_key.values():
        kinds: Counter = Counter()
        for (_, change), n in changes.items():
            kinds[change] += n
        if kinds["DELETE"] <= 1 and kinds["INSERT"] <= 1:
            # frozen rows of longs and strings are the plain values, so they rebuild the row dicts
            removed = [r for (r, c) in changes if c == "DELETE"]
            added = [r for (r, c) in changes if c == "INSERT"]
            out += expected_changes(
                [dict(zip(NAMES, r, strict=True)) for r in removed],
                [dict(zip(NAMES, r, strict=True)) for r in added],
                NAMES,
                ids,
            )
        else:
            out += changes
    return out


def test_duplicate_keys_fail_naming_the_key_then_emit_unpaired(tmp_path):
    pipeline = InlinePipeline(tmp_path)
    started(pipeline, 10)
    source = pipeline.source
    before = source.scan().to_arrow()
    after = pa.concat_tables(
        [
            rows([i for i in range(10) if i not in (3, 4)]),
            rows([3], "a"),
            rows([3], "b"),
            rows([4], "shipped"),
        ]
    )
    duplicate = cow_rewrite(source, live_files(source), after)
    message = fails_cleanly(pipeline, AmbiguousUpdateError)
    assert "id=3" in message and "duplicate_keys: emit_unpaired" in message
    unpaired = InlinePipeline(tmp_path, table={"duplicate_keys": "emit_unpaired"})
    assert [r.snapshot_id for r in unpaired.catch_up()] == [duplicate]
    changes = changes_of(unpaired.sink, duplicate)
    actual = Counter((row_key(r, NAMES), r["_change_type"]) for r in changes.to_pylist())
    assert actual == expected_unpaired(before, after, ["id"])
    assert actual[((3, "a"), "INSERT")] == actual[((3, "b"), "INSERT")] == 1
    assert actual[((3, "new"), "DELETE")] == 1 and actual[((4, "shipped"), "UPDATE_AFTER")] == 1
    counts = processed_once(unpaired, duplicate, ids=None)
    assert counts == Counter({"DELETE": 1, "INSERT": 2, "UPDATE_BEFORE": 1, "UPDATE_AFTER": 1})


# -- 6. a sink whose schema conflicts ---------------------------------------------------------------


def test_sink_with_a_conflicting_column_type(tmp_path):
    pipeline = InlinePipeline(tmp_path)
    source = pipeline.create_source(SCHEMA)
    source.append(rows(range(5)))
    first = source.current_snapshot().snapshot_id
    clash = Schema(NestedField(1, "id", StringType(), required=False), NestedField(2, "status", StringType()))
    pipeline.catalog.create_table(SINK, schema=sink_schema_for(clash))
    message = fails_cleanly(pipeline, SinkSchemaError)
    assert SINK in message and "'id'" in message and "string" in message and "long" in message
    assert "RENAME COLUMN" in message
    assert pipeline.sink.schema().find_field("id").field_type == StringType()  # nothing changed
    with pipeline.sink.update_schema() as update:
        update.rename_column("id", "id_old")
    assert [r.snapshot_id for r in pipeline.catch_up()] == [first]
    assert pipeline.sink.schema().find_field("id").field_type == LongType()
    assert processed_once(pipeline, first) == Counter({"INSERT": 5})


def test_sink_that_is_not_a_change_table(tmp_path):
    pipeline = InlinePipeline(tmp_path)
    source = pipeline.create_source(SCHEMA)
    source.append(rows(range(5)))
    first = source.current_snapshot().snapshot_id
    foreign = pipeline.catalog.create_table(SINK, schema=SCHEMA)
    foreign.append(rows([42], "someone else's row"))
    message = fails_cleanly(pipeline, SinkSchemaError)
    assert SINK in message and "'_change_type'" in message and "tables[].sink" in message
    assert pipeline.catalog.load_table(SINK).scan().to_arrow().num_rows == 1
    pipeline.catalog.rename_table(SINK, "shop.orders_copy")
    assert [r.snapshot_id for r in pipeline.catch_up()] == [first]
    assert processed_once(pipeline, first) == Counter({"INSERT": 5})
    assert pipeline.catalog.load_table("shop.orders_copy").scan().to_arrow().num_rows == 1


# -- 7. damaged shuffle objects and S3 errors ---------------------------------------------------------


def run_with_damage(pipeline: InlinePipeline, damage: Callable[[steps.Context, SnapshotPlan], None]) -> None:
    """One DAG run, step by step in the DAG's order, with ``damage`` between the write and read phases."""
    ctx = steps.Context.of(pipeline.config, SOURCE)
    run_id = f"damaged__{uuid.uuid4().hex[:8]}"
    detected = steps.detect(ctx, run_id)
    assert detected.action == "shuffle"
    try:
        store = ctx.runtime.store()
        plan = SnapshotPlan.load(store, detected.plan)
        for task in plan.write_tasks:
            executor_tasks.run_write_task(plan, ctx.runtime, task.task_id)
        assert steps.missing_map_outputs(ctx, detected) == ([], {})  # the barrier passes
        damage(ctx, plan)
        steps.coalesce(ctx, detected)
        ranges = json.loads(store.get(plan.paths.ranges))["ranges"]
        for read_range in ranges:
            executor_tasks.run_read_task(plan, ctx.runtime, read_range)
        steps.commit(ctx, detected)
        steps.watermark(ctx, detected)
    finally:
        steps.cleanup(ctx, detected, run_id)


def _biggest_output(ctx: steps.Context, plan: SnapshotPlan) -> str:
    store = ctx.runtime.store()
    paths = plan.paths
    sizes = {paths.map_output(t.task_id): 0 for t in plan.write_tasks}
    for info in store.list(paths.map_prefix):
        name = info.key.removesuffix(".data")
        if name in sizes:
            sizes[name] = info.size
    return max(sizes, key=lambda name: sizes[name])


def flip_data_bytes(ctx: steps.Context, plan: SnapshotPlan) -> str:
    """Flip bytes in the middle of the first non-empty partition's first block (after its header)."""
    store = ctx.runtime.store()
    name = _biggest_output(ctx, plan)
    index = read_index(store, name, plan.partitions)
    sizes = index.partition_sizes()
    p = next(i for i, size in enumerate(sizes) if size > 16)
    data = bytearray(store.get(data_key(name)))
    middle = int(index.offsets[p]) + 8 + (int(sizes[p]) - 8) // 2
    for at in range(middle, middle + 4):
        data[at] ^= 0xFF
    store.put(data_key(name), bytes(data))
    return data_key(name)


def truncate_index(ctx: steps.Context, plan: SnapshotPlan) -> str:
    store = ctx.runtime.store()
    name = _biggest_output(ctx, plan)
    store.put(index_key(name), store.get(index_key(name))[:-5])
    return index_key(name)


def delete_data(ctx: steps.Context, plan: SnapshotPlan) -> str:
    store = ctx.runtime.store()
    name = _biggest_output(ctx, plan)
    store.delete_prefix(data_key(name))
    return data_key(name)


def truncate_data(ctx: steps.Context, plan: SnapshotPlan) -> str:
    store = ctx.runtime.store()
    name = _biggest_output(ctx, plan)
    store.put(data_key(name), store.get(data_key(name))[:-7])
    return data_key(name)


@pytest.fixture
def s3_pipeline(tmp_path, s3_bucket, s3_properties) -> InlinePipeline:
    """Catalog and warehouse on local files; the shuffle on the moto S3 server."""
    return InlinePipeline(
        tmp_path,
        shuffle={"uri": f"s3://{s3_bucket}/shuffle", **s3_properties, "partitions": 16},
    )


@pytest.mark.parametrize(
    ("damage", "error", "says"),
    [
        (flip_data_bytes, CorruptShuffleError, "partition"),
        (truncate_index, CorruptShuffleError, "truncated"),
        (delete_data, StorageError, "does not exist"),
        (truncate_data, CorruptShuffleError, "truncated"),
    ],
    ids=["flipped-data", "truncated-index", "deleted-data", "truncated-data"],
)
def test_damaged_shuffle_objects_fail_and_a_retry_processes_once(s3_pipeline, s3_bucket, damage, error, says):
    pipeline = s3_pipeline
    started(pipeline, 200)
    merge = cow_merge(
        pipeline.source,
        upserts=pa.concat_tables([rows(range(0, 40), "shipped"), rows([900])]),
        delete_keys=[50],
    )
    damaged: list[str] = []
    message = fails_cleanly(
        pipeline, error, lambda: run_with_damage(pipeline, lambda c, p: damaged.append(damage(c, p)))
    )
    full_uri = f"s3://{s3_bucket}/shuffle/{damaged[0]}"
    assert full_uri in message or (
        f"shuffle store s3://{s3_bucket}/shuffle" in message and damaged[0] in message
    )
    assert says in message
    assert "Nothing was committed" in message and "retrying the DAG run" in message
    assert pipeline.run().action == "shuffle"
    assert processed_once(pipeline, merge) == Counter(
        {"UPDATE_BEFORE": 40, "UPDATE_AFTER": 40, "DELETE": 1, "INSERT": 1}
    )


def test_shuffle_bucket_that_does_not_exist(tmp_path, s3_properties, s3_client):
    bucket = f"cdc-missing-{uuid.uuid4().hex[:12]}"
    properties = {**s3_properties, "s3.secret-access-key": SECRET}  # the shared server checks no credentials
    pipeline = InlinePipeline(tmp_path, shuffle={"uri": f"s3://{bucket}/shuffle", **properties})
    source = pipeline.create_source(SCHEMA)
    source.append(rows(range(5)))
    first = source.current_snapshot().snapshot_id
    before = sink_state(pipeline)
    with pytest.raises(StorageError) as raised:
        pipeline.run()
    message = str(raised.value)
    assert bucket in message and "does not exist" in message and "shuffle.uri" in message
    assert SECRET not in message
    assert sink_state(pipeline) == before
    s3_client.create_bucket(Bucket=bucket)
    assert [r.snapshot_id for r in pipeline.catch_up()] == [first]
    assert processed_once(pipeline, first) == Counter({"INSERT": 5})


@pytest.fixture(scope="module")
def auth_s3(tmp_path_factory, _no_real_aws) -> Iterator[tuple[LocalS3Server, dict[str, str]]]:
    """A moto server of our own that checks credentials (tests.support.auth_s3)."""
    with auth_s3_server(tmp_path_factory.mktemp("moto-auth")) as (server, good):
        yield server, good


def test_wrong_s3_credentials(tmp_path, auth_s3):
    server, good = auth_s3
    bucket = f"cdc-auth-{uuid.uuid4().hex[:12]}"
    boto3.client(
        "s3",
        endpoint_url=server.endpoint,
        region_name="us-east-1",
        aws_access_key_id=good["s3.access-key-id"],
        aws_secret_access_key=good["s3.secret-access-key"],
    ).create_bucket(Bucket=bucket)
    wrong = {**good, "s3.access-key-id": "AKIAWRONGWRONGWRONG", "s3.secret-access-key": SECRET}
    pipeline = InlinePipeline(tmp_path, shuffle={"uri": f"s3://{bucket}/shuffle", **wrong})
    source = pipeline.create_source(SCHEMA)
    source.append(rows(range(5)))
    first = source.current_snapshot().snapshot_id
    before = sink_state(pipeline)
    with pytest.raises(StorageError) as raised:
        pipeline.run()
    message = str(raised.value)
    assert SECRET not in message and "AKIAWRONG" not in message
    assert bucket in message and "access denied" in message and "s3.secret-access-key" in message
    assert sink_state(pipeline) == before
    fixed = InlinePipeline(tmp_path, shuffle={"uri": f"s3://{bucket}/shuffle", **good})
    assert shuffle_leftovers(fixed) == []  # not even a lease was written
    assert [r.snapshot_id for r in fixed.catch_up()] == [first]
    assert processed_once(fixed, first) == Counter({"INSERT": 5})


# -- 8. config files ----------------------------------------------------------------------------------


def good_config(tmp_path: Path) -> dict[str, Any]:
    return {
        "catalog": {
            "name": "demo",
            "type": "sql",
            "uri": f"sqlite:///{tmp_path / 'never' / 'catalog.db'}",
            "warehouse": f"file://{tmp_path / 'never' / 'wh'}",
            "s3.access-key-id": "AKIAEXAMPLE",
            "s3.secret-access-key": SECRET,
        },
        "shuffle": {
            "uri": f"file://{tmp_path / 'never' / 'shuffle'}",
            "partitions": 8,
            "target_partition_size": "1MB",
        },
        "tables": [{"source": "shop.orders", "sink": "shop.orders_changes", "identifier_columns": ["id"]}],
    }


BAD_CONFIGS: dict[str, tuple[Callable[[dict[str, Any]], Any], list[str]]] = {
    "unknown top-level key": (lambda c: c.update(shufle={"uri": "s3://b/p"}), ["shufle: unknown key"]),
    "misplaced secret": (
        lambda c: c.update({"s3.secret-access-key": SECRET}),
        ["s3.secret-access-key: unknown key"],
    ),
    "unknown table key": (
        lambda c: c["tables"][0].update(identifer_columns=["id"]),
        ["tables[0].identifer_columns: unknown key"],
    ),
    "zero partitions": (
        lambda c: c["shuffle"].update(partitions=0),
        ["shuffle.partitions", "greater than or equal to 1"],
    ),
    "size that is not a size": (
        lambda c: c["shuffle"].update(target_partition_size="lots"),
        ["shuffle.target_partition_size", "'lots' is not a size", "64MiB"],
    ),
    "bad shuffle uri": (
        lambda c: c["shuffle"].update(uri="http://bucket/x"),
        ["shuffle.uri", "s3://bucket/prefix"],
    ),
    "missing environment variable": (
        lambda c: c["catalog"].update({"s3.session-token": "${CDC_BAD_INPUT_UNSET_VAR}"}),
        ["catalog.s3.session-token", "CDC_BAD_INPUT_UNSET_VAR", "not set"],
    ),
    "bad table identifier": (
        lambda c: c["tables"][0].update(sink="orders_changes"),
        ["tables[0].sink", "namespace.table"],
    ),
    "bad start": (
        lambda c: c["tables"][0].update(start="yesterday"),
        ["tables[0].start", "'earliest' or 'latest'"],
    ),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_bad_config_file_names_the_key_and_the_file(tmp_path, monkeypatch, case):
    monkeypatch.delenv("CDC_BAD_INPUT_UNSET_VAR", raising=False)
    mutate, expected = BAD_CONFIGS[case]
    raw = good_config(tmp_path)
    mutate(raw)
    path = tmp_path / "cdc.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    message = str(raised.value)
    assert str(path) in message
    for text in expected:
        assert text in message, f"{text!r} not in {message!r}"
    assert SECRET not in message
    assert not (tmp_path / "never").exists()  # nothing ran


def test_invalid_yaml_does_not_echo_the_secret(tmp_path):
    path = tmp_path / "cdc.yaml"
    text = yaml.safe_dump(good_config(tmp_path)).replace(
        f"s3.secret-access-key: {SECRET}", f"s3.secret-access-key: {SECRET}: ["
    )
    assert SECRET in text
    path.write_text(text)
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    message = str(raised.value)
    assert str(path) in message and "not valid YAML" in message and "line" in message
    assert SECRET not in message


# -- 9. manual runs of snapshots that cannot be processed --------------------------------------------


def test_manual_run_of_a_snapshot_outside_the_current_history(tmp_path):
    pipeline = InlinePipeline(tmp_path)
    first = started(pipeline)
    rolled_back = cow_merge(pipeline.source, upserts=rows([1], "lost"))
    pipeline.source.manage_snapshots().rollback_to_snapshot(first).commit()
    kept = cow_merge(pipeline.source, upserts=rows([2], "kept"))
    message = fails_cleanly(pipeline, SourceHistoryError, lambda: pipeline.run(snapshot_id=rolled_back))
    assert str(rolled_back) in message and "rolled back" in message and str(kept) in message
    message = fails_cleanly(pipeline, SourceHistoryError, lambda: pipeline.run(snapshot_id=12345))
    assert "12345" in message and "does not exist" in message and SOURCE in message
    # A valid manual run replaces that snapshot's rows; nothing doubles.
    inserted = changes_of(pipeline.sink, first).num_rows
    assert pipeline.run(snapshot_id=first).action == "insert"
    assert changes_of(pipeline.sink, first).num_rows == inserted == 20
    assert assert_replay(pipeline.source, pipeline.sink, first, ["id"]) == Counter({"INSERT": 20})
    assert [r.snapshot_id for r in pipeline.catch_up()] == [kept]
    assert processed_once(pipeline, kept) == Counter({"UPDATE_BEFORE": 1, "UPDATE_AFTER": 1})
    assert not commits_of(pipeline, rolled_back)


def test_manual_run_that_would_skip_pending_snapshots(tmp_path):
    pipeline = InlinePipeline(tmp_path)
    started(pipeline)
    pending = cow_merge(pipeline.source, upserts=rows([1], "x"))
    later = cow_merge(pipeline.source, upserts=rows([2], "y"), delete_keys=[3])
    message = fails_cleanly(pipeline, SourceHistoryError, lambda: pipeline.run(snapshot_id=later))
    assert str(later) in message and str(pending) in message and "without snapshot_id" in message
    # The next pending snapshot itself may be run by hand; then the rest in order, each once.
    assert pipeline.run(snapshot_id=pending).action == "shuffle"
    assert [r.snapshot_id for r in pipeline.catch_up()] == [later]
    assert assert_replay(pipeline.source, pipeline.sink, pending, ["id"]) == Counter(
        {"UPDATE_BEFORE": 1, "UPDATE_AFTER": 1}
    )
    assert len(commits_of(pipeline, pending)) == 1
    assert processed_once(pipeline, later) == Counter({"UPDATE_BEFORE": 1, "UPDATE_AFTER": 1, "DELETE": 1})

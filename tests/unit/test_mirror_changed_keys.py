"""The join's per-process cache of changed keys never serves one apply's keys to another.

A warm Spark worker (a Spark Connect server's Python worker, or a test
process) runs the join units of many applies. The mirror DAG stages the keys
at ``<table>/mirror-<name>/epoch-<n>/join/keys.parquet``: the same key is
written again by a later apply when the lease's epochs start over (a new
shuffle store, a cleaned lease) or by another deployment using the same
layout. A cache keyed by that path alone handed the first apply's keys to the
second, which then deleted the wrong rows of the mirror (found by the Iceberg
mirror's random histories).
"""

from __future__ import annotations

import io
from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from iceberg_cdc.errors import ConservationError
from iceberg_cdc.mirror.iceberg import join
from iceberg_cdc.mirror.iceberg.plan import ApplyPlan
from iceberg_cdc.pipeline.runtime import Runtime

ROOT = "db.orders/mirror-ice/epoch-1/join/"


def _plan(run_id: str, key_count: int, changelog_snapshot_id: int) -> ApplyPlan:
    return ApplyPlan(
        mirror="mirror.orders",
        source="db.orders",
        lease_name="_mirrors/db.orders/ice",
        run_id=run_id,
        epoch=1,
        lease_ttl_seconds=60.0,
        through={"changelog_snapshot_id": changelog_snapshot_id, "source_snapshot_id": 1, "ordinal": 1},
        key_columns=["id"],
        mode="merge-on-read",
        format_version=2,
        base_snapshot_id=None,
        metadata_json="{}",
        location="file:///nowhere",
        staging_dir=f"file:///nowhere/data/_staging/{run_id}",
        key_count=key_count,
        upsert_rows=0,
        delete_rows=0,
        units=[],
        groups=[],
        root=ROOT,
    )


def _put_keys(runtime: Runtime, plan: ApplyPlan, ids: list[int]) -> None:
    sink = io.BytesIO()
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), sink)
    runtime.store().put(plan.paths.keys, sink.getvalue())


@pytest.fixture
def runtime(tmp_path) -> Runtime:
    join._key_cache.clear()
    return Runtime(shuffle_uri=f"file://{tmp_path}/shuffle", shuffle_properties={}, io_properties={})


def test_a_later_apply_at_the_same_path_reads_its_own_keys(runtime: Runtime) -> None:
    first = _plan("scheduled__1", 3, 111)
    _put_keys(runtime, first, [1, 2, 3])
    assert join.changed_keys(first, runtime).column("id").to_pylist() == [1, 2, 3]

    second = _plan("scheduled__2", 2, 222)  # same epoch, same root: the same object key
    assert second.paths.keys == first.paths.keys
    _put_keys(runtime, second, [7, 8])
    assert join.changed_keys(second, runtime).column("id").to_pylist() == [7, 8]


def test_the_same_attempt_reads_the_object_once(runtime: Runtime) -> None:
    plan = _plan("scheduled__1", 2, 111)
    _put_keys(runtime, plan, [4, 5])
    first = join.changed_keys(plan, runtime)
    runtime.store().delete_prefix(plan.paths.keys)
    assert join.changed_keys(plan, runtime) is first


def test_keys_that_do_not_match_the_plan_are_refused(runtime: Runtime) -> None:
    plan = _plan("scheduled__1", 3, 111)
    _put_keys(runtime, replace(plan, run_id="other"), [9])
    with pytest.raises(ConservationError, match="holds 1 changed keys, the apply plan counted 3"):
        join.changed_keys(plan, runtime)

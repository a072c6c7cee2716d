"""The documented net-changes query (docs/operating.md), run as written on a real changelog, against the source's states.

A history of inserts, updates (some moving partition), deletes, re-inserts of
deleted keys, a key inserted and deleted again, and a rewrite that changes
nothing is captured in process; then, for every pair of snapshots (A, B), the
query with the range set to their commit times must give the changes that turn
the source's rows at A into its rows at B -- applied to state(A), exactly
state(B). The SQL is read from the guide itself, so the guide cannot drift.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from itertools import combinations
from pathlib import Path

import duckdb
import pyarrow as pa

from cdc_devtools.cow import cow_merge
from cdc_devtools.inline_pipeline import InlinePipeline
from cdc_devtools.orders import BY_REGION, SCHEMA, rows

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "operating.md"


def documented_query() -> str:
    """The SQL block of the guide's net-changes section, from its ``-- net-changes`` line to the fence."""
    text = GUIDE.read_text()
    match = re.search(r"-- net-changes\n(.*?)\n```", text, re.S)
    assert match, "the net-changes query is missing from docs/operating.md"
    return match.group(1)


def state(table, snapshot_id: int | None) -> dict[int, dict]:
    if snapshot_id is None:
        return {}
    return {r["id"]: r for r in table.scan(snapshot_id=snapshot_id).to_arrow().to_pylist()}


def literal(ms: int) -> str:
    return "TIMESTAMPTZ '" + datetime.fromtimestamp(ms / 1000, UTC).isoformat() + "'"


def net_changes(connection, start_ms: int, end_ms: int) -> list[dict]:
    connection.execute(f"SET VARIABLE range_start = {literal(start_ms)}")
    connection.execute(f"SET VARIABLE range_end = {literal(end_ms)}")
    return connection.execute(documented_query()).fetch_arrow_table().to_pylist()


def test_the_documented_query_turns_any_earlier_state_into_any_later_one(tmp_path):
    pipeline = InlinePipeline(tmp_path)
    source = pipeline.create_source(SCHEMA, partition_spec=BY_REGION)
    steps = [
        lambda: source.append(rows(range(0, 10), "us")),
        lambda: cow_merge(source, upserts=rows([1, 2], ["eu", "us"], "paid")),  # a move and an update
        lambda: cow_merge(source, delete_keys=[3, 4]),
        lambda: source.append(rows([3, 20], "eu", "again")),  # 3 comes back, 20 is new
        lambda: cow_merge(
            source, delete_keys=[20], upserts=rows([1], "us", "paid")
        ),  # 20 gone again; 1 moves back
        lambda: cow_merge(source, upserts=rows([5], "us", "new")),  # rewrites 5 unchanged: no change at all
        lambda: cow_merge(source, upserts=rows([2, 6], "us", "shipped")),
    ]
    for step in steps:
        step()
        time.sleep(0.005)  # distinct commit milliseconds
    pipeline.catch_up()
    snapshots = [s for s in pipeline.source.snapshots()]
    changelog = pipeline.sink.scan().to_arrow()
    assert changelog.schema.field("_commit_timestamp").type == pa.timestamp("us", tz="UTC")

    connection = duckdb.connect()
    connection.register("changelog", changelog)
    points = [(None, snapshots[0].timestamp_ms - 1)] + [(s.snapshot_id, s.timestamp_ms) for s in snapshots]
    checked = 0
    for (first, start_ms), (last, end_ms) in combinations(points, 2):
        rows_now = state(pipeline.source, first)
        for change in net_changes(connection, start_ms, end_ms):
            image = {k: v for k, v in change["row_image"].items() if k in ("id", "region", "status")}
            key = image["id"]
            if change["net_change"] == "DELETE":
                assert rows_now.pop(key) == image, f"deleted {key} was not this row at the start"
            elif change["net_change"] == "INSERT":
                assert key not in rows_now, f"inserted {key} existed at the start"
                rows_now[key] = image
            else:
                assert key in rows_now, f"updated {key} did not exist at the start"
                rows_now[key] = image
        assert rows_now == state(pipeline.source, last), f"net changes from {first} to {last} do not replay"
        checked += 1
    assert checked == len(points) * (len(points) - 1) // 2 >= 28

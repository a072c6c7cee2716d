"""The bench's peer comparison (bench/peer.py): what is compared with the pipeline, and the ratio's way round.

The peer is Iceberg's ``create_changelog_view``; its view carries ``_change_ordinal`` and
``_commit_snapshot_id`` beside the source columns and ``_change_type``. Only the pure parts are
here: the timed comparison is ``python bench/peer.py`` (never a timed test).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pyarrow as pa
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
_spec = importlib.util.spec_from_file_location("bench_peer", BENCH / "peer.py")
assert _spec is not None and _spec.loader is not None
peer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(peer)

COLUMNS = ["id", "status"]


def _pipeline_rows() -> pa.Table:
    return pa.table(
        {
            "id": [1, 1, 2],
            "status": ["new", "paid", "gone"],
            "_change_type": ["UPDATE_BEFORE", "UPDATE_AFTER", "DELETE"],
        }
    )


def _view(change_types: list[str]) -> pa.Table:
    """The rows as Iceberg's view lays them out: its metadata columns after the change type."""
    return pa.table(
        {
            "status": ["gone", "new", "paid"],
            "id": [2, 1, 1],
            "_change_type": change_types,
            "_change_ordinal": [0, 0, 0],
            "_commit_snapshot_id": [7, 7, 7],
        }
    )


def _sorted(table: pa.Table) -> pa.Table:
    return table.sort_by([(name, "ascending") for name in table.column_names])


def test_the_view_compares_on_the_pipelines_columns_without_its_metadata():
    same = peer.view_rows(_view(["DELETE", "UPDATE_BEFORE", "UPDATE_AFTER"]), COLUMNS)
    assert same.column_names == [*COLUMNS, "_change_type"]
    assert _sorted(same).equals(_sorted(_pipeline_rows()))
    # A change type that differs is a difference (the metadata columns are dropped, nothing else).
    swapped = peer.view_rows(_view(["DELETE", "UPDATE_AFTER", "UPDATE_BEFORE"]), COLUMNS)
    assert not _sorted(swapped).equals(_sorted(_pipeline_rows()))


def test_a_view_with_other_columns_than_expected_is_refused():
    with pytest.raises(ValueError, match="_change_type"):
        peer.view_rows(_view(["DELETE"] * 3).drop_columns(["_change_type"]), COLUMNS)
    with pytest.raises(ValueError, match="extra"):
        peer.view_rows(_view(["DELETE"] * 3).append_column("extra", pa.array([1, 2, 3])), COLUMNS)


def test_the_ratio_is_the_median_pipeline_over_the_median_peer_after_the_warm_up():
    figures = {
        "warm_runs": 4,
        "warmup_runs": 1,
        # The warm-up runs (first) are left out; the timed runs' order does not matter.
        "pipeline": [
            {"wall_seconds": 1.0},
            {"wall_seconds": 4.0},
            {"wall_seconds": 3.0},
            {"wall_seconds": 9.0},
        ],
        "peer": [{"seconds": 1.0}, {"seconds": 20.0}, {"seconds": 16.0}, {"seconds": 30.0}],
    }
    assert peer.peer_figures(figures) == {"peer_s": 20.0, "peer_pipeline_s": 4.0, "peer_ratio": 0.2}
    assert peer.peer_line(figures) == (
        "peer: Iceberg create_changelog_view 20.0 s, pipeline (warm) 4.0 s, ratio=0.20"
    )
    assert "1 warm-up + 3 timed runs, the median compared" in peer._runs_told(figures)


def test_results_without_a_warm_up_count_compare_the_last_runs():
    figures = {
        "pipeline": [{"wall_seconds": 30.0}, {"wall_seconds": 2.0}],
        "peer": [{"seconds": 50.0}, {"seconds": 16.0}],
    }
    assert peer.peer_figures(figures) == {"peer_s": 16.0, "peer_pipeline_s": 2.0, "peer_ratio": 0.125}
    assert peer.peer_line(figures) == (
        "peer: Iceberg create_changelog_view 16.0 s, pipeline (warm) 2.0 s, ratio=0.12"
    )


def test_the_peer_is_timed_on_its_call_and_write_not_the_count_after():
    answer = [{"ok": True, "seconds": 0.5}, {"rows": 9, "write_seconds": 3.0, "seconds": 3.4}]
    assert peer.peer_seconds(answer) == 3.5


def test_the_call_takes_the_one_snapshot_with_updates_by_identifier():
    call = peer.changelog_call("bench", "bench.orders_java", 11, 22, "v")
    assert call.startswith("CALL bench.system.create_changelog_view(table => 'bench.bench.orders_java', ")
    # start-snapshot-id is exclusive in Iceberg: the parent's id yields the snapshot's changes alone.
    assert "map('start-snapshot-id', '11', 'end-snapshot-id', '22')" in call
    assert "compute_updates => true" in call and "identifier_columns => array('id')" in call


def test_the_summary_names_the_servers_jvm_options_when_recorded():
    figures = {
        "iceberg": "1.10.2 on Spark 3.5.9",
        "master": "local[2]",
        "driver_memory": "4g",
        "warm_runs": 2,
        "warmup_runs": 1,
        "java_write_seconds": 50.0,
        "load_average_at_start": [1.0, 1.0, 1.0],
        "workload": {
            "rows": 10,
            "snapshot_id": 7,
            "removed_files": 1,
            "removed_bytes": 1 << 20,
            "added_files": 1,
            "added_bytes": 1 << 20,
        },
        "pipeline": [{"wall_seconds": 2.0, "phase_seconds": {"write": 1.0}}] * 2,
        "peer": [{"seconds": 10.0, "call_seconds": 0.1, "write_seconds": 9.9, "rows": 3}] * 2,
        "checks": {},
    }
    assert not any("Connect server JVM" in line for line in peer.summary_lines(figures))
    figures["server_java_options"] = "-XX:TieredStopAtLevel=1"
    told = [line for line in peer.summary_lines(figures) if "Connect server JVM" in line]
    assert told == [
        "   the pipeline's Connect server JVM: -XX:TieredStopAtLevel=1 (it only coordinates); "
        "the peer's JVM: Spark's defaults"
    ]

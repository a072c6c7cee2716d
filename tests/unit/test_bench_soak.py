"""The soak's pure parts (bench/soak.py): the writer's plan, the percentiles, the printed line, the exactness verdict.

The soak itself is ``python bench/soak.py`` (a benchmark on a quiet host, never a timed test); these
cases pin what it computes from what it measured, so a wrong rank or a lenient verdict is caught
without a run.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _soak():
    """``bench/soak.py`` as a module (its siblings, ``freshness`` and ``percentiles``, importable for the load)."""
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("bench_soak", BENCH / "soak.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


soak = _soak()


def _result(**overrides) -> dict:
    result = {
        "interval": 5.0,
        "duration": 600.0,
        "lag": {"p50": 6.04, "p95": 27.96, "max": 31.25},
        "uncommitted": 0,
        "caught_up_seconds": 42.05,
        "catch_up_timeout": 900.0,
        "verdict": "exact",
    }
    return {**result, **overrides}


def test_the_line_is_the_issues_format_with_one_decimal():
    assert soak.soak_line(_result()) == (
        "soak: a commit every 5 s for 600 s: lag p50 6.0 s, p95 28.0 s, max 31.2 s; "
        "caught up 42.0 s after the last commit; exact"
    )


def test_a_soak_not_caught_up_says_so_and_still_prints_the_figures():
    line = soak.soak_line(
        _result(caught_up_seconds=None, uncommitted=3, verdict="NOT exact: commits not exactly once")
    )
    assert line == (
        "soak: a commit every 5 s for 600 s: lag p50 6.0 s, p95 28.0 s, max 31.2 s "
        "(at least: 3 snapshots never reached the changelog); "
        "caught up: not within 900 s after the last commit; NOT exact: commits not exactly once"
    )


def test_lag_percentiles_are_nearest_rank_and_max():
    lags = [float(n) for n in range(1, 21)]  # 1..20
    assert soak.lag_figures(lags) == {"p50": 10.0, "p95": 19.0, "max": 20.0}
    # Ranks round up: p95 of 10 values is the 10th, p50 of 5 values the 3rd.
    assert soak.lag_figures([float(n) for n in range(10, 0, -1)])["p95"] == 10.0
    assert soak.lag_figures([5.0, 1.0, 4.0, 2.0, 3.0])["p50"] == 3.0
    assert soak.lag_figures([7.5]) == {"p50": 7.5, "p95": 7.5, "max": 7.5}
    with pytest.raises(ValueError, match="no values"):
        soak.lag_figures([])


def test_the_plan_cycles_update_append_delete_with_one_rewrite_half_way():
    plan = soak.write_plan(8)
    assert plan == ["update", "append", "delete", "update", "rewrite", "delete", "update", "append"]
    assert soak.write_plan(120).count("rewrite") == 1


def test_commits_fall_on_the_fixed_cadence_within_the_duration():
    assert soak.commit_count(600, 5) == 120  # at 0, 5, ..., 595 s
    assert soak.commit_count(600, 10) == 60
    assert soak.commit_count(61, 10) == 7  # 0 .. 60 s
    with pytest.raises(ValueError, match="--interval"):
        soak.commit_count(600, 0)


def test_exact_only_when_replay_commits_and_both_mirrors_hold():
    equal = {"ice": True, "pg": True}
    assert soak.verdict([], [], equal) == "exact"
    assert soak.verdict(["snapshot 7: replay differs: missing 1 rows, extra 0 rows"], [], equal) == (
        "NOT exact: replay differs (1 snapshots; first: snapshot 7: replay differs: missing 1 rows, extra 0 rows)"
    )
    assert soak.verdict([], [], {"ice": True, "pg": False}) == "NOT exact: mirror pg not equal to the source"
    assert soak.verdict([], [], {}) == "NOT exact: no mirror was verified"
    both = soak.verdict(["a"], ["snapshot 3 committed 2 times, not once"], equal)
    assert (
        both.startswith("NOT exact: replay differs")
        and "commits not exactly once (1; first: snapshot 3" in both
    )


def test_every_changed_snapshot_once_and_a_no_change_one_at_most_once():
    assert soak.commit_problems({1: 1, 2: 1}, [1, 2], [3]) == []
    assert soak.commit_problems({1: 1, 2: 1, 3: 1}, [1, 2], [3]) == []  # no change: once is fine too
    assert soak.commit_problems({1: 2, 3: 2}, [1, 2], [3]) == [
        "snapshot 1 committed 2 times, not once",
        "snapshot 2 committed 0 times, not once",
        "no-change snapshot 3 committed 2 times",
    ]
    assert soak.commit_problems({1: 1, 9: 1}, [1], []) == [
        "sink commits of snapshots not in the source's history: [9]"
    ]


def test_a_failed_run_or_a_verdict_other_than_exact_fails_the_bench():
    clean = {"verdict": "exact", "runs": {"changelog": {"failed": []}, "pg": {"failed": []}}}
    assert not soak.failed({"soaks": [clean]})
    assert soak.failed({"soaks": [clean, {**clean, "verdict": "NOT exact: x"}]})
    assert soak.failed({"soaks": [{**clean, "runs": {"pg": {"failed": ["r1"]}}}]})


def test_too_few_rows_for_the_commits_is_refused_before_anything_starts(tmp_path):
    # 120 commits: updates take ids 1..120 from the bottom, deletes from the top; 240 rows would meet.
    with pytest.raises(ValueError, match=r"--rows 240 is too few for 120 commits: give at least 241"):
        soak.soak_figures(tmp_path, None, tmp_path / "logs", intervals=(5.0, 10.0), duration=600, rows=240)
    assert not (tmp_path / "catalog.db").exists()

"""The streaming-writer soak: a writer committing on a fixed cadence, the changelog and both mirrors keeping up.

The deployment is ``freshness.py``'s (``make airflow``-like): Airflow's API
server, scheduler, DAG processor and triggerer on 127.0.0.1
(:class:`~cdc_devtools.scheduler.LocalAirflow`, LocalExecutor with 2 slots,
``low_latency``), the Spark phases on a local Spark Connect server
(``local[2]``), a SQLite catalog, runs started only by the source asset's
watcher (or chained from one). Each soaked table has **mirrors on**: an
Iceberg mirror and a PostgreSQL mirror (a local server), each its own DAG
scheduled on the changelog's asset, under the same scheduler.

Per cadence (``--interval``, default 5 s then 10 s) a writer commits at
``start + i * interval`` (a fixed wall clock, never drifting) for
``--duration`` seconds, cycling a one-row copy-on-write update, an append of
a few rows and a copy-on-write delete of one row, with one carryover-only
rewrite (one data file rewritten with identical rows: no logical change)
half-way. Then the writer stops and the pipeline catches up. Figures:

* **lag** per source snapshot: the sink commit holding its changes minus the
  source commit (both ``timestamp-ms``); p50, p95 (nearest rank), max;
* **caught up**: seconds from the writer's last commit until the sink's
  watermark is the source's current snapshot (bounded: ``--catch-up-timeout``),
  and the same for each mirror's mark;
* **exact**: the changelog replays to the source (every source snapshot:
  ``state(parent) - removed + added == state(snapshot)``,
  :func:`cdc_devtools.replay.assert_replay`), every snapshot with a change
  committed exactly once (no-change snapshots at most once), and both mirrors
  proved equal to the source by the product's verify (``make verify``'s
  :mod:`iceberg_cdc.mirror.verify`, without repair).

Run alone (about 30 minutes with the defaults)::

    .venv/bin/python bench/soak.py [--interval 5 10] [--duration 600] [--work DIR]

prints, per cadence, ``soak: a commit every 5 s for 600 s: lag p50 A s, p95 B s,
max C s; caught up D s after the last commit; exact`` and a line of run
counts; writes ``bench/results/soak.{json,txt}``; exits 1 when a soak is not
exact or a run failed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

import yaml  # noqa: E402
from freshness import wait_caught_up  # noqa: E402
from percentiles import nearest_rank  # noqa: E402

from cdc_devtools.airflow_env import airflow_env  # noqa: E402
from iceberg_cdc.sink.summary import CommitSummary  # noqa: E402
from iceberg_cdc.sink.table import find_commit, read_watermark, summary_properties  # noqa: E402

# The writer's cycle; one REWRITE (carryover only) replaces one step half-way through.
CYCLE = ("update", "append", "delete")
REWRITE = "rewrite"
NO_CHANGE_KINDS = frozenset({REWRITE})
APPENDED_ROWS = 3  # rows per append
CATCH_UP_TIMEOUT = 900.0  # seconds after the last commit before the soak reports "not caught up"
MIRROR_TIMEOUT = 300.0  # seconds more for the mirrors and the last runs, once the changelog is done


# --- the writer's plan and commits ---------------------------------------------------------------


def write_plan(commits: int) -> list[str]:
    """The kind of each commit: the cycle, with the one carryover-only rewrite half-way."""
    plan = [CYCLE[index % len(CYCLE)] for index in range(commits)]
    if commits:
        plan[commits // 2] = REWRITE
    return plan


def commit_count(duration: float, interval: float) -> int:
    """Commits at ``0, interval, 2 * interval, ...`` strictly before ``duration``."""
    if interval <= 0 or duration <= 0:
        raise ValueError(f"--interval ({interval}) and --duration ({duration}) must be positive seconds")
    return max(1, -(-int(duration * 1000) // int(interval * 1000)))


def _commit(table, kind: str, index: int, rows: int) -> int:
    """One source commit of ``kind``; returns its snapshot id."""
    import workload as wl
    from latency import _one_row_update

    from cdc_devtools.cow import cow_merge, read_task_rows, rewrite_files

    if kind == "update":
        return _one_row_update(table, 1 + index, f"soak{index}")  # ids 1.. never deleted below
    if kind == "append":
        table.append(wl._version(rows + APPENDED_ROWS * index, APPENDED_ROWS, 0))
    elif kind == "delete":
        if cow_merge(table, delete_keys=[rows - 1 - index]) is None:
            raise RuntimeError(f"the delete of row {rows - 1 - index} of {table.name()} changed nothing")
    elif kind == REWRITE:
        task = min(table.scan().plan_files(), key=lambda t: t.file.file_path)
        rewrite_files(table, [task.file], read_task_rows(table, task))  # the same rows in a new file
    else:
        raise ValueError(f"unknown commit kind {kind!r}: one of {(*CYCLE, REWRITE)}")
    table.refresh()
    return table.current_snapshot().snapshot_id


def run_writer(
    table, plan: list[str], interval: float, rows: int, on_tick: Callable[[], None]
) -> list[dict[str, Any]]:
    """Commit ``plan`` at ``start + i * interval``; a late commit does not move the later ones."""
    start = time.time()
    entries = []
    for index, kind in enumerate(plan):
        due = start + index * interval
        time.sleep(max(0.0, due - time.time()))
        began = time.time()
        snapshot_id = _commit(table, kind, index, rows)
        entries.append(
            {
                "snapshot_id": str(snapshot_id),
                "kind": kind,
                "late_seconds": round(began - due, 3),
                "write_seconds": round(time.time() - began, 3),
            }
        )
        on_tick()
    return entries


# --- figures and the verdict (pure) --------------------------------------------------------------


def lag_figures(lags: list[float]) -> dict[str, float]:
    """p50, p95 (nearest rank) and max of the lags, in seconds."""
    return {
        "p50": nearest_rank(lags, 0.50),
        "p95": nearest_rank(lags, 0.95),
        "max": max(lags),
    }


def commit_problems(counts: Mapping[int, int], changed: Iterable[int], unchanged: Iterable[int]) -> list[str]:
    """What breaks "every snapshot committed once": changed snapshots exactly once, no-change ones at most once."""
    problems = []
    for snapshot_id in changed:
        if counts.get(snapshot_id, 0) != 1:
            problems.append(f"snapshot {snapshot_id} committed {counts.get(snapshot_id, 0)} times, not once")
    for snapshot_id in unchanged:
        if counts.get(snapshot_id, 0) > 1:
            problems.append(f"no-change snapshot {snapshot_id} committed {counts[snapshot_id]} times")
    expected = set(changed) | set(unchanged)
    strays = sorted(s for s in counts if s not in expected)
    if strays:
        problems.append(f"sink commits of snapshots not in the source's history: {strays}")
    return problems


def verdict(replay: list[str], commits: list[str], mirrors: Mapping[str, bool]) -> str:
    """``exact`` when all three checks hold, else ``NOT exact: `` and which failed and how."""
    failed = []
    if replay:
        failed.append(f"replay differs ({len(replay)} snapshots; first: {replay[0]})")
    if commits:
        failed.append(f"commits not exactly once ({len(commits)}; first: {commits[0]})")
    if not mirrors:
        failed.append("no mirror was verified")
    unequal = sorted(name for name, equal in mirrors.items() if not equal)
    if unequal:
        failed.append(f"mirror {', '.join(unequal)} not equal to the source")
    return "exact" if not failed else "NOT exact: " + "; ".join(failed)


def soak_line(result: Mapping[str, Any]) -> str:
    """``soak: a commit every 5 s for 600 s: lag p50 A s, p95 B s, max C s; caught up D s after ...; exact``."""
    lag = result["lag"]
    lags = f"lag p50 {lag['p50']:.1f} s, p95 {lag['p95']:.1f} s, max {lag['max']:.1f} s"
    if result.get("uncommitted"):
        lags += f" (at least: {result['uncommitted']} snapshots never reached the changelog)"
    caught = result["caught_up_seconds"]
    caught_up = (
        f"caught up {caught:.1f} s after the last commit"
        if caught is not None
        else f"caught up: not within {result['catch_up_timeout']:.0f} s after the last commit"
    )
    return (
        f"soak: a commit every {result['interval']:g} s for {result['duration']:g} s: {lags}; "
        f"{caught_up}; {result['verdict']}"
    )


def runs_line(result: Mapping[str, Any]) -> str:
    """The runs the soak caused, by DAG and run type, and the failed ones."""
    parts = []
    for name, runs in result["runs"].items():
        kinds = ", ".join(f"{count} {kind}" for kind, count in sorted(runs["by_type"].items()))
        parts.append(f"{name} {runs['total']} ({kinds})" if kinds else f"{name} 0")
    failed = [run for runs in result["runs"].values() for run in runs["failed"]]
    mirrors = ", ".join(
        f"{name} {seconds:.1f} s" if seconds is not None else f"{name} not within the wait"
        for name, seconds in result["mirror_caught_up_seconds"].items()
    )
    return (
        f"soak runs (a commit every {result['interval']:g} s): {'; '.join(parts)}; "
        f"{len(failed)} failed{': ' + ', '.join(failed) if failed else ''}; "
        f"mirrors caught up after the last commit: {mirrors}"
    )


def soak_lines(results: Mapping[str, Any]) -> list[str]:
    lines = []
    for result in results["soaks"]:
        lines += [soak_line(result), runs_line(result)]
    return lines


def failed(results: Mapping[str, Any]) -> bool:
    """A soak not exact, or a run that failed."""
    return any(
        result["verdict"] != "exact" or any(runs["failed"] for runs in result["runs"].values())
        for result in results["soaks"]
    )


# --- reading the outcome -------------------------------------------------------------------------


def _history(source) -> list[int]:
    """The source's snapshot ids, oldest first (its current ancestry)."""
    from pyiceberg.table.snapshots import ancestors_of

    return [s.snapshot_id for s in ancestors_of(source.current_snapshot(), source.metadata)][::-1]


def sink_commit_counts(sink, source_identifier: str) -> Counter:
    """Sink commits (the current ancestry, reprocess appends left out) per source snapshot id."""
    from pyiceberg.table.snapshots import ancestors_of

    counts: Counter = Counter()
    for snapshot in ancestors_of(sink.current_snapshot(), sink.metadata):
        record = CommitSummary.from_summary(summary_properties(snapshot))
        mine = record.source_table == source_identifier and record.source_snapshot_id is not None
        if mine and not record.replace:
            counts[record.source_snapshot_id] += 1
    return counts


def replay_problems(source, sink, snapshot_ids: list[int]) -> list[str]:
    """:func:`~cdc_devtools.replay.assert_replay` over each snapshot; its failures as text."""
    from cdc_devtools.replay import assert_replay

    problems = []
    for snapshot_id in snapshot_ids:
        try:
            assert_replay(source, sink, snapshot_id, ["id"])
        except AssertionError as exc:
            problems.append(str(exc) or f"snapshot {snapshot_id}")
    return problems


def verify_mirror(config_path: Path, source: str, mirror: str) -> tuple[bool, list[str]]:
    """``make verify REPAIR=0`` on one mirror, in this process: (equal, its lines)."""
    from iceberg_cdc.mirror.verify.cli import main as verify_main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = verify_main(
            ["--config", str(config_path), "--table", source, "--mirror", mirror, "--no-repair"]
        )
    lines = [line for line in (out.getvalue() + err.getvalue()).splitlines() if line.strip()]
    return code == 0, lines


# --- the deployment ------------------------------------------------------------------------------


def _table_name(interval: float) -> str:
    return "soak_every_" + f"{interval:g}".replace(".", "_") + "s"


def soak_config(work: Path, s3, pg_dsn: str, sources: list[str]) -> dict[str, Any]:
    """The deployment's config: freshness.py's, with an Iceberg and a PostgreSQL mirror per table."""
    import workload as wl

    tables = []
    for source in sources:
        name = source.split(".")[-1]
        tables.append(
            {
                "source": source,
                "sink": f"{source}_changes",
                "schedule": "@daily",
                "mirrors": [
                    {"type": "iceberg", "table": f"{source}_mirror", "name": "ice", "verify": False},
                    {
                        "type": "postgres",
                        "dsn": pg_dsn,
                        "table": f"public.{name}",
                        "name": "pg",
                        "verify": False,
                    },
                ],
            }
        )
    return {
        "catalog": wl.catalog_properties(work),
        "shuffle": {"uri": "s3://soak-shuffle/events", "partitions": 64, **s3.properties},
        "spark": {"parallel_jobs": 1, "mode": "connect"},
        "tables": tables,
        "events": {"poll_interval": 5.0},
    }


def _mirror_marks(ctx, mirrors) -> dict[str, int | None]:
    from iceberg_cdc.mirror.targets import read_mirror_mark

    marks = {}
    for mirror in mirrors:
        mark = read_mirror_mark(ctx, mirror)
        marks[mirror.mirror_name] = None if mark is None else mark.source_snapshot_id
    return marks


def _catch_up(
    catalog, source: str, sink: str, airflow, dag_id: str, last: float, timeout: float
) -> float | None:
    """Seconds from ``last`` (epoch) until the sink's watermark is the source's current snapshot; None: not in time.

    Gives up early when the newest run failed and no run followed for a minute: nothing would move
    the watermark any more (the source no longer changes, so no event starts another run).
    """
    target = catalog.load_table(source).current_snapshot().snapshot_id
    deadline = time.monotonic() + timeout
    stuck_since: float | None = None
    while time.monotonic() < deadline:
        airflow.check_running()
        if catalog.table_exists(sink):
            mark = read_watermark(catalog.load_table(sink), source)
            if mark is not None and mark.snapshot_id == target:
                return round(time.time() - last, 1)
        runs = airflow.runs(dag_id)
        if runs and runs[-1]["state"] == "failed":
            stuck_since = stuck_since or time.monotonic()
            if time.monotonic() - stuck_since > 60:
                return None
        else:
            stuck_since = None
        time.sleep(0.5)
    return None


def _mirrors_catch_up(ctx, mirrors, target: int, last: float, timeout: float) -> dict[str, float | None]:
    """Per mirror: seconds from ``last`` until its mark is ``target``; None when not within ``timeout``."""
    caught: dict[str, float | None] = {m.mirror_name: None for m in mirrors}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and None in caught.values():
        for name, mark in _mirror_marks(ctx, mirrors).items():
            if caught[name] is None and mark == target:
                caught[name] = round(time.time() - last, 1)
        time.sleep(1.0)
    return caught


def _runs_since(airflow, dag_id: str, before: set[str]) -> dict[str, Any]:
    runs = [r for r in airflow.runs(dag_id) if r["dag_run_id"] not in before]
    return {
        "total": len(runs),
        "by_type": dict(Counter(r["run_type"] for r in runs)),
        "failed": [r["dag_run_id"] for r in runs if r["state"] == "failed"],
    }


def _idle(airflow, dag_ids: Iterable[str], timeout: float) -> bool:
    """Wait (bounded) until no run of the DAGs is left; False when one still ran at the end."""
    deadline = time.monotonic() + timeout
    for dag_id in dag_ids:
        try:
            airflow.wait_until_idle(dag_id, timeout=max(1.0, deadline - time.monotonic()))
        except TimeoutError:
            return False
    return True


def _no_task_running(airflow, dag_ids: Iterable[str], timeout: float) -> None:
    """Wait (bounded) until no task of the (paused) DAGs' runs is running.

    A paused DAG's runs stay ``running`` for ever (the scheduler leaves them), so their tasks, not
    the runs, say when nothing of this table is left to load the host.
    """
    dag_ids = list(dag_ids)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        busy = [
            task
            for dag in dag_ids
            for run in airflow.runs(dag)
            if run["state"] == "running"
            for task, state in airflow.task_states(dag, run["dag_run_id"]).items()
            if state == "running"
        ]
        if not busy:
            return
        time.sleep(2.0)


def soak_one(
    catalog,
    airflow,
    config,
    source: str,
    *,
    interval: float,
    duration: float,
    rows: int,
    catch_up_timeout: float,
) -> dict[str, Any]:
    """One cadence on one table already caught up: write, catch up, collect what the checks need."""
    from iceberg_cdc.run.context import Context

    table_config = config.table(source)
    ctx = Context.of(config, source)
    mirrors = list(table_config.mirrors)
    dags = {"changelog": table_config.dag_id}
    dags.update({m.mirror_name: table_config.mirror_dag_id(m) for m in mirrors})
    before = {name: {r["dag_run_id"] for r in airflow.runs(dag)} for name, dag in dags.items()}
    plan = write_plan(commit_count(duration, interval))
    entries = run_writer(catalog.load_table(source), plan, interval, rows, airflow.check_running)
    source_table = catalog.load_table(source)
    last = source_table.current_snapshot().timestamp_ms / 1000
    caught_up = _catch_up(
        catalog, source, table_config.sink, airflow, dags["changelog"], last, catch_up_timeout
    )
    given_up = time.time()
    target = source_table.current_snapshot().snapshot_id
    deadline = time.monotonic() + MIRROR_TIMEOUT
    if caught_up is None:  # the mirrors follow the changelog: they cannot reach the source either
        mirror_caught_up: dict[str, float | None] = dict.fromkeys((m.mirror_name for m in mirrors), None)
    else:
        mirror_caught_up = _mirrors_catch_up(ctx, mirrors, target, last, MIRROR_TIMEOUT)
    if caught_up is None or not _idle(airflow, dags.values(), max(1.0, deadline - time.monotonic())):
        for dag in dags.values():  # the backlog left must not run into the next soak's figures
            airflow.set_paused(dag, True)
        _no_task_running(airflow, dags.values(), MIRROR_TIMEOUT)
    return {
        "source": source,
        "interval": interval,
        "duration": duration,
        "rows": rows,
        "commits": len(entries),
        "snapshots": entries,
        "caught_up_seconds": caught_up,
        "catch_up_timeout": catch_up_timeout,
        "given_up_at": given_up,
        "mirror_caught_up_seconds": mirror_caught_up,
        "runs": {name: _runs_since(airflow, dag, before[name]) for name, dag in dags.items()},
    }


def check_soak(catalog, config_path: Path, config, result: dict[str, Any]) -> None:
    """Lag per snapshot and the exactness verdict, into ``result`` (after the writer and the runs stopped)."""
    source_id = result["source"]
    source = catalog.load_table(source_id)
    sink = catalog.load_table(config.table(source_id).sink)
    lags, uncommitted = [], 0
    for entry in result["snapshots"]:
        snapshot_id = int(entry["snapshot_id"])
        made = source.metadata.snapshot_by_id(snapshot_id).timestamp_ms
        entry["source_commit_ms"] = made
        if entry["kind"] in NO_CHANGE_KINDS:
            continue  # no change: only the watermark moves, no sink commit to time
        committed = find_commit(sink, source_id, snapshot_id)
        if committed is None:
            uncommitted += 1
            entry["lag_seconds_at_least"] = round(result["given_up_at"] - made / 1000, 2)
            lags.append(entry["lag_seconds_at_least"])
            continue
        entry["lag_seconds"] = round((committed.timestamp_ms - made) / 1000, 2)
        lags.append(entry["lag_seconds"])
    result["lag"] = lag_figures(lags)
    result["uncommitted"] = uncommitted
    history = _history(source)
    mark = read_watermark(sink, source_id)
    replayed = history[: history.index(mark.snapshot_id) + 1] if mark and mark.snapshot_id in history else []
    unchanged = {int(e["snapshot_id"]) for e in result["snapshots"] if e["kind"] in NO_CHANGE_KINDS}
    replay = replay_problems(source, sink, replayed)
    commits = commit_problems(
        sink_commit_counts(sink, source_id), [s for s in history if s not in unchanged], unchanged
    )
    mirrors, lines = {}, []
    for mirror in config.table(source_id).mirrors:
        mirrors[mirror.mirror_name], said = verify_mirror(config_path, source_id, mirror.mirror_name)
        lines += said
    result["checks"] = {
        "replayed_snapshots": len(replayed),
        "replay_problems": replay,
        "commit_problems": commits,
        "verify": lines,
        "mirrors_equal": mirrors,
    }
    result["verdict"] = verdict(replay, commits, mirrors)


def soak_figures(
    work: Path,
    s3,
    logs: Path,
    *,
    intervals: tuple[float, ...] = (5.0, 10.0),
    duration: float = 600.0,
    rows: int = 2_000,
    catch_up_timeout: float = CATCH_UP_TIMEOUT,
    log: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """Every cadence in one deployment (tables soaked one after another), then the checks."""
    most = max(commit_count(duration, interval) for interval in intervals)
    if 2 * most >= rows:  # updates take ids from the bottom, deletes from the top: they must not meet
        raise ValueError(f"--rows {rows} is too few for {most} commits: give at least {2 * most + 1}")
    import workload as wl

    from cdc_devtools.connect_server import LocalSparkConnectServer
    from cdc_devtools.local_postgres import LocalPostgres
    from cdc_devtools.scheduler import LocalAirflow
    from iceberg_cdc.config import parse_config
    from iceberg_cdc.run.context import Context

    catalog = wl.open_catalog(work)
    with contextlib.suppress(Exception):
        s3.client().create_bucket(Bucket="soak-shuffle")
    sources = [wl.build_one_row_update(catalog, _table_name(i), rows).table for i in intervals]
    logs.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"intervals": list(intervals), "duration": duration, "rows": rows, "soaks": []}
    with LocalPostgres(log_path=logs / "soak-postgres.log") as pg:
        raw = soak_config(work, s3, pg.dsn, sources)
        path = work / "soak.yaml"
        path.write_text(yaml.safe_dump(raw))
        config = parse_config(raw)
        with LocalSparkConnectServer(work / "spark-connect-soak", master="local[2]") as server:
            env = airflow_env(work / "airflow-soak", path, spark_master="local[2]", connect_url=server.url)
            with LocalAirflow(
                env, logs / "airflow-soak", parallelism=2, triggerer=True, low_latency=True
            ) as airflow:
                for source in sources:
                    table = config.table(source)
                    for dag in (table.dag_id, *map(table.mirror_dag_id, table.mirrors)):
                        airflow.wait_for_dag(dag)
                        airflow.unpause(dag)  # the first poll reports the table's current snapshot
                log("soak: the tables' first snapshots into the changelogs and mirrors")
                for source in sources:  # the table's two first snapshots, into the changelog and mirrors
                    table = config.table(source)
                    wait_caught_up(catalog, source, table.sink, airflow, table.dag_id, timeout=600)
                    target = catalog.load_table(source).current_snapshot().snapshot_id
                    _mirrors_catch_up(Context.of(config, source), table.mirrors, target, time.time(), 600)
                    _idle(airflow, (table.dag_id, *map(table.mirror_dag_id, table.mirrors)), 600)
                for source, interval in zip(sources, intervals, strict=True):
                    log(f"soak: a commit every {interval:g} s for {duration:g} s, then the catch-up")
                    results["soaks"].append(
                        soak_one(
                            catalog,
                            airflow,
                            config,
                            source,
                            interval=interval,
                            duration=duration,
                            rows=rows,
                            catch_up_timeout=catch_up_timeout,
                        )
                    )
        log("soak: lag per snapshot, the replay, commits per snapshot, verifying both mirrors")
        for result in results["soaks"]:
            check_soak(catalog, path, config, result)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--interval", type=float, nargs="+", default=[5.0, 10.0], help="seconds between commits"
    )
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of writing per cadence")
    parser.add_argument("--rows", type=int, default=2_000, help="rows of each soaked table before the writer")
    parser.add_argument(
        "--catch-up-timeout",
        type=float,
        default=CATCH_UP_TIMEOUT,
        help="seconds to wait after the last commit",
    )
    parser.add_argument("--work", type=Path, default=ROOT / ".cdc" / "bench-soak")
    args = parser.parse_args()
    import shutil

    from cdc_devtools.local_s3 import LocalS3Server

    commit_count(args.duration, min(args.interval))  # bad values fail before anything starts
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    with LocalS3Server() as s3:
        results = soak_figures(
            args.work,
            s3,
            args.work / "logs",
            intervals=tuple(args.interval),
            duration=args.duration,
            rows=args.rows,
            catch_up_timeout=args.catch_up_timeout,
            log=lambda message: print(time.strftime("[%H:%M:%S] ") + message, flush=True),
        )
    lines = soak_lines(results)
    out = ROOT / "bench" / "results"
    (out / "soak.json").write_text(json.dumps(results, indent=2) + "\n")
    command = "python bench/soak.py --interval " + " ".join(f"{i:g}" for i in args.interval)
    (out / "soak.txt").write_text("\n".join([f"# {command} --duration {args.duration:g}", *lines]) + "\n")
    print("\n".join(lines))
    return 1 if failed(results) else 0


if __name__ == "__main__":
    raise SystemExit(main())

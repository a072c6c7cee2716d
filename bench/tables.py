"""make bench-tables: what N configured tables cost Airflow with nothing to do, and how fast a commit starts a run.

For each N (default 100 and 1,000 tables in one config, events on, one SQLite
catalog holding every table):

* **parse**: each DAG file parsed as the DAG processor parses it -- a new
  process that has imported ``airflow.sdk`` and the file's ``airflow.*``
  imports (what the processor imports before it forks a parse), then
  ``BundleDagBag(file)`` and ``DagSerialization.to_dict`` of every DAG --
  CPU seconds per file and in all (the host is shared: wall seconds are in
  the JSON). The DAG files are the tree's ``dags/cdc_dags.py`` (one file, or
  ``parts`` files when the tree has ``dags_from_config(part=, parts=)``);
* under the real components (:class:`~cdc_devtools.scheduler.LocalAirflow`:
  API server, scheduler, DAG processor with 2 parsing processes, triggerer,
  LocalExecutor with 2 slots), every DAG unpaused and its event trigger
  polling (Airflow starts an unpaused DAG's watcher at the next parse of its
  file, so this waits for the shared poll's first report), nothing committing:
  **the DAG processor's CPU** over ``--idle-seconds`` or one parsing interval,
  whichever is longer (its process and the parse processes it forks, from
  /proc) as % of one core, and **the
  triggerer's catalog calls** per minute per table, as its shared poll
  reports them;
* **commit to run start**: 10 of the N tables get a one-row append each, 2 s
  apart; seconds from the source snapshot's commit (``timestamp-ms``) to the
  DAG run's start as Airflow records it (``start_date``), p50 and p95.
  Each run is stopped (marked failed over the REST API) once started: what a
  run then does is measured by ``freshness.py`` and ``latency.py``.

``--before REF`` measures the same for the project at git ref ``REF`` (its
``plugins/`` and ``dags/``, from ``git archive``) in the same invocation, so
the ratios compare like with like. Under the components, a tree whose one
parse takes longer than the DAG processor's timeout (``dag_file_processor_timeout``,
50 s) never loads its DAGs: that session is skipped and says so.

Prints one line per N and tree, e.g.
``tables: N=1000 parse 4.2 s in all (3 files), dag-processor idle 6% of a core,
triggerer 0.2 catalog loads/min/table, commit-to-run-start p50 8 s p95 12 s``,
and writes ``bench/results/tables.{json,txt}``.

    python bench/tables.py                       # N = 100 and 1000, this tree
    python bench/tables.py --before main         # and the tree at main, side by side
    python bench/tables.py --tables 100 --no-scheduler
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import yaml  # noqa: E402
from percentiles import nearest_rank  # noqa: E402

from cdc_devtools.airflow_env import VENV_BIN, airflow_env  # noqa: E402

TABLES_PER_FILE = (
    500  # DAG files of a split config: ~5 s each (30 s import timeout), one per parsing process at 1,000
)
PROCESSOR_TIMEOUT = 50.0  # [dag_processor] dag_file_processor_timeout, Airflow's default
NAMESPACE = "many"

# One DAG file's parse as the DAG processor does it (airflow/dag_processing/processor.py: _parse_file).
PARSE_CHILD = """
import json, os, resource, sys, time
from pathlib import Path
import importlib
import airflow.sdk  # imported by the processor before it forks a parse
from airflow.utils.file import iter_airflow_imports
for module in iter_airflow_imports(sys.argv[1]):  # so are the file's airflow.* imports (pre-import)
    importlib.import_module(module)
try:
    from airflow.dag_processing.dagbag import BundleDagBag
    def bag_of(path):
        return BundleDagBag(dag_folder=path, bundle_path=Path(path).parent, load_op_links=False)
except ImportError:  # Airflow 3.1
    from airflow.models.dagbag import DagBag
    def bag_of(path):
        return DagBag(dag_folder=path, include_examples=False)
from airflow.serialization.serialized_objects import DagSerialization

wall, cpu = time.perf_counter(), time.process_time()
bag = bag_of(sys.argv[1])
built = time.perf_counter() - wall
for dag in bag.dags.values():
    DagSerialization.to_dict(dag)
print(json.dumps({"seconds": time.perf_counter() - wall, "build_seconds": built,
                  "cpu_seconds": time.process_time() - cpu, "dags": len(bag.dags),
                  "errors": {k: v[-300:] for k, v in bag.import_errors.items()}}))
"""


# --- the trees -------------------------------------------------------------------------------------


def tree_at(ref: str, dest: Path) -> Path:
    """The project's ``plugins/`` and ``dags/`` at git ref ``ref``, extracted into ``dest``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", ref, "plugins", "dags"],
        check=True,
        capture_output=True,
    ).stdout
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def splits(tree: Path) -> bool:
    """Whether the tree's ``dags_from_config`` takes ``part=`` / ``parts=`` (DAGs over several files)."""
    return "parts" in (tree / "plugins" / "iceberg_cdc" / "airflow" / "dags.py").read_text()


def dag_file_head(tree: Path) -> str:
    """What the tree's own DAG file (``dags/cdc_dags.py``) has before its ``dags_from_config`` call.

    Its ``airflow.*`` imports are the operators' modules, which the DAG
    processor imports once, before it forks each parse: a split deployment's
    files carry the same lines, and the parse is measured with them.
    """
    own = (tree / "dags" / "cdc_dags.py").read_text()
    imports = [line for line in own.splitlines() if line.startswith(("import ", "from "))]
    return "\n".join(imports) + "\n\n"


def dag_files(tree: Path, folder: Path, tables: int) -> list[Path]:
    """The DAG files a deployment of ``tables`` tables uses with this tree: its DAG file, one per part."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    parts = max(1, math.ceil(tables / TABLES_PER_FILE)) if splits(tree) else 1
    head = dag_file_head(tree)
    files = []
    for part in range(parts):
        call = f"dags_from_config(part={part}, parts={parts})" if parts > 1 else "dags_from_config()"
        path = folder / (f"cdc_dags_{part}.py" if parts > 1 else "cdc_dags.py")
        path.write_text(
            f'"""The CDC DAGs (part {part + 1} of {parts})."""\n\n{head}globals().update({call})\n'
        )
        files.append(path)
    return files


def write_config(work: Path, tables: int) -> Path:
    """N tables (``many.t0000`` ...), events on, no clock (runs come from commits only)."""
    raw = {
        "catalog": {
            "name": "many",
            "type": "sql",
            "uri": f"sqlite:///{work / 'catalog.db'}",
            "warehouse": (work / "warehouse").as_uri(),
        },
        "shuffle": {"uri": (work / "shuffle").as_uri()},
        "tables": [
            {"source": f"{NAMESPACE}.t{i:04d}", "sink": f"{NAMESPACE}.t{i:04d}_changes", "schedule": None}
            for i in range(tables)
        ],
    }
    path = work / "cdc.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def tree_env(tree: Path, env: dict[str, str], dags: Path) -> dict[str, str]:
    env = dict(env)
    env["PYTHONPATH"] = str(tree / "plugins")
    env["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags)
    env["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(tree / "plugins")
    return env


# --- parse ------------------------------------------------------------------------------------------


def parse_figures(tree: Path, work: Path, tables: int) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    config = write_config(work, tables)
    files = dag_files(tree, work / "dags", tables)
    env = tree_env(tree, airflow_env(work / "airflow", config), work / "dags")
    env["AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT"] = "3600"  # measure the slow tree too, however long
    per_file = []
    for path in files:
        done = subprocess.run(
            [str(VENV_BIN / "python"), "-c", PARSE_CHILD, str(path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=3600,
        )
        if done.returncode != 0:
            raise RuntimeError(f"parsing {path} failed:\n{done.stderr[-3000:]}")
        figures = json.loads(done.stdout.strip().splitlines()[-1])
        if figures["errors"]:
            raise RuntimeError(f"{path} has import errors: {figures['errors']}")
        per_file.append({"file": path.name, **{k: v for k, v in figures.items() if k != "errors"}})
    return {
        "files": len(files),
        "per_file": per_file,
        "seconds": round(sum(f["seconds"] for f in per_file), 2),
        "cpu_seconds": round(sum(f["cpu_seconds"] for f in per_file), 2),
        "slowest_file_seconds": round(max(f["seconds"] for f in per_file), 2),
        "slowest_file_cpu_seconds": round(max(f["cpu_seconds"] for f in per_file), 2),
        "dags": sum(f["dags"] for f in per_file),
    }


# --- under the components ------------------------------------------------------------------------------


def _cpu_seconds(pid: int, *, children: bool = True) -> float:
    """CPU seconds of ``pid`` and of its reaped children (utime + stime + cutime + cstime), or its own only."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11 : 15 if children else 13]) / os.sysconf("SC_CLK_TCK")


def _tree_cpu_seconds(pid: int) -> float:
    from cdc_devtools.process_tree import descendants

    total = _cpu_seconds(pid)
    for child in descendants(pid):
        with contextlib.suppress(OSError, ValueError):
            with open(f"/proc/{child}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _dag_ids(airflow) -> set[str]:
    found: set[str] = set()
    offset = 0
    while True:
        page = airflow.request(
            "GET", "/api/v2/dags", params={"dag_id_pattern": "cdc__%", "limit": 100, "offset": offset}
        )
        found |= {d["dag_id"] for d in page["dags"]}
        offset += 100
        if offset >= page["total_entries"]:
            return found


def _unpause_all(airflow) -> None:
    while True:
        page = airflow.request(
            "PATCH",
            "/api/v2/dags",
            {"is_paused": False},
            params={"dag_id_pattern": "cdc__%", "paused": "true", "limit": 100},
        )
        if not page["dags"]:
            return


def _create_tables(work: Path, tables: int):
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    (work / "warehouse").mkdir(parents=True, exist_ok=True)
    catalog = SqlCatalog(
        "many", uri=f"sqlite:///{work / 'catalog.db'}", warehouse=(work / "warehouse").as_uri()
    )
    catalog.create_namespace_if_not_exists(NAMESPACE)
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "v", StringType(), required=False),
        identifier_field_ids=[1],
    )
    for i in range(tables):
        catalog.create_table_if_not_exists(f"{NAMESPACE}.t{i:04d}", schema=schema)
    return catalog


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def scheduler_figures(
    tree: Path,
    work: Path,
    tables: int,
    *,
    committing: int = 10,
    idle_seconds: float = 60.0,
    processor_interval: int | None = None,
) -> dict[str, Any]:
    import pyarrow as pa

    from cdc_devtools.scheduler import LocalAirflow

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    started = time.monotonic()
    catalog = _create_tables(work, tables)
    created = time.monotonic() - started
    config = write_config(work, tables)
    dag_files(tree, work / "dags", tables)
    env = tree_env(tree, airflow_env(work / "airflow", config), work / "dags")
    if processor_interval:
        env["AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL"] = str(processor_interval)
    results: dict[str, Any] = {
        "tables": tables,
        "create_tables_seconds": round(created, 1),
        "min_file_process_interval": processor_interval or 30,
    }
    logs = work / "components"
    with LocalAirflow(env, logs, parallelism=2, triggerer=True) as airflow:
        started = time.monotonic()
        deadline = started + max(300.0, tables * 0.6)
        while len(found := _dag_ids(airflow)) < tables:
            airflow.check_running()
            if time.monotonic() > deadline:
                results["not_loaded"] = (
                    f"{len(found)} of {tables} DAGs parsed in {time.monotonic() - started:.0f} s"
                )
                return results
            time.sleep(5)
        results["dags_loaded_seconds"] = round(time.monotonic() - started, 1)
        _unpause_all(airflow)
        # An unpaused DAG's source asset gets its watcher at the DAG processor's next parse of its file
        # (Airflow keeps no watcher for paused DAGs): commits before that start nothing. Wait for the
        # shared poll's first report (60 s after it opened), so what follows is the steady state.
        unpaused = time.monotonic()
        while not _poll_counts(logs, work):
            airflow.check_running()
            if time.monotonic() > unpaused + (processor_interval or 30) + 300:
                results["not_loaded"] = "the event triggers never polled the catalog"
                return results
            time.sleep(5)
        results["watchers_polling_after_unpause_seconds"] = round(time.monotonic() - unpaused, 1)
        processor = airflow.processes["dag-processor"].pid
        triggerer = airflow.processes["triggerer"].pid
        cpu0, trig0, wall0 = _tree_cpu_seconds(processor), _tree_cpu_seconds(triggerer), time.monotonic()
        own0 = _cpu_seconds(processor, children=False)
        # At least one whole parsing interval: a shorter window may hold no parse at all.
        time.sleep(max(idle_seconds, float(processor_interval or 30)))
        cpu1, trig1, wall1 = _tree_cpu_seconds(processor), _tree_cpu_seconds(triggerer), time.monotonic()
        own1 = _cpu_seconds(processor, children=False)
        results["idle_seconds"] = round(wall1 - wall0, 1)
        results["dag_processor_idle_percent"] = round(100 * (cpu1 - cpu0) / (wall1 - wall0), 1)
        # The processor's own process (not its parses): Airflow's bookkeeping of each parse's DAGs
        # (comparing and storing the serialized DAGs, the DAG table's rows).
        results["dag_processor_manager_percent"] = round(100 * (own1 - own0) / (wall1 - wall0), 1)
        results["triggerer_idle_percent"] = round(100 * (trig1 - trig0) / (wall1 - wall0), 1)

        commits: dict[str, float] = {}
        arrow = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.string())])
        for i in range(committing):
            source = f"{NAMESPACE}.t{i * max(1, tables // committing):04d}"
            table = catalog.load_table(source)
            table.append(
                pa.table({"id": pa.array([i], pa.int64()), "v": pa.array([f"row {i}"])}, schema=arrow)
            )
            commits["cdc__" + source.replace(".", "__")] = (
                table.refresh().current_snapshot().timestamp_ms / 1000
            )
            time.sleep(2)
        delays: dict[str, float] = {}
        deadline = time.monotonic() + 300
        while len(delays) < len(commits) and time.monotonic() < deadline:
            airflow.check_running()
            for dag_id, committed in commits.items():
                if dag_id in delays:
                    continue
                begun = [r for r in airflow.runs(dag_id) if r.get("start_date")]
                if begun:
                    run = min(begun, key=lambda r: _epoch(r["start_date"]))
                    delays[dag_id] = round(_epoch(run["start_date"]) - committed, 2)
                    with contextlib.suppress(Exception):  # measured: stop the run's work
                        airflow.request(
                            "PATCH", f"/api/v2/dags/{dag_id}/dagRuns/{run['dag_run_id']}", {"state": "failed"}
                        )
            time.sleep(0.5)
        results["commit_to_run_start"] = delays
        results["runs_not_started"] = sorted(set(commits) - set(delays))
        if delays:
            results["p50"] = nearest_rank(list(delays.values()), 0.50)
            results["p95"] = nearest_rank(list(delays.values()), 0.95)
        time.sleep(max(0.0, 65 - (time.monotonic() - wall0)))  # at least one poll report (every 60 s)
    reports = _poll_counts(logs, work)
    results["poll_reports"] = reports
    if reports:
        calls = sum(r["calls"] for r in reports)
        minutes = sum(r["seconds"] for r in reports) / 60
        results["catalog_calls_per_minute_per_table"] = round(calls / minutes / tables, 4)
    else:
        results["catalog_calls_per_minute_per_table"] = None
    return results


_POLL = re.compile(r"catalog poll .*?: (\d+) calls in (\d+) s for (\d+) table\(s\)")


def _poll_counts(logs: Path, work: Path) -> list[dict[str, int]]:
    """The triggerer's shared-poll reports (every 60 s): calls, seconds, tables."""
    found = []
    for folder in (logs, work / "airflow" / "logs"):
        for path in folder.rglob("*"):
            if path.is_file():
                with contextlib.suppress(OSError):
                    for match in _POLL.finditer(path.read_text(errors="replace")):
                        found.append(
                            {"calls": int(match[1]), "seconds": int(match[2]), "tables": int(match[3])}
                        )
    return found


# --- lines -------------------------------------------------------------------------------------------


def tables_line(name: str, tables: int, parse: dict[str, Any], live: dict[str, Any] | None) -> str:
    line = (
        f"tables: N={tables} ({name}) parse {parse['cpu_seconds']:.1f} s in all ({parse['files']} "
        f"file{'s' if parse['files'] > 1 else ''}, CPU seconds; {parse['seconds']:.1f} s wall on this shared machine)"
    )
    if live is None:
        return line
    if "skipped" in live or "not_loaded" in live:
        return f"{line}, under the scheduler: {live.get('skipped') or live['not_loaded']}"
    calls = live.get("catalog_calls_per_minute_per_table")
    start = (
        f"commit-to-run-start p50 {live['p50']:.1f} s p95 {live['p95']:.1f} s"
        if "p50" in live
        else "no run started"
    )
    missing = (
        f" ({len(live['runs_not_started'])} of 10 never started)" if live.get("runs_not_started") else ""
    )
    interval = live.get("min_file_process_interval", 30)
    own = live.get("dag_processor_manager_percent")
    manager = "" if own is None else f"; {own:.0f}% in its own process, storing what the parses found"
    return (
        f"{line}, dag-processor idle {live['dag_processor_idle_percent']:.0f}% of a core "
        f"(parsing every {interval} s{manager}), triggerer "
        f"{'?' if calls is None else f'{calls:.3f}'} catalog loads/min/table, {start}{missing}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--before", help="git ref of the tree to measure beside this one (e.g. main)")
    parser.add_argument("--no-scheduler", action="store_true", help="parse figures only")
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument(
        "--processor-interval",
        type=int,
        nargs="+",
        default=[30],
        help="[dag_processor] min_file_process_interval of the sessions of this tree (Airflow's default: 30)",
    )
    parser.add_argument("--work", type=Path, default=ROOT / ".cdc" / "bench-tables")
    parser.add_argument("--out", default="tables", help="results/<out>.{json,txt}")
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    trees = {"this tree": ROOT}
    if args.before:
        trees = {f"at {args.before}": tree_at(args.before, args.work / "before"), **trees}
    results: dict[str, Any] = {"trees": list(trees), "runs": []}
    lines = []
    for tables in args.tables:
        for name, tree in trees.items():
            work = args.work / f"{tables}-{name.replace(' ', '_')}"
            parse = parse_figures(tree, work / "parse", tables)
            print(f"parse: N={tables} ({name}): {json.dumps(parse)}", flush=True)
            # The tree measured before: Airflow's default interval only; this tree: each interval asked for.
            intervals = args.processor_interval if tree == ROOT else [30]
            if args.no_scheduler:
                sessions: list[dict[str, Any] | None] = [None]
            elif parse["slowest_file_cpu_seconds"] > PROCESSOR_TIMEOUT:
                slowest = parse["slowest_file_cpu_seconds"]
                sessions = [
                    {
                        "skipped": f"not run: one file's parse takes {slowest:.0f} s, past the DAG "
                        f"processor's {PROCESSOR_TIMEOUT:.0f} s timeout (its DAGs never load)"
                    }
                ]
            else:
                sessions = [None] * len(intervals)
            for index, live in enumerate(sessions):
                if live is None and not args.no_scheduler:
                    interval = intervals[index]
                    live = scheduler_figures(
                        tree,
                        work / f"live-{interval}",
                        tables,
                        idle_seconds=args.idle_seconds,
                        processor_interval=interval,
                    )
                results["runs"].append({"tree": name, "tables": tables, "parse": parse, "scheduler": live})
                lines.append(tables_line(name, tables, parse, live))
                print(lines[-1], flush=True)
    if args.before:
        for tables in args.tables:
            before = next(r for r in results["runs"] if r["tables"] == tables and r["tree"] != "this tree")
            after = next(r for r in results["runs"] if r["tables"] == tables and r["tree"] == "this tree")
            ratio = before["parse"]["cpu_seconds"] / max(after["parse"]["cpu_seconds"], 1e-9)
            lines.append(
                f"tables: N={tables} parse {before['parse']['cpu_seconds']:.1f} s -> "
                f"{after['parse']['cpu_seconds']:.1f} s CPU in all ({ratio:.1f}x less than {args.before})"
            )
            print(lines[-1])
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.out}.json").write_text(json.dumps(results, indent=2) + "\n")
    command = "python bench/tables.py " + " ".join(sys.argv[1:])
    (out / f"{args.out}.txt").write_text("\n".join([f"# {command.strip()}", *lines]) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

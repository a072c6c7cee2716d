"""Where a one-row run's seconds go, per task: start-up, Spark/Connect overhead, work.

Read after the run from what Airflow and the tasks recorded: the task
instances' ``queued_dttm`` / ``start_date`` / ``end_date`` in Airflow's
metadata database (SQLite here) and each task's log lines (their
timestamps). Per task:

* **sched**: from the end of the last task that finished before this one was
  queued (or the run's start) to its queueing: the scheduler noticing that
  its upstream is done (under ``airflow dags test``: the time between tasks);
* **queue**: queued to started (an executor slot, the task's supervisor);
* **start-up**: started to the end of the task runner's "Pre Execute" group
  (the process parsing the DAG file, loading plugins; under ``dags test``
  the first task also starts the in-process API);
* **spark**: in a Spark task, opening the Spark Connect session (from the end
  of start-up to the ``Spark Connect session on`` line) plus the group's job
  time that its units did not use (``<phase> group N: k units in X s`` minus
  the units' own ``seconds``): what a Spark job costs beside its work;
* **work**: a Spark task's units' own seconds; any other task's ``execute``
  (from the end of start-up to its "Post Execute" group);
* **rest**: the remainder of started to ended (XCom push, state update,
  process exit).

``python bench/runcost.py HOME DAG_ID [RUN_ID]`` prints the table of a run
kept in ``HOME`` (an ``AIRFLOW_HOME`` of the scheduler bench).
"""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

COLUMNS = ("sched", "queue", "startup", "spark", "work", "rest")
SESSION = "Spark Connect session on"
GROUP = re.compile(r"^(\w+) group \d+: \d+ units in ([0-9.]+) s$")
DONE = re.compile(r"^\w+ done: (\{.*)$")
TEXT_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT[0-9:.]+Z) \[[a-z ]+\] (.*?)(?: \[[\w.]+\](?: .*)?)?$")


def epoch(stamp: str | None) -> float | None:
    """A timestamp of Airflow's database (UTC without a zone) or of a log line, as epoch seconds."""
    if not stamp:
        return None
    moment = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def task_rows(
    db: Path, dag_id: str, run_id: str | None = None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The run (the latest when ``run_id`` is None) and its task instances that ran, by start."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as connection:
        run = connection.execute(
            "select run_id, queued_at, start_date, end_date from dag_run where dag_id = ? "
            + ("and run_id = ? " if run_id else "")
            + "order by start_date desc limit 1",
            (dag_id, run_id) if run_id else (dag_id,),
        ).fetchone()
        rows = connection.execute(
            "select task_id, map_index, try_number, queued_dttm, start_date, end_date, state "
            "from task_instance where dag_id = ? and run_id = ? and start_date is not null "
            "order by start_date",
            (dag_id, run[0]),
        ).fetchall()
    tasks = [
        {
            "task": t if m < 0 else f"{t}[{m}]",
            "task_id": t,
            "map_index": m,
            "try_number": n,
            "queued": epoch(q),
            "start": epoch(s),
            "end": epoch(e),
            "state": state,
        }
        for t, m, n, q, s, e, state in rows
    ]
    return {"run_id": run[0], "queued": epoch(run[1]), "start": epoch(run[2]), "end": epoch(run[3])}, tasks


def scheduler_log(home: Path, dag_id: str, run_id: str, task: dict[str, Any]) -> list[tuple[float, str]]:
    """A task's log lines (JSON lines, as the task runner writes them) as (epoch, event)."""
    folder = home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task['task_id']}"
    if task["map_index"] >= 0:
        folder /= f"map_index={task['map_index']}"
    path = folder / f"attempt={max(1, task['try_number'] or 1)}.log"
    lines = []
    for raw in path.read_text().splitlines() if path.exists() else ():
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        if "timestamp" in record:
            lines.append((epoch(record["timestamp"]), str(record.get("event", ""))))
    return lines


def dags_test_logs(log_path: Path) -> dict[str, list[tuple[float, str]]]:
    """Each task's lines of one ``airflow dags test`` output (tasks run one after another in it)."""
    by_task: dict[str, list[tuple[float, str]]] = {}
    current: list[tuple[float, str]] | None = None
    for raw in log_path.read_text().splitlines():
        match = TEXT_LINE.match(raw)
        if not match:
            continue
        stamp, event = epoch(match.group(1)), match.group(2).strip()
        started = re.match(r"\[DAG TEST\] starting task_id=(\S+) map_index=(-?\d+)", event)
        if started:
            task_id, index = started.group(1), int(started.group(2))
            current = by_task.setdefault(task_id if index < 0 else f"{task_id}[{index}]", [])
        if current is not None:
            current.append((stamp, event))
        if event.startswith("[DAG TEST] end task"):
            current = None
    return by_task


def split(task: dict[str, Any], lines: list[tuple[float, str]], previous_end: float) -> dict[str, Any]:
    """One task's seconds in :data:`COLUMNS` (see the module's docstring)."""
    start, end = task["start"], task["end"]
    queued = task["queued"] or start
    events = [e for _, e in lines]
    ready = next((t for t, e in lines if e == "::endgroup::"), None)  # end of "Pre Execute"
    post = next((t for t, e in lines if e.startswith("::group::Post Execute")), None)
    out: dict[str, Any] = {
        "task": task["task"],
        "sched": max(0.0, queued - previous_end),
        "queue": max(0.0, start - queued),
        "total": end - start,
    }
    if ready is None:  # no log (a task that never ran its code): all of it is start-up
        out.update(startup=end - start, spark=0.0, work=0.0)
    else:
        out["startup"] = max(0.0, ready - start)
        session = next((t for t, e in lines if e.startswith(SESSION)), None)
        group = next((float(m.group(2)) for e in events if (m := GROUP.match(e))), None)
        if group is not None:
            units = 0.0
            for e in events:
                if (m := DONE.match(e)) is not None:
                    with contextlib.suppress(ValueError):  # a line cut at 500 characters: no figure
                        units += float(json.loads(m.group(1)).get("seconds", 0.0))
            units = min(units, group) if units else group
            out["spark"] = ((session - ready) if session else 0.0) + (group - units)
            out["work"] = units
        else:
            out["spark"] = 0.0
            out["work"] = max(0.0, (post or end) - ready)
    out["rest"] = max(0.0, out["total"] - out["startup"] - out["spark"] - out["work"])
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}


def breakdown(
    run: dict[str, Any], tasks: list[dict[str, Any]], logs: dict[str, list[tuple[float, str]]]
) -> dict[str, Any]:
    """Every task's split, the sums, and the run's own ends (trigger to first task, last task to run end)."""
    rows = []
    for task in tasks:
        if task["start"] is None or task["end"] is None:
            continue
        mark = task["queued"] or task["start"]
        ended = [t["end"] for t in tasks if t["end"] is not None and t["end"] <= mark]
        previous = max(ended, default=run["start"] or mark)
        rows.append(split(task, logs.get(task["task"], []), previous))
    sums = {c: round(sum(r[c] for r in rows), 3) for c in (*COLUMNS, "total")}
    first = min((t["queued"] or t["start"] for t in tasks if t["start"]), default=None)
    last = max((t["end"] for t in tasks if t["end"]), default=None)
    return {
        "tasks": rows,
        "sums": sums,
        "run_queued_to_start": round(run["start"] - run["queued"], 3) if run["queued"] else None,
        "run_start_to_first_task": round(first - run["start"], 3) if first and run["start"] else None,
        "last_task_to_run_end": round(run["end"] - last, 3) if last and run["end"] else None,
    }


def scheduler_breakdown(home: Path, dag_id: str, run_id: str | None = None) -> dict[str, Any]:
    """The split of one run under the scheduler, from ``home``'s database and task logs."""
    run, tasks = task_rows(home / "airflow.db", dag_id, run_id)
    logs = {t["task"]: scheduler_log(home, dag_id, run["run_id"], t) for t in tasks}
    return {"run_id": run["run_id"], **breakdown(run, tasks, logs)}


def dags_test_breakdown(home: Path, dag_id: str, log_path: Path) -> dict[str, Any]:
    """The split of the latest ``airflow dags test`` run of ``dag_id`` (its output in ``log_path``)."""
    run, tasks = task_rows(home / "airflow.db", dag_id)
    return {"run_id": run["run_id"], **breakdown(run, tasks, dags_test_logs(log_path))}


def table_lines(split_run: dict[str, Any], title: str) -> list[str]:
    """A text table, one row per task in start order, then the sums (seconds)."""
    head = f"{'task':<22}" + "".join(f"{c:>9}" for c in (*COLUMNS, "total"))
    lines = [f"where the seconds go: {title}", head]
    for row in split_run["tasks"]:
        lines.append(f"{row['task']:<22}" + "".join(f"{row[c]:>9.2f}" for c in (*COLUMNS, "total")))
    sums = split_run["sums"]
    lines.append(f"{'all tasks':<22}" + "".join(f"{sums[c]:>9.2f}" for c in (*COLUMNS, "total")))
    ends = [
        ("run queued -> started", split_run.get("run_queued_to_start")),
        ("run started -> first task queued", split_run.get("run_start_to_first_task")),
        ("last task -> run ended", split_run.get("last_task_to_run_end")),
    ]
    lines.append("; ".join(f"{name} {value:.2f} s" for name, value in ends if value is not None))
    return lines


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__)
        return 2
    home, dag_id = Path(argv[0]), argv[1]
    found = scheduler_breakdown(home, dag_id, argv[2] if len(argv) > 2 else None)
    print("\n".join(table_lines(found, f"{dag_id} {found['run_id']}")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""One DAG run's phases, each timed, through the same Spark jobs the DAG submits.

Order and calls as ``cdc_devtools.inline_run.run_snapshot`` (the
DAG's order), except that the write and read groups run as ``spark-submit``
of ``spark_jobs/cdc_phase.py --phase write|read --plan KEY --group N``, as
the DAG's mapped SparkSubmitOperator tasks do, with ``CDC_CONFIG`` naming
the config file. ``inline=True`` runs the groups in this process instead
(the same unit functions, no JVM), for quick checks. ``connect_url`` runs
them on a Spark Connect server as the DAG's connect-mode tasks
(``SparkConnectPhaseOperator``) do: ``connect_app.run_group`` from this
process, one client session per group (an Airflow task is a process of its
own, so it attaches to the server's shared session and adds the package each
time).

What a run returns: seconds per phase (wall), the Spark applications' own
figures (group seconds from ``stats/``, per-task seconds split into input
decoding, encoding, upload, fetch, merge and staging), shuffle and input
bytes, and, on S3, the requests of each phase counted on the server.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.expressions import EqualTo
from s3log import RequestLog
from sparkrun import PHASE_APPLICATION, dag_conf, spark_env, spark_submit

from cdc_devtools.inline_run import run_phase
from iceberg_cdc.config import CdcConfig
from iceberg_cdc.pipeline.groups import read_group_count
from iceberg_cdc.pipeline.plan import SnapshotPlan
from iceberg_cdc.pipeline.pyfiles import package_zip
from iceberg_cdc.run import steps


@dataclass
class PipelineSetup:
    label: str
    config_path: Path
    config: CdcConfig
    source: str
    logs: Path
    request_log: RequestLog | None = None  # set when the shuffle is on the local S3 server
    inline: bool = False
    connect_url: str | None = None  # run the groups on this Spark Connect server


class _Phases:
    """Wall seconds and (on S3) server-side requests of consecutive phases."""

    def __init__(self, request_log: RequestLog | None) -> None:
        self.request_log = request_log
        self.seconds: dict[str, float] = {}
        self.requests: dict[str, dict[str, dict[str, int]]] = {}
        self._start()

    def _start(self) -> None:
        self._mark = self.request_log.mark() if self.request_log else 0
        self._clock = time.perf_counter()

    def done(self, name: str) -> None:
        """End phase ``name`` and start the next one's clock."""
        self.seconds[name] = round(time.perf_counter() - self._clock, 3)
        if self.request_log:
            self.requests[name] = self.request_log.since(self._mark)
        self._start()

    def resume(self) -> None:
        """Start the next phase's clock (bench-only work before it is left out of every phase)."""
        self._start()


def _submit_groups(setup: PipelineSetup, phase: str, jobs: list[list[str]]) -> list[dict[str, Any]]:
    submits = []
    env = spark_env({"CDC_CONFIG": str(setup.config_path)})
    for args in jobs:
        group = args[args.index("--group") + 1]
        submit = spark_submit(
            f"{setup.label} {phase} {group}",
            PHASE_APPLICATION,
            args,
            logs=setup.logs,
            conf=dag_conf(),
            py_files=package_zip(),
            env=env,
        )
        submits.append({"group": int(group), "seconds": submit.seconds, "log": submit.log})
    return submits


def _connect_groups(setup: PipelineSetup, ctx: steps.Context, jobs: list[list[str]]) -> list[dict[str, Any]]:
    """The groups as ``SparkConnectPhaseOperator.execute`` runs them, each timed.

    A group's wall time splits into attaching the client session (lease check,
    its units, session + ``addArtifacts``: ``session_seconds``) and the job
    (``job_seconds``, the phase driver's own clock around the units).
    """
    from iceberg_cdc.pipeline import connect_app
    from iceberg_cdc.pipeline.spark_app import parse_args

    assert setup.connect_url is not None
    groups = []
    for job in jobs:
        args = parse_args([str(a) for a in job])
        # A DAG task is a process of its own: it starts without this process's cached session.
        connect_app.forget_session(setup.connect_url)
        started = time.perf_counter()
        run = connect_app.run_group(
            setup.connect_url, ctx.runtime, args.plan, args.phase, args.group, label=args.label
        )
        seconds = time.perf_counter() - started
        groups.append(
            {
                "group": args.group,
                "seconds": round(seconds, 3),
                "job_seconds": run.seconds,
                "session_seconds": round(seconds - run.seconds, 3),
            }
        )
    return groups


def _figures(ctx: steps.Context, plan: SnapshotPlan) -> dict[str, Any]:
    """What the phases left in the shuffle store: group documents, ranges, map output sizes."""
    store = ctx.runtime.store()
    paths = plan.paths
    groups: dict[str, list[dict[str, Any]]] = {"write": [], "read": []}
    for info in store.list(paths.prefix + "stats/"):
        document = json.loads(store.get(info.key))
        if document.get("phase") in groups:
            groups[document["phase"]].append(document)
    ranges = json.loads(store.get(paths.ranges))["ranges"]
    map_sizes = [info.size for info in store.list(paths.map_prefix) if info.key.endswith(".data")]
    return {"groups": groups, "ranges": ranges, "map_data_bytes": map_sizes}


def run_pipeline(setup: PipelineSetup) -> dict[str, Any]:
    """Process the source's next snapshot (the benchmark's copy-on-write snapshot), phase by phase."""
    ctx = steps.Context.of(setup.config, setup.source)
    run_id = f"bench__{setup.label}__{uuid.uuid4().hex[:8]}"
    phases = _Phases(setup.request_log)
    started = time.perf_counter()
    detected = steps.detect(ctx, run_id)
    phases.done("plan")
    if detected.action != "shuffle":
        steps.cleanup(ctx, detected, run_id)
        raise RuntimeError(f"{setup.label}: expected a snapshot with deletes to shuffle, got {detected}")
    store = ctx.runtime.store()
    plan = SnapshotPlan.load(store, detected.plan)
    submits: dict[str, list[dict[str, Any]]] = {}
    try:
        if setup.inline:
            run_phase(ctx, plan, "write", len(plan.groups))
        elif setup.connect_url:
            submits["write"] = _connect_groups(setup, ctx, detected.write_args)
        else:
            submits["write"] = _submit_groups(setup, "write", detected.write_args)
        phases.done("write")
        missing, failed = steps.missing_map_outputs(ctx, detected)
        if missing or failed:
            raise RuntimeError(f"{setup.label}: map outputs missing {missing}, failed {failed}")
        phases.done("barrier")
        read_jobs = steps.coalesce(ctx, detected)
        phases.done("coalesce")
        if setup.inline:
            run_phase(ctx, plan, "read", read_group_count(plan, store))
        elif setup.connect_url:
            submits["read"] = _connect_groups(setup, ctx, read_jobs)
        else:
            submits["read"] = _submit_groups(setup, "read", read_jobs)
        phases.done("read")
        figures = _figures(ctx, plan)
        phases.resume()
        committed = steps.commit(ctx, detected)
        steps.watermark(ctx, detected)
        phases.done("commit")
    finally:
        phases.resume()
        steps.cleanup(ctx, detected, run_id)
        phases.done("cleanup")
    total = time.perf_counter() - started
    return {
        "label": setup.label,
        "snapshot_id": plan.snapshot_id,
        "wall_seconds": round(total, 3),
        "phase_seconds": phases.seconds,
        "requests": phases.requests,
        "submits": submits,
        "committed": {k: v for k, v in committed.items() if k != "seconds"},
        "in_app_seconds": committed.get("seconds", {}),
        "write_tasks": len(plan.write_tasks),
        "input_files": sum(len(t.files) for t in plan.write_tasks),
        "input_file_bytes": sum(t.bytes for t in plan.write_tasks),
        "task_input_bytes": {t.task_id: t.bytes for t in plan.write_tasks},
        **figures,
    }


def sink_changes(catalog: Catalog, sink: str, snapshot_id: int, columns: list[str]) -> pa.Table:
    """The rows the pipeline committed for one source snapshot: source columns and ``_change_type``."""
    table = catalog.load_table(sink)
    scan = table.scan(row_filter=EqualTo("_commit_snapshot_id", snapshot_id))
    return scan.to_arrow().select([*columns, "_change_type"])


def _units(result: dict[str, Any], phase: str) -> list[dict[str, Any]]:
    units = [u for g in result["groups"][phase] for u in g["units"]]
    return [u["stats"] for u in units] if phase == "read" else units


def _span(units: list[dict[str, Any]]) -> float:
    return max(u["finished_at"] for u in units) - min(u["started_at"] for u in units) if units else 0.0


SUBMIT_OVERHEAD = "Spark app start/stop"
CONNECT_OVERHEAD = "session + job start"


def breakdown(result: dict[str, Any], *, connect: bool = False) -> dict[str, Any]:
    """Seconds per phase for the chart, the Spark applications' fixed cost, and per-task figures.

    A phase run as a Spark application is split into the application's fixed
    cost and the span of its tasks (first task start to last task end, from
    the tasks' own clocks). The fixed cost is everything else in the
    submit's wall time: JVM start, SparkSession, Python workers starting and
    importing the package, the driver's stop. The read application's task
    span is further split into fetch + merge and staging (the sink Parquet
    files) in proportion to the tasks' own clocks.

    ``connect``: the groups ran on a Spark Connect server; what is not the
    tasks' span is the client's session (attach, ``addArtifacts``), the lease
    check and the job's scheduling and Python workers ("session + job start",
    in ``spark_fixed_seconds`` too); ``connect`` in the result splits it into
    the session part and the job part.
    """
    overhead = CONNECT_OVERHEAD if connect else SUBMIT_OVERHEAD
    mib = float(1 << 20)
    seconds = result["phase_seconds"]
    writes, reads = _units(result, "write"), _units(result, "read")
    write_run, read_run = _span(writes), _span(reads)
    fetch_merge = sum(r["fetch_seconds"] + r["merge_seconds"] for r in reads)
    stage = sum(r["stage_seconds"] for r in reads)
    stage_share = stage / (fetch_merge + stage) if fetch_merge + stage else 0.0
    phases = {
        "plan": seconds["plan"],
        f"write: {overhead}": max(0.0, seconds["write"] - write_run),
        "write": write_run,
        "barrier": seconds["barrier"],
        "coalesce": seconds["coalesce"],
        f"read: {overhead}": max(0.0, seconds["read"] - read_run),
        "read + merge": read_run * (1 - stage_share),
        "stage": read_run * stage_share,
        "commit": seconds["commit"],
        "cleanup": seconds["cleanup"],
    }
    arrow_in = sum(w.get("read_arrow_bytes", w["input_bytes"]) for w in writes)
    engine_write = sum(w["encode_seconds"] + w["commit_seconds"] + w.get("cancel_seconds", 0) for w in writes)
    arrow_read = sum(r["arrow_bytes"] for r in reads)
    shuffle = sum(w["shuffle_bytes"] for w in writes)
    extra: dict[str, Any] = {}
    if connect:
        groups = [g for phase in ("write", "read") for g in result["submits"].get(phase, [])]
        extra["connect"] = {
            "groups": len(groups),
            "session_seconds": round(sum(g["session_seconds"] for g in groups), 3),
            "job_seconds": round(sum(g["job_seconds"] for g in groups), 3),
            "job_start_seconds": round(sum(g["job_seconds"] for g in groups) - write_run - read_run, 3),
        }
    return {
        **extra,
        "overhead": overhead,
        "phases": {k: round(v, 3) for k, v in phases.items()},
        "spark_fixed_seconds": round(phases[f"write: {overhead}"] + phases[f"read: {overhead}"], 3),
        "tasks": {
            "write_tasks": len(writes),
            "read_ranges": len(reads),
            "write_task_seconds": round(sum(w["seconds"] for w in writes), 3),
            "write_read_input_seconds": round(sum(w["read_seconds"] for w in writes), 3),
            "write_cancel_seconds": round(sum(w.get("cancel_seconds", 0) for w in writes), 3),
            "write_encode_seconds": round(sum(w["encode_seconds"] for w in writes), 3),
            "write_commit_seconds": round(sum(w["commit_seconds"] for w in writes), 3),
            "read_fetch_seconds": round(sum(r["fetch_seconds"] for r in reads), 3),
            "read_merge_seconds": round(sum(r["merge_seconds"] for r in reads), 3),
            "read_stage_seconds": round(stage, 3),
            "write_engine_mb_s_per_core": round(arrow_in / mib / max(engine_write, 1e-9), 1),
            "read_merge_mb_s_per_core": round(arrow_read / mib / max(fetch_merge, 1e-9), 1),
            "write_peak_rss_mb": max((w["peak_rss_mb"] for w in writes), default=0.0),
            "read_peak_rss_mb": max((r["peak_rss_mb"] for r in reads), default=0.0),
        },
        "bytes": {
            "input_file_bytes": result["input_file_bytes"],
            "input_arrow_bytes": arrow_in,
            "shuffle_bytes": shuffle,
            "shuffle_to_input_files": round(shuffle / max(result["input_file_bytes"], 1), 3),
            "shuffle_to_input_arrow": round(shuffle / max(arrow_in, 1), 3),
        },
        "rows": {
            **{
                key: sum(r.get(key, 0) for r in reads)
                for key in ("input_rows", "deletes", "inserts", "updates", "carryover_rows")
            },
            "cancelled_before_shuffle": sum(w.get("cancelled_rows", 0) for w in writes),
            "cancelled_by_lineage": sum(w.get("cancelled_by_lineage", 0) for w in writes),
        },
    }


def expected_reads(result: dict[str, Any]) -> dict[str, int]:
    """Requests the design promises: one ranged GET per (read range, non-empty map output span), one GET per index."""
    spans = sum(1 for r in result["ranges"] for s in r["spans"] if s["offsets"][-1] > s["offsets"][0])
    return {"data_range_gets": spans, "index_gets": result["write_tasks"]}

"""One phase group on a Spark Connect server: the driver runs here, in the Airflow worker, as a client.

The group's units (exactly :func:`~iceberg_cdc.pipeline.groups.units_of`)
run as one Spark job on a long-running Spark Connect server, one Spark task
per unit: ``spark.range(n, numPartitions=n)`` numbers them, and ``mapInArrow``
calls the phase's unit function (:data:`~iceberg_cdc.pipeline.groups.PHASE_FUNCTIONS`)
on each number's unit; results come back as JSON strings. No JVM starts
here: attaching to a session takes a few tenths of a second and a job on
warm Python workers well under a second (``bench/latency.py``).

The steps around the job -- lease check, heartbeat that cancels the job
(``interruptTag``) on a lost lease, failure markers, figures -- are the
spark-submit driver's (:mod:`.phase_driver`).

**What reaches the server.** The package: the ``--py-files`` archive of
:mod:`iceberg_cdc.pipeline.pyfiles`, added with ``addArtifacts(pyfile=True)``
once per process and session (:mod:`.connect_sessions`: one shared session
per package version, so the server's Python workers stay warm). The plan, the units and the :class:`~iceberg_cdc.pipeline.runtime.Runtime`
(with the storage credentials) travel only inside the pickled function -- a
bytes field of the plan, which the server's UI and logs abbreviate to a few
bytes -- never in DataFrame literals, SQL text or session conf, which the
server shows.

**Errors.** A unit's exception is re-raised on the server's Python worker
with a one-line JSON marker (type and message); here it becomes the same
pipeline exception again (``AmbiguousUpdateError: key ...``), with the
worker's traceback logged, instead of a gRPC error around a Python traceback
(:mod:`.connect_errors`).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
import uuid
from collections.abc import Callable
from typing import Any

from iceberg_cdc.error_lines import line_of
from iceberg_cdc.errors import ConnectJobError, UnitFailed
from iceberg_cdc.pipeline import worker_heap
from iceberg_cdc.pipeline.connect_errors import (
    MARKER,
    TRACE_MARKER,
    describe,
    job_error,
    unit_error,
    unit_failure,
    url_secrets,
)
from iceberg_cdc.pipeline.connect_sessions import (
    close_sessions,
    forget_session,
    session,
    shared_session_id,
    with_session_id,
)
from iceberg_cdc.pipeline.groups import PHASE_FUNCTIONS
from iceberg_cdc.pipeline.phase_driver import GroupRun, run_phase_group
from iceberg_cdc.pipeline.plan import SnapshotPlan
from iceberg_cdc.pipeline.runtime import Runtime

log = logging.getLogger("iceberg_cdc.spark")

# --- on the server's Python workers ------------------------------------------------------------


def _unit_mapper(phase: str, plan: SnapshotPlan, runtime: Runtime, units: list[Any]):
    """The function ``mapInArrow`` pickles: unit numbers in, ``(unit, result JSON)`` batches out."""
    function = PHASE_FUNCTIONS[phase]

    def run_units(batches):
        import pyarrow as pa

        worker_heap.keep_worker_memory()
        for batch in batches:
            numbers = batch.column(0).to_pylist()
            results = []
            for number in numbers:
                try:
                    results.append(json.dumps(function(plan, runtime, units[number])))
                except Exception as exc:
                    info = {
                        "type": type(exc).__name__,
                        "module": type(exc).__module__,
                        "message": str(exc),
                        "unit": number,
                    }
                    # Two lines: the first (type, message) stays whole even if a long report is cut.
                    trace = "".join(traceback.format_exception(exc))[-8000:]
                    raise UnitFailed(
                        f"{MARKER}{json.dumps(info)}\n{TRACE_MARKER}{json.dumps(trace)}"
                    ) from exc
            yield pa.RecordBatch.from_arrays(
                [pa.array(numbers, pa.int64()), pa.array(results, pa.string())], names=["unit", "result"]
            )
        worker_heap.settle_worker_heap()  # by reference: its state lives in the worker's module

    run_units.__name__ = run_units.__qualname__ = f"cdc_{phase}_units"
    return run_units


class ConnectUnitRunner:
    """The group's units as one ``mapInArrow`` job, one Spark task per unit, on a Connect session."""

    def __init__(self, spark: Any, url: str, group: int) -> None:
        self.spark = spark
        self.url = url
        self.group = group
        self.tag = f"cdc-{uuid.uuid4().hex[:16]}"

    def map_units(self, phase: str, plan: SnapshotPlan, runtime: Runtime, units: list[Any]) -> list[Any]:
        if not units:
            return []
        frame = self.spark.range(0, len(units), 1, len(units)).mapInArrow(
            _unit_mapper(phase, plan, runtime, list(units)), "unit long, result string"
        )
        self.spark.addTag(self.tag)
        try:
            table = frame.toArrow()
        except Exception as exc:
            error = job_error(exc, phase, self.group, self.url)
            log.error("%s group %d failed: %s: %s", phase, self.group, type(error).__name__, error)
            info = unit_failure(exc)
            if info is not None:
                log.info(
                    "unit %s's traceback on the Spark Connect server:\n%s", info["unit"], info["traceback"]
                )
            else:
                log.info("the Spark Connect server's report:\n%s", str(exc)[-8000:])
                forget_session(self.url)  # the server may have restarted: a retry opens a new session
            raise error from None
        finally:
            self.spark.removeTag(self.tag)
        by_unit = dict(zip(table.column("unit").to_pylist(), table.column("result").to_pylist(), strict=True))
        missing = sorted(set(range(len(units))) - set(by_unit))
        if missing:
            raise ConnectJobError(f"{phase} group {self.group + 1}: no result for units {missing}")
        return [json.loads(by_unit[i]) for i in range(len(units))]

    def cancel(self) -> None:
        try:
            interrupted = self.spark.interruptTag(self.tag)
        except Exception as exc:  # called from the heartbeat's thread: report, never raise there
            log.warning("could not interrupt the Spark Connect job %s: %s", self.tag, exc)
        else:
            log.warning("interrupted the Spark Connect job %s (%d operation(s))", self.tag, len(interrupted))


def run_group(
    url: str,
    runtime: Runtime,
    plan_key: str,
    phase: str,
    group: int,
    *,
    label: str = "",
    on_runner: Callable[[ConnectUnitRunner], None] | None = None,
) -> GroupRun:
    """Run one phase group on the Spark Connect server at ``url``; raises the pipeline's errors.

    ``on_runner`` is handed the group's runner as soon as it exists, so a
    caller that is told to stop (Airflow's ``on_kill``) can interrupt the
    group's job with :meth:`ConnectUnitRunner.cancel`.
    """
    from iceberg_cdc.pipeline.pyfiles import package_digest, package_zip

    def start_runner(plan: SnapshotPlan) -> ConnectUnitRunner:
        try:
            spark = session(url, package_zip(), package_digest())
        except Exception as exc:
            first = line_of(exc, secrets=url_secrets(url))
            raise ConnectJobError(
                f"cannot open a Spark Connect session on {describe(url)}: {first}"
            ) from None
        log.info("Spark Connect session on %s", describe(url))
        runner = ConnectUnitRunner(spark, url, group)
        if on_runner is not None:
            on_runner(runner)
        return runner

    return run_phase_group(runtime, plan_key, phase, group, start_runner, label=label)


def main(argv: list[str] | None = None) -> int:
    """``python -m iceberg_cdc.pipeline.connect_app --remote sc://host:port --phase ... --plan ... --group N``."""
    from iceberg_cdc.config import load_config
    from iceberg_cdc.pipeline.runtime import runtime_from_config
    from iceberg_cdc.pipeline.spark_app import parse_args

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else list(argv)
    remote = os.environ.get("SPARK_REMOTE")
    if "--remote" in argv:
        at = argv.index("--remote")
        remote = argv[at + 1]
        del argv[at : at + 2]
    if not remote:
        print("error: give --remote sc://host:port (or set SPARK_REMOTE)", file=sys.stderr)
        return 2
    args = parse_args(argv)
    runtime = runtime_from_config(load_config(args.config))
    try:
        run_group(remote, runtime, args.plan, args.phase, args.group, label=args.label)
    except Exception as exc:
        log.error("%s group %d failed: %s: %s", args.phase, args.group, type(exc).__name__, exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "MARKER",
    "TRACE_MARKER",
    "ConnectUnitRunner",
    "close_sessions",
    "describe",
    "forget_session",
    "job_error",
    "run_group",
    "session",
    "shared_session_id",
    "unit_error",
    "unit_failure",
    "with_session_id",
]

"""Airflow listener: the scheduler imports the tasks' modules once, so every forked task process has them.

Airflow's LocalExecutor forks its worker processes from the scheduler when
the scheduler starts, and each worker forks one process per task (Task SDK,
``supervisor._fork_main``). A task process then parses the DAG file and runs
the task, importing what it needs: the Spark provider, pyiceberg, pyarrow,
boto3, the pipeline's step modules. Measured under ``bench/latency.py``, that
was about 0.3-0.5 s of every task's start (``Worker startup parse complete
dag_file_parse_ms=285-474``) plus a few tenths inside light tasks (detect,
coalesce, cleanup), for 11 tasks in a row per snapshot. Imported once in the
scheduler before it forks, the modules are in every task process already
(copy-on-write pages, no second import).

Only a scheduler whose executor forks (multiprocessing's ``fork`` start
method, Linux's default) gains; elsewhere nothing is imported. Importing
starts no thread and opens no connection (checked for each module: pyarrow's
pools, gRPC's core and botocore's sessions start on first use), so the forks
are as safe as Airflow's own. ``CDC_TASK_PRELOAD=false`` turns it off (docs/operating.md).
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing
import os
import sys
import time
from typing import Any

from airflow.listeners import hookimpl

log = logging.getLogger(__name__)

# What a task process imports when it parses the DAG file and runs a CDC task, heaviest first.
TASK_MODULES = (
    "iceberg_cdc.airflow.dags",
    "iceberg_cdc.run.steps",
    "iceberg_cdc.run.lease",
    "iceberg_cdc.pipeline.connect_app",
    "iceberg_cdc.pipeline.groups",
    "airflow.providers.apache.spark.operators.spark_submit",
    "airflow.providers.standard.operators.python",
    "airflow.providers.standard.operators.trigger_dagrun",
    "pyiceberg.catalog.sql",
    "boto3",
)


def enabled(argv: list[str], executors: str, env: dict[str, str]) -> bool:
    """Preload in ``airflow scheduler`` with a LocalExecutor that forks, unless ``CDC_TASK_PRELOAD`` says false.

    ``on_starting`` gets a bare ``Job`` (its type is set later, by the job's
    runner), so the command line says which component this is.
    """
    if env.get("CDC_TASK_PRELOAD", "true").strip().lower() in {"0", "false", "no", "off"}:
        return False
    if argv[1:2] != ["scheduler"] or "LocalExecutor" not in executors:
        return False
    return multiprocessing.get_start_method(allow_none=True) in (None, "fork")


def preload(modules: tuple[str, ...] = TASK_MODULES) -> list[str]:
    """Import ``modules``; the ones that failed (named in the log, never raised: a listener must not stop
    the scheduler)."""
    failed = []
    started = time.perf_counter()
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # a missing optional module: its tasks import it themselves, as before
            failed.append(name)
            log.warning("task preload: %s not imported (%s: %s)", name, type(exc).__name__, exc)
    log.info(
        "task preload: %d of %d task modules imported in %.2f s before the executor forks",
        len(modules) - len(failed),
        len(modules),
        time.perf_counter() - started,
    )
    return failed


_done = False  # set in the scheduler; its forks (the task processes, which start too) inherit it


@hookimpl
def on_starting(component: Any) -> None:
    global _done
    if _done:
        return
    _done = True
    try:
        from airflow.configuration import conf

        executors = conf.get("core", "executor", fallback="")
    except Exception:  # a listener must not stop the component
        return
    if enabled(sys.argv, executors, dict(os.environ)):
        preload()

"""The operators of the mapped Spark tasks, one per ``spark.mode``, with errors first.

``submit``: :class:`~iceberg_cdc.airflow.operators.spark_submit.CdcSparkSubmitOperator`
(its own module, imported only in submit mode). ``connect``: :class:`SparkConnectPhaseOperator`,
which runs the same group from this worker as a Spark Connect client. Both
take the same ``application_args`` (``--phase --plan --group --label``), so the
mapped tasks expand, and are labelled, exactly alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator

from iceberg_cdc.airflow.hooks.cdc import CdcHook
from iceberg_cdc.airflow.operators.phases import phases_known
from iceberg_cdc.airflow.policy import final_errors
from iceberg_cdc.config import CdcConfig
from iceberg_cdc.pipeline.submit_conf import submit_conf

_REPO_APPLICATION = Path(__file__).resolve().parents[4] / "spark_jobs" / "cdc_phase.py"
_PACKAGE_APPLICATION = Path(__file__).resolve().parents[1] / "spark_entry.py"


def spark_application() -> str:
    return str(_REPO_APPLICATION if _REPO_APPLICATION.exists() else _PACKAGE_APPLICATION)


# The plan's label (last of the application arguments) names each mapped Spark task in the UI.
MAP_INDEX_TEMPLATE = "{{ task.application_args[-1] }}"


def spark_options(config: CdcConfig) -> dict[str, Any]:
    return {
        "application": spark_application(),
        "conn_id": config.spark.conn_id,
        # Built when a task runs (CdcSparkSubmitOperator.execute), never at DAG parse: hashing the
        # package's files on every parse would cost each DAG processor loop for nothing.
        "py_files": None,
        "conf": submit_conf(config.spark.conf),
        "driver_memory": config.spark.driver_memory,
        "executor_memory": config.spark.executor_memory,
        "verbose": False,
        "map_index_template": MAP_INDEX_TEMPLATE,
    }


class SparkConnectPhaseOperator(BaseOperator):
    """One phase group run from this worker as a Spark Connect client (``spark.mode: connect``).

    Takes the spark-submit task's ``application_args`` (``--phase --plan
    --group --label``), so the mapped tasks expand, and are labelled, exactly
    alike in both modes. Errors from the units arrive as the pipeline's own
    exceptions; those no retry can fix fail the task at once.
    """

    template_fields = ("application_args",)
    ui_color = "#fbd5a5"

    def __init__(
        self, *, application_args: list[str] | None = None, conn_id: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.application_args = list(application_args or [])
        self.conn_id = conn_id
        self._runners: list[Any] = []

    def execute(self, context: Any) -> None:
        from iceberg_cdc.pipeline import connect_app
        from iceberg_cdc.pipeline.spark_app import parse_args

        phases_known()
        args = parse_args([str(a) for a in self.application_args])
        with final_errors():
            hook = CdcHook()
            connect_app.run_group(
                hook.spark_connect_url(self.conn_id),
                hook.runtime(),
                args.plan,
                args.phase,
                args.group,
                label=args.label,
                on_runner=self._runners.append,
            )

    def on_kill(self) -> None:
        """Airflow stops the task (marked failed or cleared, timed out, SIGTERM): stop its job on the server.

        The task runner calls this from its SIGTERM handler (and after an
        ``execution_timeout``); without it the Connect server would run the
        group's job to its end for nobody. Only this task's job is
        interrupted, by its tag: the server session is shared by every task
        of the package version, so ``interruptAll`` would stop the others too.
        """
        runners = getattr(self, "_runners", [])
        if not runners:
            self.log.info("on_kill: no Spark Connect job started yet; nothing to interrupt")
            return
        for runner in runners:
            runner.cancel()  # logs and never raises: a kill must not fail over a lost connection


def submits_applications(config: CdcConfig) -> bool:
    """Whether the mapped Spark tasks are spark-submit applications (which take a ``name``), not Connect jobs."""
    return config.spark.mode != "connect"


def phase_operator(config: CdcConfig) -> tuple[type[BaseOperator], dict[str, Any]]:
    """The mapped Spark tasks' operator and its fixed arguments, by ``spark.mode``.

    The spark-submit operator's module is imported only in submit mode: the
    provider's module pulls in OpenLineage and Airflow's ORM models (about
    0.7 s, 2 s on a loaded host), and every task process parses the DAG file.
    """
    if not submits_applications(config):
        options = {"conn_id": config.spark.connect_conn_id, "map_index_template": MAP_INDEX_TEMPLATE}
        return SparkConnectPhaseOperator, options
    from iceberg_cdc.airflow.operators.spark_submit import CdcSparkSubmitOperator

    return CdcSparkSubmitOperator, spark_options(config)

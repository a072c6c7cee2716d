"""OpenLineage for the pipeline's tasks: which source snapshot went into which changelog snapshot.

The Airflow OpenLineage provider (``apache-airflow-providers-openlineage``)
asks each finished task for its lineage through
``get_openlineage_facets_on_complete``. ``@task`` functions have none, so the
DAG's ``detect`` and ``commit`` are built with :func:`lineage_task`, the same
decorator with an operator class that answers:

* **detect** -- input: the source table, version = the snapshot the run processes,
  with the range read (``icebergCdc_snapshotRange``: after its parent, through it);
* **commit** -- input: the same; output: the changelog (sink) table, version =
  the sink snapshot holding that source snapshot's changes, with the rows
  written (``outputStatistics``).

A run with nothing pending reports no datasets. Dataset names follow
:mod:`iceberg_cdc.lineage` (the table's storage location, plus the catalog
identifier as a symlink).

* **apply** of a mirror DAG -- input: the changelog, version = the changelog
  snapshot the apply reached, with the range (after the mirror's previous
  mark, through that snapshot: every changelog snapshot applied); output: the mirror
  (:func:`iceberg_cdc.lineage.mirror_dataset`: an Iceberg table by its
  location, version = the mirror snapshot; a PostgreSQL table as
  ``postgres://host:port`` / ``database.schema.table``), with the rows
  written.
* **verify** of a mirror DAG -- input: the mirror, with a
  ``dataQualityAssertions`` facet (``equal_to_source``), when a verification
  ran (:func:`iceberg_cdc.lineage.verify_datasets`, which ``make verify``
  sends too).

Nothing here runs unless the provider is installed and configured (a
transport): without it no extractor calls these methods.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from airflow.providers.common.compat.sdk import DecoratedOperator, task_decorator_factory
from airflow.providers.standard.operators.python import PythonOperator

from iceberg_cdc.lineage import DatasetRef, iceberg_dataset, mirror_dataset, read_range, verify_datasets
from iceberg_cdc.lineage_events import input_dataset, output_dataset

log = logging.getLogger("iceberg_cdc")


def operator_lineage(inputs: Sequence[DatasetRef], outputs: Sequence[DatasetRef]) -> Any:
    """The provider's ``OperatorLineage`` for these datasets."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    return OperatorLineage(
        inputs=[input_dataset(ref) for ref in inputs], outputs=[output_dataset(ref) for ref in outputs]
    )


class LineageReporting:
    """Mixin: an operator that reports :meth:`lineage_datasets` to OpenLineage when it completes."""

    def lineage_datasets(self, task_instance: Any) -> tuple[list[DatasetRef], list[DatasetRef]]:
        return [], []

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        inputs, outputs = self.lineage_datasets(task_instance)
        return operator_lineage(inputs, outputs)


class ChangelogLineageOperator(LineageReporting, DecoratedOperator, PythonOperator):
    """The ``@task`` operator (as :func:`airflow.sdk.task` builds it) that reports the run's datasets.

    ``lineage``: ``"input"`` (the source at the run's snapshot),
    ``"changelog"`` (that, and the sink at the commit's snapshot) or
    ``"mirror"`` (a mirror DAG's apply: the changelog in, the mirror out), from
    detect's result and this task's, kept on the operator when it ran.
    """

    custom_operator_name = "@task"
    template_fields: Sequence[str] = ("templates_dict", "op_args", "op_kwargs")

    def __init__(self, *, python_callable, op_args, op_kwargs, lineage: str = "changelog", **kwargs) -> None:
        super().__init__(
            kwargs_to_upstream={
                "python_callable": python_callable,
                "op_args": op_args,
                "op_kwargs": op_kwargs,
            },
            python_callable=python_callable,
            op_args=op_args,
            op_kwargs=op_kwargs,
            **kwargs,
        )
        self.lineage = lineage

    def execute(self, context: Any) -> Any:
        """Run the task; keep what the lineage needs on the operator, which the provider's listener sees."""
        result = super().execute(context)
        # The provider asks for lineage in a forked process with a time limit, where talking to
        # Airflow (an XCom pull) may hang: everything it needs is kept here, in memory.
        self._lineage_detected = (
            result if self.lineage == "input" else context["ti"].xcom_pull(task_ids="detect")
        )
        self._lineage_committed = result if self.lineage in ("changelog", "mirror", "verify") else None
        return result

    def lineage_datasets(self, task_instance: Any) -> tuple[list[DatasetRef], list[DatasetRef]]:
        detected = getattr(self, "_lineage_detected", None) or {}
        committed = getattr(self, "_lineage_committed", None)
        if self.lineage == "verify":  # a mirror's detect has no snapshot_id: its result says what ran
            return verify_datasets(detected, committed if isinstance(committed, dict) else None)
        if self.lineage != "mirror" and detected.get("snapshot_id") is None:  # caught up: no datasets
            return [], []
        if self.lineage == "mirror":
            if detected.get("action") != "apply":  # caught up: no datasets
                return [], []
            return mirror_datasets(detected, committed if isinstance(committed, dict) else None)
        return changelog_datasets(detected, committed if isinstance(committed, dict) else None)


def changelog_datasets(
    detected: dict[str, Any], committed: dict[str, Any] | None
) -> tuple[list[DatasetRef], list[DatasetRef]]:
    """Source at the processed snapshot; with ``committed``, the sink at its commit's snapshot too.

    Only XComs and the config file: the provider runs this in a short-lived
    process with a time limit after the task, so it makes no catalog call.
    """
    from iceberg_cdc.config import load_config

    catalog = load_config().catalog
    source = iceberg_dataset(
        catalog, detected["source"], detected["source_location"], version=detected["snapshot_id"]
    )
    bridge = (detected.get("bridge") or {}).get("reason")  # a bridge over a gap: from the watermark's
    inputs = [read_range(source, detected.get("base_snapshot_id"), bridge)]
    outputs = []
    if committed is not None:
        rows = (committed.get("conservation") or {}).get("change_rows") if committed.get("committed") else 0
        outputs.append(
            iceberg_dataset(
                catalog,
                detected["sink"],
                detected["sink_location"],
                version=committed.get("sink_snapshot_id"),
                rows=rows,
            )
        )
    return inputs, outputs


def mirror_datasets(
    detected: dict[str, Any], applied: dict[str, Any] | None
) -> tuple[list[DatasetRef], list[DatasetRef]]:
    """The changelog at the snapshot a mirror apply reached; with ``applied``, the mirror it wrote too.

    Like :func:`changelog_datasets`: XComs and the config file only.
    """
    from iceberg_cdc.config import load_config

    config = load_config()
    through, base = detected.get("through") or {}, detected.get("base") or {}
    changelog = iceberg_dataset(
        config.catalog,
        detected["changelog"],
        detected["changelog_location"],
        version=through.get("changelog_snapshot_id"),
    )
    inputs = [read_range(changelog, base.get("changelog_snapshot_id"))]
    if applied is None:
        return inputs, []
    mirror = config.table(detected["source"]).mirror(detected["mirror"])
    written = applied.get("upserted", applied.get("rows.upserted"))
    committed = applied.get("applied", applied.get("committed"))
    target = mirror_dataset(
        mirror.model_dump(include={"type", "table", "dsn", "conn_id"}),
        config.catalog,
        location=applied.get("mirror_location"),
    )
    outputs = [
        replace(
            target,
            version=applied.get("mirror_snapshot_id") if mirror.type == "iceberg" else None,
            rows=int(written or 0) if committed else 0,
        )
    ]
    return inputs, outputs


def lineage_task(python_callable=None, **kwargs: Any):
    """``@task`` whose operator reports OpenLineage datasets (``lineage="input"`` or ``"changelog"``)."""
    return task_decorator_factory(
        python_callable=python_callable, decorated_operator_class=ChangelogLineageOperator, **kwargs
    )

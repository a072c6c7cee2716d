"""Every phase a mapped Spark task may run, made known where the task runs (both Spark modes)."""

from __future__ import annotations


def phases_known() -> None:
    """Make every phase a mapped Spark task may run known in this process: the Iceberg mirror's too.

    Called where a task runs, never at import: the DAG files import the operators' modules,
    and the mirror's phase pulls in the task-only modules (pyiceberg, pyarrow).
    """
    from iceberg_cdc.mirror.iceberg import phase as mirror_phase

    mirror_phase.register()

"""What the tests ask of Airflow that its versions spell differently: parse a DAG folder, serialize a DAG.

Only tests parse DAG folders and serialize DAGs as the DAG processor does;
the product's own Airflow shims are in :mod:`iceberg_cdc.airflow.compat`.
"""

from __future__ import annotations

from typing import Any


def serialized_dag(dag: Any) -> dict[str, Any]:
    """What the DAG processor stores for ``dag`` (trigger kwargs included): a check that it serializes."""
    try:  # Airflow >= 3.2
        from airflow.serialization.serialized_objects import DagSerialization
    except ImportError:  # Airflow 3.1
        from airflow.serialization.serialized_objects import SerializedDAG as DagSerialization

    return DagSerialization.to_dict(dag)  # type: ignore[no-any-return]


def dag_bag(dag_folder: str) -> Any:
    """The DAGs of ``dag_folder`` as Airflow's DAG processor parses them (without example DAGs)."""
    try:  # Airflow >= 3.2
        from airflow.dag_processing.dagbag import DagBag

        return DagBag(dag_folder=dag_folder)
    except ImportError:  # Airflow 3.1: models.dagbag, examples included unless told
        from airflow.models.dagbag import DagBag

        return DagBag(dag_folder=dag_folder, include_examples=False)

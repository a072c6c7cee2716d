"""Airflow-facing pieces: the task callables, the barrier sensor and the DAG factory."""

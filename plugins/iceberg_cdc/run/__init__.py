"""The steps of a DAG run, Airflow-free: detect, the shuffle's barrier check and coalesce, commit,
watermark, cleanup, and what a run may do by how it was started.

Airflow calls these through :mod:`iceberg_cdc.airflow`; tests and the in-process runner
(:mod:`.inline`) call them directly. Nothing here imports Airflow.
"""

"""Local tooling: run the DAGs through the Airflow CLI on one machine (sync, demo, tests)."""

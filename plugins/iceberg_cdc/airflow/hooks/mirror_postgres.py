"""A PostgreSQL mirror's ``conn_id`` as a DSN, read through the Airflow Postgres provider.

Importing this module registers the resolver with the Airflow-free core
(:func:`iceberg_cdc.mirror.postgres.connection.set_conn_resolver`): the mirror
DAG's tasks, the CDC view and ``make sync`` import it. The DSN holds the
connection's password; it goes to libpq only, never to logs or XCom.
"""

from __future__ import annotations

from iceberg_cdc.mirror.postgres.connection import set_conn_resolver


def postgres_uri(conn_id: str) -> str:
    """The connection's URI for libpq (the hook gives SQLAlchemy's form, ``postgresql+psycopg://``)."""
    from airflow.providers.postgres.hooks.postgres import PostgresHook

    uri = PostgresHook(postgres_conn_id=conn_id).get_uri()
    scheme, sep, rest = uri.partition("://")
    return f"{scheme.split('+', 1)[0]}{sep}{rest}"


set_conn_resolver(postgres_uri)

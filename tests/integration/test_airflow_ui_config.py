"""``make airflow`` (scripts/airflow_ui.py) configures make demo's mirrors, on servers it starts and stops.

Without the mirrors the UI path shows no mirror DAG and an empty Mirrors
section; this checks the config the script writes, on its real servers (a
local S3 server and embedded PostgreSQL), without starting Airflow.
"""

from __future__ import annotations

import contextlib
import socket
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest

from iceberg_cdc.config import load_config
from iceberg_cdc.mirror.postgres.connection import connect

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture
def airflow_ui(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import airflow_ui

    yield airflow_ui
    for name in ("airflow_ui", "demo"):
        sys.modules.pop(name, None)


def answers(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def test_make_airflow_writes_both_demo_mirrors_and_stops_its_postgresql(airflow_ui, tmp_path):
    with contextlib.ExitStack() as servers:
        config = load_config(airflow_ui.start_servers(servers, tmp_path))
        [table] = config.tables
        mirrors = [(m.mirror_name, m.type, m.table) for m in table.mirrors]
        expected = [("pg", "postgres", "public.orders"), ("iceberg", "iceberg", "shop.orders_mirror")]
        assert mirrors == expected
        dsn = table.mirrors[0].dsn
        connection = connect(dsn)  # the PostgreSQL mirror's server is up and takes its DSN
        try:
            cursor = connection.cursor()
            cursor.execute("SELECT 1")
            assert cursor.fetchone()[0] == 1
        finally:
            connection.close()
        dag_ids = airflow_ui.mirror_dag_ids(config)
        assert dag_ids == [f"cdc_mirror__shop__orders__{name}" for name, _, _ in expected]
        banner = airflow_ui.mirrors_banner(config)
        assert all(dag_id in banner for dag_id in dag_ids) and "public.orders" in banner
    assert not answers(urlparse(dsn).port), "PostgreSQL still answers after make airflow stopped"

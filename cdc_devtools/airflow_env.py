"""Environment for running this repository's DAGs with the Airflow CLI on one machine.

Airflow reads its settings from ``AIRFLOW__*`` variables, so a self-contained
home (SQLite metadata database, this repo's ``dags/`` and ``plugins/``, a
local Spark connection, and a Spark Connect connection when one is given) is
just an environment. ``airflow dags test`` then runs a whole DAG run in one
process, spark-submit (or the Spark Connect client) included.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


def connect_connection(url: str) -> str:
    """An Airflow ``spark_connect`` connection (JSON, for ``AIRFLOW_CONN_*``) to ``sc://host:port``."""
    parsed = urlparse(url)
    document: dict[str, object] = {"conn_type": "spark_connect", "host": f"sc://{parsed.hostname}"}
    if parsed.port:
        document["port"] = parsed.port
    return json.dumps(document)


def connection_env_var(conn_id: str) -> str:
    return f"AIRFLOW_CONN_{conn_id.upper()}"


def airflow_env(
    home: str | os.PathLike[str],
    config_path: str | os.PathLike[str],
    *,
    spark_master: str = "local[2,4]",
    connect_url: str | None = None,
    connect_conn_id: str = "spark_connect_default",
) -> dict[str, str]:
    """The environment; ``connect_url`` also defines the ``spark_connect`` connection ``connect_conn_id``."""
    home = Path(home).resolve()
    env = dict(os.environ)
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": env.get("AIRFLOW__LOGGING__LOGGING_LEVEL", "INFO"),
            "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "120",
            "CDC_CONFIG": str(Path(config_path).resolve()),
            "CDC_SENSOR_MODE": "poke",
            "CDC_PACKAGE_CACHE": str(home / "packages"),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "plugins"), env.get("PYTHONPATH")])),
            "PATH": os.pathsep.join([str(VENV_BIN), env.get("PATH", "")]),
        }
    )
    env.setdefault("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": spark_master}))
    if connect_url:
        env[connection_env_var(connect_conn_id)] = connect_connection(connect_url)
    return env


def ensure_airflow_db(env: dict[str, str]) -> None:
    """Create (or upgrade) the metadata database once per home."""
    marker = Path(env["AIRFLOW_HOME"]) / ".db-ready"
    if marker.exists():
        return
    Path(env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [str(VENV_BIN / "airflow"), "db", "migrate"], env=env, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    marker.touch()


def dags_test(env: dict[str, str], dag_id: str, conf: dict | None = None, log_file=None) -> int:
    """Run one DAG run with ``airflow dags test``; returns the CLI's exit code."""
    command = [str(VENV_BIN / "airflow"), "dags", "test", dag_id]
    if conf:
        command += ["-c", json.dumps(conf)]
    result = subprocess.run(command, env=env, stdout=log_file, stderr=subprocess.STDOUT if log_file else None)
    return result.returncode


PASSWORDS_FILE_NAME = "simple_auth_manager_passwords.json.generated"  # Airflow's own name for it
LOGIN_USER = "admin"


def login_env(
    env: dict[str, str], passwords_file: str | os.PathLike[str], user: str = LOGIN_USER
) -> dict[str, str]:
    """Login on: Airflow's simple auth manager with one admin user (``env`` is changed and returned).

    Airflow generates the user's password the first time its API server
    starts, prints it once and keeps it in ``passwords_file`` (its own JSON
    file, ``{"admin": "<password>"}``); later starts reuse it. Without a valid
    token or the UI's cookie, Airflow's API and the CDC view answer 401/403.
    """
    env.update(
        {
            "AIRFLOW__CORE__AUTH_MANAGER": (
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
            ),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{user}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(Path(passwords_file).resolve()),
        }
    )
    return env


def login_password(passwords_file: str | os.PathLike[str], user: str = LOGIN_USER) -> str | None:
    """The user's password from the simple auth manager's file, once Airflow generated it."""
    try:
        return json.loads(Path(passwords_file).read_text() or "{}").get(user)
    except (OSError, ValueError):
        return None

"""The built wheel is the whole install: in a fresh venv, Airflow lists the provider, the plugin and the DAGs.

Builds the wheel from a copy of the checkout (so the build leaves no
``build/`` behind in it), checks its files, metadata and entry points, then installs it with ``pip install <wheel> -c constraints.txt`` into
a new venv -- no PYTHONPATH, no plugins folder, no checkout -- and runs
``airflow providers list``, ``airflow plugins`` and ``airflow dags list`` on
the example DAG file there. pip's cache keeps the install to a couple of
minutes (measured on the venv's creation; printed with ``-s``).
"""

from __future__ import annotations

import email.parser
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.dist

CONFIG = {
    "catalog": {"name": "t", "type": "sql", "uri": "sqlite:///{tmp}/catalog.db"},
    "shuffle": {"uri": "file://{tmp}/shuffle"},
    "tables": [
        {
            "source": "shop.orders",
            "sink": "shop.orders_changes",
            "identifier_columns": ["id"],
            "mirrors": [{"type": "iceberg", "table": "shop.orders_mirror"}],
        }
    ],
}
DAG_IDS = {"cdc__shop__orders", "cdc_mirror__shop__orders__shop__orders_mirror"}


def _run(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 600) -> str:
    done = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _json_output(text: str) -> list[dict]:
    """The JSON array an ``airflow ... -o json`` command prints on one line (log lines may come before it)."""
    [array] = [line for line in text.splitlines() if line.startswith("[{") or line == "[]"]
    return json.loads(array)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of the checkout (cdc_devtools, tests and all), as ``make wheel`` does."""
    source = tmp_path_factory.mktemp("checkout") / "iceberg-cdc"
    shutil.copytree(
        REPO,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", ".cdc", ".demo", "build", "dist", "__pycache__", "*.egg-info", ".*_cache"
        ),
    )
    out = tmp_path_factory.mktemp("wheel")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)], env, source)
    [built] = out.glob("iceberg_cdc-*.whl")
    return built


def test_the_wheel_holds_iceberg_cdc_and_declares_its_dependencies_and_entry_points(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        [dist_info] = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
        metadata = email.parser.Parser().parsestr(archive.read(f"{dist_info}/METADATA").decode())
        entry_points = archive.read(f"{dist_info}/entry_points.txt").decode()
    stray = [n for n in names if not (n.startswith("iceberg_cdc/") or n.startswith(f"{dist_info}/"))]
    assert not stray, f"the wheel ships files outside iceberg_cdc: {stray}"
    assert "iceberg_cdc/airflow/provider_info.py" in names
    assert not [n for n in names if "cdc_devtools" in n or "__pycache__" in n]
    # Every requirement of requirements.txt, by name.
    required = {
        line.split(";")[0]
        .split("[")[0]
        .split("=")[0]
        .split("<")[0]
        .split(">")[0]
        .split("~")[0]
        .strip()
        .lower()
        for line in (REPO / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith(("#", "-"))
    }
    declared = {
        r.split(";")[0].split("[")[0].split("=")[0].split("<")[0].split(">")[0].split("~")[0].strip().lower()
        for r in metadata.get_all("Requires-Dist") or []
    }
    assert required <= declared and "apache-airflow" in declared, (required, declared)
    assert "[apache_airflow_provider]" in entry_points
    assert "iceberg_cdc.airflow.provider_info:get_provider_info" in entry_points
    assert "[airflow.plugins]" in entry_points
    assert "iceberg_cdc.airflow.plugin:CdcUiPlugin" in entry_points
    assert "[console_scripts]" in entry_points  # the operator's command where the wheel is installed
    assert "iceberg-cdc = iceberg_cdc.cli:main" in entry_points


def test_a_fresh_airflow_with_the_wheel_lists_the_provider_plugin_and_dags(wheel, tmp_path):
    venv = tmp_path / "venv"
    started = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    base_python = getattr(sys, "_base_executable", sys.executable)
    _run([base_python, "-m", "venv", str(venv)], env, tmp_path)
    python = venv / "bin" / "python"
    _run(
        # No byte-compiling of every installed module: Python compiles what the airflow
        # commands below import, a small part of it.
        [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-compile",
            str(wheel),
            "-c",
            str(REPO / "constraints.txt"),
        ],
        env,
        tmp_path,
        timeout=1200,
    )
    installed = time.monotonic() - started
    print(f"fresh venv with the wheel and its dependencies: {installed:.0f} s")

    # A deployment: its own DAGs folder holding the example DAG file, an empty plugins folder.
    (tmp_path / "dags").mkdir()
    (tmp_path / "plugins").mkdir()
    shutil.copy(REPO / "dags" / "cdc_dags.py", tmp_path / "dags" / "cdc_dags.py")
    config = json.loads(json.dumps(CONFIG).replace("{tmp}", str(tmp_path)))
    (tmp_path / "cdc.yaml").write_text(yaml.safe_dump(config))
    airflow_env = {
        **env,
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(tmp_path / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(tmp_path / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "CDC_CONFIG": str(tmp_path / "cdc.yaml"),
        "CDC_PACKAGE_CACHE": str(tmp_path / "packages"),
    }
    airflow = str(venv / "bin" / "airflow")
    # Run outside the checkout, so nothing of it can be imported.
    where = tmp_path / "dags"

    providers = _json_output(_run([airflow, "providers", "list", "-o", "json"], airflow_env, where))
    [ours] = [p for p in providers if p["package_name"] == "iceberg-cdc"]
    assert ours["version"] == "0.1.0"

    plugins = _json_output(_run([airflow, "plugins", "-o", "json"], airflow_env, where))
    [cdc] = [p for p in plugins if p["name"] == "iceberg_cdc_ui"]
    assert [v["name"] for v in cdc["external_views"]] == ["CDC"]
    assert [a["url_prefix"] for a in cdc["fastapi_apps"]] == ["/cdc"]
    assert "iceberg-cdc==0.1.0" in cdc["source"] and "airflow.plugins" in cdc["source"]

    _run([airflow, "db", "migrate"], airflow_env, where)
    dags = _json_output(_run([airflow, "dags", "list", "--local", "-o", "json"], airflow_env, where))
    assert {d["dag_id"] for d in dags} == DAG_IDS
    assert all(d["fileloc"] == str(tmp_path / "dags" / "cdc_dags.py") for d in dags)
    # The package is the installed one, and the test tooling is not there.
    probe = (
        "import importlib.util, iceberg_cdc; "
        "print(iceberg_cdc.__file__, importlib.util.find_spec('cdc_devtools') is None)"
    )
    location, tooling_absent = _run([str(python), "-c", probe], airflow_env, where).split()
    assert Path(location).is_relative_to(venv) and tooling_absent == "True", (location, tooling_absent)
    # The operator's command is on the venv's PATH; no source table yet: a table it cannot read, exit 2.
    status = subprocess.run(
        [str(venv / "bin" / "iceberg-cdc"), "status"],
        env=airflow_env,
        cwd=where,
        capture_output=True,
        text=True,
    )
    assert status.returncode == 2, (status.stdout, status.stderr)
    assert "error: source table shop.orders does not exist in the catalog" in status.stdout, status.stdout
    print(f"whole test (build, fresh venv, airflow commands): {time.monotonic() - started:.0f} s")

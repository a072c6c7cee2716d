"""The distribution: iceberg_cdc stands alone, and its entry points lead to what Airflow expects.

The wheel holds ``iceberg_cdc`` only (pyproject.toml), so nothing in it may
import the test tooling (``cdc_devtools``) or the tests; read from the source
with ``ast``, lazy imports included. The entry points of pyproject.toml must
resolve, and ``get_provider_info`` must satisfy Airflow's own schema.
tests/integration/test_distribution.py installs the built wheel for real.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "plugins" / "iceberg_cdc"
TOOLING = ("cdc_devtools", "tests", "bench", "scripts")


def _imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module)
    return found


def test_the_package_imports_no_test_or_bench_tooling():
    offenders = sorted(
        f"{path.relative_to(REPO)} imports {module}"
        for path in PACKAGE.rglob("*.py")
        for module in _imported_modules(path)
        if module.split(".")[0] in TOOLING
    )
    assert not offenders, "the wheel ships iceberg_cdc alone; move the code to cdc_devtools:\n" + "\n".join(
        offenders
    )


def test_provider_info_imports_no_airflow():
    """The providers manager calls it during discovery; the plugins-folder shim before deciding to load."""
    modules = _imported_modules(PACKAGE / "airflow" / "provider_info.py")
    assert not [m for m in modules if m.split(".")[0] == "airflow"], modules


def _entry_points() -> dict[str, dict[str, str]]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]


def _load(value: str):
    module, _, attr = value.partition(":")
    return getattr(importlib.import_module(module.strip()), attr.strip())


def test_packages_are_iceberg_cdc_only():
    find = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert find["where"] == ["plugins"] and find["include"] == ["iceberg_cdc*"]


def test_provider_info_matches_airflows_schema_and_names_the_plugin():
    import jsonschema
    from airflow.plugins_manager import AirflowPlugin

    from iceberg_cdc.airflow import provider_info

    [provider] = _entry_points()["apache_airflow_provider"].values()
    info = _load(provider)()
    schema = json.loads(
        (Path(importlib.util.find_spec("airflow").origin).parent / "provider_info.schema.json").read_text()
    )
    jsonschema.validate(info, schema)
    assert info["package-name"] == tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["name"]
    import iceberg_cdc

    assert info["versions"] == [iceberg_cdc.__version__]
    [plugin] = info["plugins"]
    module, _, name = plugin["plugin-class"].rpartition(".")
    plugin_class = _load(f"{module}:{name}")
    assert issubclass(plugin_class, AirflowPlugin) and plugin_class.name == plugin["name"]
    # The airflow.plugins entry point loads the same class (Airflow's default lazy provider discovery
    # never loads a provider's declared plugins).
    [plugin_entry] = _entry_points()["airflow.plugins"].values()
    assert _load(plugin_entry) is plugin_class
    assert plugin["plugin-class"] == provider_info.PLUGIN_CLASS


def test_provider_info_hook_modules_hold_the_hooks():
    from airflow.sdk import BaseHook

    from iceberg_cdc.airflow.provider_info import get_provider_info

    modules = [m for hooks in get_provider_info()["hooks"] for m in hooks["python-modules"]]
    listed = {importlib.import_module(m).__name__ for m in modules}
    on_disk = {
        "iceberg_cdc.airflow.hooks." + p.stem
        for p in (PACKAGE / "airflow" / "hooks").glob("*.py")
        if p.stem != "__init__"
    }
    assert listed == on_disk
    cdc = importlib.import_module("iceberg_cdc.airflow.hooks.cdc")
    assert issubclass(cdc.CdcHook, BaseHook)


class _EntryPoint:
    def __init__(self, value: str) -> None:
        self.value = value


@pytest.mark.parametrize(
    ("values", "installed"),
    [
        ([], False),
        (["airflow.providers.openlineage.plugins.openlineage:OpenLineageProviderPlugin"], False),
        (["iceberg_cdc.airflow.plugin:CdcUiPlugin"], True),
    ],
)
def test_the_plugins_folder_shim_steps_aside_when_the_entry_point_is_installed(
    monkeypatch, values, installed
):
    """Airflow reports a second registration of one plugin name as an import error."""
    monkeypatch.setattr(metadata, "entry_points", lambda group: [_EntryPoint(v) for v in values])
    spec = importlib.util.spec_from_file_location("cdc_ui_plugin_shim", REPO / "plugins" / "cdc_ui_plugin.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert hasattr(module, "CdcUiPlugin") is not installed

"""The import structure shows the layers: Airflow only in its adapter, no arrow up, no cycle.

Read from the source with ``ast`` (every import, module-level or inside a
function), so a lazy import that crosses a layer counts as much as a top-level
one. A new package of ``iceberg_cdc`` must be given its place in ``RANKS``.
"""

from __future__ import annotations

import ast
from pathlib import Path

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"

# Lowest first: a package may import packages of its own rank or lower, never higher.
RANKS: list[set[str]] = [
    {
        "__init__",
        "errors",
        "canonical",
        "watermark",
        "units",
        "retry",
        "redaction",
        "error_lines",
        "snapshot_ids",
        "libc",
        "pyiceberg_internals",
        "verify_status",
        "command_exit",
    },
    {"config", "storage", "lineage", "lineage_events"},
    {"coordination", "shuffle"},
    {"changelog"},
    {"source", "sink"},
    {"pipeline"},
    {"run", "mirror"},
    {"ui"},
    {"cli"},
    {"airflow"},
]
RANK = {name: rank for rank, names in enumerate(RANKS) for name in names}


def _modules() -> dict[str, Path]:
    found = {}
    for path in (PLUGINS / "iceberg_cdc").rglob("*.py"):
        parts = path.relative_to(PLUGINS).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


# Calls that import a module named by their first argument: a literal there is an import as much as
# an ``import`` statement is (``importlib.import_module("airflow.sdk")`` in the core crosses the layer).
_DYNAMIC_IMPORTS = {"import_module", "__import__", "find_spec"}


def _dynamic_import(node: ast.AST) -> str | None:
    """The literal module name of ``importlib.import_module(...)``, ``__import__(...)``, ``find_spec(...)``."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    first = node.args[0]
    if called in _DYNAMIC_IMPORTS and isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value
    return None


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    return _imports_in(path.read_text(), name, path.name == "__init__.py", known)


def _imports_in(source: str, name: str, is_package: bool, known: set[str]) -> set[str]:
    """Every module ``name`` imports (resolving relative imports and ``from pkg import module``),
    by statement or by a dynamic import of a literal name."""
    package = name if is_package else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in known else base)
        elif (dynamic := _dynamic_import(node)) is not None:
            level = len(dynamic) - len(dynamic.lstrip("."))
            if level:
                anchor = package.split(".")[: len(package.split(".")) - level + 1]
                dynamic = ".".join([*anchor, dynamic[level:]] if dynamic[level:] else anchor)
            out.add(dynamic)
    return out


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def test_only_the_adapter_imports_airflow():
    offenders = sorted(
        f"{module} imports {target}"
        for module, targets in _graph().items()
        if not module.startswith("iceberg_cdc.airflow")
        for target in targets
        if target.split(".")[0] == "airflow" or target.startswith("iceberg_cdc.airflow")
    )
    assert offenders == [], "Airflow belongs in iceberg_cdc.airflow only:\n" + "\n".join(offenders)


def test_every_package_has_a_rank_and_imports_only_down():
    graph = _graph()
    unranked = sorted({_package(m) for m in graph} - set(RANK))
    assert unranked == [], f"give these packages a place in RANKS: {unranked}"
    upward = sorted(
        f"{module} ({_package(module)}) imports {target} ({_package(target)})"
        for module, targets in graph.items()
        for target in targets
        if target.startswith("iceberg_cdc") and RANK[_package(target)] > RANK[_package(module)]
    )
    assert upward == [], "imports up the layers:\n" + "\n".join(upward)


def test_no_import_cycle_between_packages_or_modules():
    graph = _graph()
    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        for target in targets:
            if target.startswith("iceberg_cdc") and _package(target) != _package(module):
                packages.setdefault(_package(module), set()).add(_package(target))
    module_graph = {m: {t for t in ts if t in graph and t != m} for m, ts in graph.items()}
    assert _cycles(packages) == []
    # Modules: a package's __init__ re-exporting its modules is not a cycle of the modules themselves.
    assert _cycles({m: {t for t in ts if not graph_is_parent(t, m)} for m, ts in module_graph.items()}) == []


def graph_is_parent(target: str, module: str) -> bool:
    return module.startswith(target + ".")


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in list(graph):
        if node not in index:
            visit(node)
    return found


def test_the_checks_see_a_planted_arrow_up_and_a_cycle():
    """The checks can fail: an upward import and a two-module cycle are found."""
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    graph = _graph()
    # The step operators import the run's steps inside execute: the graph sees those imports too.
    assert "iceberg_cdc.run.steps" in graph["iceberg_cdc.airflow.operators.steps"]
    assert RANK[_package("iceberg_cdc.airflow.operators.steps")] > RANK[_package("iceberg_cdc.run.steps")]


def test_the_checks_see_dynamic_imports_of_a_literal_name():
    """``importlib.import_module``, ``__import__`` and ``find_spec`` of a literal count as imports."""
    source = """
import importlib
import importlib.util
from importlib import import_module


def lazy():
    importlib.import_module("airflow.sdk")
    __import__("airflow")
    importlib.util.find_spec("airflow.providers")
    import_module(".plan", package=__package__)
    importlib.import_module(name_from_config)  # not a literal: unknowable, not counted
"""
    found = _imports_in(source, "iceberg_cdc.run.detect", False, set())
    assert {"airflow.sdk", "airflow", "airflow.providers", "iceberg_cdc.run.plan"} <= found
    assert not any(target.startswith("name_from_config") for target in found)


def test_no_module_imports_another_modules_private_names():
    """A ``_name`` is its module's own: a sibling that needs it gets a public name (or the code moves).

    ``from iceberg_cdc.x import _name`` hides a rule's owner: the name says "only here", the
    import says otherwise, and a change to it in ``x`` looks local when it is not.
    """
    modules = _modules()
    offenders = []
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            source = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*anchor, source] if source else anchor)
            if not source.startswith("iceberg_cdc"):
                continue
            offenders += [
                f"{name}:{node.lineno} imports {source}.{alias.name}"
                for alias in node.names
                if alias.name.startswith("_") and not alias.name.startswith("__")
            ]
    assert offenders == [], "private names imported across modules:\n" + "\n".join(offenders)


def test_no_import_cycle_between_bench_modules():
    """The bench's scripts import each other by name (``bench/`` on the path): no two in a circle."""
    bench = PLUGINS.parent / "bench"
    names = {path.stem for path in bench.glob("*.py")}
    graph = {
        path.stem: {
            target.split(".")[0]
            for target in _imports_in(path.read_text(), path.stem, False, set())
            if target.split(".")[0] in names and target.split(".")[0] != path.stem
        }
        for path in bench.glob("*.py")
    }
    assert _cycles(graph) == []


# Modules that import names they are given: a user's callback (``freshness_callback``) and the task
# preload's list of modules to warm. Anywhere else, a module named by a variable hides a dependency
# from this file's checks (mirror.targets once imported the Iceberg target so).
_IMPORTS_BY_NAME = {"iceberg_cdc.airflow.freshness_dag", "iceberg_cdc.airflow.listeners.task_preload"}


def test_dynamic_imports_name_their_module():
    hidden = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            called = (
                func.attr
                if isinstance(func, ast.Attribute)
                else func.id
                if isinstance(func, ast.Name)
                else None
            )
            if called in _DYNAMIC_IMPORTS and _dynamic_import(node) is None and name not in _IMPORTS_BY_NAME:
                hidden.append(f"{name}:{node.lineno} {called}({ast.unparse(node.args[0])})")
    assert hidden == [], "imports of a module named by a variable:\n" + "\n".join(hidden)

"""The guard of the pyiceberg door: outside :mod:`iceberg_cdc.pyiceberg_internals`, no pyiceberg internals.

The door pins every pyiceberg internal the product leans on
(``tests/unit/test_pyiceberg_internals*.py``); a use outside it would bypass
those pins, so a pyiceberg release could change it silently. This guard reads
the shipped package's sources (AST, no imports) and fails on each use it finds
outside the door:

* an import from a private pyiceberg module (a dotted part starting with
  ``_``) or of a private name (``from pyiceberg.manifest import _x``);
* any import of ``pyiceberg.io.pyarrow`` (its helpers are importable but
  undocumented: the door re-exports or wraps the ones the product needs),
  including ``importlib.import_module("pyiceberg.io.pyarrow")``;
* a call with a private keyword argument (``DataFile.from_args(_table_format_version=3)``)
  on a pyiceberg object -- a callee rooted at a name imported from pyiceberg,
  or any ``from_args`` (pyiceberg's record constructor) -- written out or
  unpacked from a dict literal;
* the door's own subclassed bases, private attributes and undocumented names.

Test tooling (``cdc_devtools``, ``bench``) is not shipped and may use pyiceberg
freely. The synthetic sources below prove the guard fails on each pattern.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "plugins" / "iceberg_cdc"
DOOR = PACKAGE / "pyiceberg_internals"
ARROW_HELPERS = "pyiceberg.io.pyarrow"

# pyiceberg classes whose subclasses lean on internals (visitors, private hooks), and private
# attributes of pyiceberg objects the door reads or writes.
INTERNAL_BASES = {
    "ArrowProjectionVisitor",
    "UpdateTableMetadata",
    "SchemaWithPartnerVisitor",
    "_SnapshotProducer",
}
PRIVATE_ATTRIBUTES = {"_filesystem", "_path", "_buffer_size", "_commit", "_do_commit", "_table", "_data"}
# Importable but undocumented names the door owns: used anywhere else, they would bypass its pins.
DOOR_NAMES = {
    "AvroFile",
    "MANIFEST_ENTRY_SCHEMAS",
    "DATA_FILE_TYPE",
    "ArrowAccessor",
    "ArrowProjectionVisitor",
    "visit_with_partner",
    "UpdateTableMetadata",
    "compute_statistics_plan",
    "data_file_statistics_from_parquet_metadata",
    "parquet_path_to_id_mapping",
}


def _is_pyiceberg(module: str) -> bool:
    return module == "pyiceberg" or module.startswith("pyiceberg.")


def _is_private_module(module: str) -> bool:
    return any(part.startswith("_") for part in module.split("."))


def _is_arrow_helpers(module: str) -> bool:
    return module == ARROW_HELPERS or module.startswith(ARROW_HELPERS + ".")


def _root_name(node: ast.expr) -> str | None:
    """``a`` for ``a.b.c(...)`` / ``a(...)``; None for anything else (a call's result, a subscript)."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _import_uses(node: ast.Import | ast.ImportFrom) -> tuple[list[str], set[str]]:
    """The internal uses of one import statement and the local names it binds to pyiceberg objects."""
    found, bound = [], set()
    if isinstance(node, ast.Import):
        for alias in node.names:
            if not _is_pyiceberg(alias.name):
                continue
            bound.add(alias.asname or alias.name.split(".")[0])
            if _is_private_module(alias.name):
                found.append(f"imports private module {alias.name}")
            if _is_arrow_helpers(alias.name):
                found.append(f"imports {alias.name}")
        return found, bound
    module = node.module or ""
    if node.level or not _is_pyiceberg(module):
        return found, bound
    if _is_private_module(module):
        found.append(f"imports from private module {module}")
    for alias in node.names:
        bound.add(alias.asname or alias.name)
        if _is_arrow_helpers(module) or _is_arrow_helpers(f"{module}.{alias.name}"):
            found.append(f"imports {alias.name} from {module}")
        if alias.name.startswith("_") or alias.name in DOOR_NAMES:
            found.append(f"imports {alias.name}")
    return found, bound


def _private_keywords(call: ast.Call) -> list[str]:
    names = [k.arg for k in call.keywords if k.arg is not None and k.arg.startswith("_")]
    for keyword in call.keywords:  # f(**{"_x": 1})
        if keyword.arg is None and isinstance(keyword.value, ast.Dict):
            names += [
                key.value
                for key in keyword.value.keys
                if isinstance(key, ast.Constant) and isinstance(key.value, str) and key.value.startswith("_")
            ]
    return names


def _dynamic_import(call: ast.Call) -> str | None:
    """The module ``importlib.import_module("...")`` / ``__import__("...")`` names, if a literal."""
    name = ast.unparse(call.func)
    if name not in ("importlib.import_module", "import_module", "__import__") or not call.args:
        return None
    first = call.args[0]
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


def internal_uses(source: str) -> list[str]:
    """Every use of a pyiceberg internal in ``source``, one line each (empty: none)."""
    tree = ast.parse(source)
    found: list[str] = []
    pyiceberg_names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            uses, bound = _import_uses(node)
            found += uses
            pyiceberg_names |= bound
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            module = _dynamic_import(node)
            if module is not None and _is_pyiceberg(module):
                if _is_arrow_helpers(module):
                    found.append(f"imports {module} dynamically")
                if _is_private_module(module):
                    found.append(f"imports private module {module} dynamically")
            private = _private_keywords(node)
            on_pyiceberg = _root_name(node.func) in pyiceberg_names or (
                isinstance(node.func, ast.Attribute) and node.func.attr == "from_args"
            )
            if private and on_pyiceberg:
                found += [f"passes {name}= to {ast.unparse(node.func)}" for name in private]
        elif isinstance(node, ast.ClassDef):
            bases = {ast.unparse(b).split("[")[0].rsplit(".", 1)[-1] for b in node.bases}
            found += [f"subclasses {b}" for b in sorted(bases & INTERNAL_BASES)]
        elif (
            isinstance(node, ast.Attribute)
            and node.attr in PRIVATE_ATTRIBUTES
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        ):
            found.append(f"reads .{node.attr}")
    return found


def test_no_module_outside_the_door_uses_pyiceberg_internals():
    leaks = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if DOOR in path.parents:
            continue
        uses = internal_uses(path.read_text())
        if uses:
            leaks[str(path.relative_to(PACKAGE))] = uses
    assert leaks == {}, (
        "pyiceberg internals belong in iceberg_cdc.pyiceberg_internals (pinned there):\n"
        + "\n".join(f"{path}: {uses}" for path, uses in leaks.items())
    )


def test_the_door_itself_is_what_the_guard_would_flag():
    """The guard, run on the door, finds the door's uses: it reads what it claims to read."""
    uses = {path.name: internal_uses(path.read_text()) for path in DOOR.glob("*.py")}
    assert "subclasses ArrowProjectionVisitor" in uses["projection.py"]
    assert "passes _table_format_version= to DataFile.from_args" in uses["datafiles.py"]
    assert any(
        use.startswith("imports prune_columns from pyiceberg.io.pyarrow") for use in uses["arrow_schema.py"]
    )


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # private modules and private names
        ("from pyiceberg.io._private import helper", "imports from private module pyiceberg.io._private"),
        ("import pyiceberg._impl.thing as t", "imports private module pyiceberg._impl.thing"),
        (
            "from pyiceberg.manifest import (\n    DataFile,\n    _inherit_from_manifest,\n)",
            "imports _inherit_from_manifest",
        ),
        ("from pyiceberg.table import _SnapshotProducer as P", "imports _SnapshotProducer"),
        # pyiceberg.io.pyarrow in every spelling
        (
            "from pyiceberg.io.pyarrow import schema_to_pyarrow",
            "imports schema_to_pyarrow from pyiceberg.io.pyarrow",
        ),
        ("import pyiceberg.io.pyarrow", "imports pyiceberg.io.pyarrow"),
        ("import pyiceberg.io.pyarrow as pia", "imports pyiceberg.io.pyarrow"),
        ("from pyiceberg.io import pyarrow", "imports pyarrow from pyiceberg.io"),
        (
            "import importlib\nm = importlib.import_module('pyiceberg.io.pyarrow')",
            "imports pyiceberg.io.pyarrow dynamically",
        ),
        # private keyword arguments on pyiceberg objects
        (
            "from pyiceberg.manifest import DataFile\nDataFile.from_args(_table_format_version=3, file_path='p')",
            "passes _table_format_version= to DataFile.from_args",
        ),
        (
            "record = anything.from_args(_table_format_version=3)",
            "passes _table_format_version= to anything.from_args",
        ),
        (
            "from pyiceberg.manifest import ManifestFile as MF\nMF.from_args(**{'_table_format_version': 3})",
            "passes _table_format_version= to MF.from_args",
        ),
        ("import pyiceberg.manifest\npyiceberg.manifest.f(_x=1)", "passes _x= to pyiceberg.manifest.f"),
        # the door's bases, attributes and names
        ("from x import y\nclass V(ArrowProjectionVisitor):\n    pass", "subclasses ArrowProjectionVisitor"),
        ("f(io.new_input(p)._filesystem)", "reads ._filesystem"),
        ("from pyiceberg.manifest import DATA_FILE_TYPE", "imports DATA_FILE_TYPE"),
    ],
)
def test_the_guard_fails_on_each_pattern(source, expected):
    assert expected in internal_uses(source)


@pytest.mark.parametrize(
    "source",
    [
        "from pyiceberg.manifest import DataFile\nDataFile.from_args(file_path='p')",
        "from pyiceberg.catalog import load_catalog\nload_catalog('c', uri='u')",
        "from iceberg_cdc.pyiceberg_internals.arrow_schema import select_columns\nselect_columns(s, {1})",
        # private keywords on non-pyiceberg callees (Airflow's get_user takes _oauth_token) are not its business
        "from airflow.security import get_user\nget_user(_oauth_token=None)",
        "self._path = p",
    ],
)
def test_the_guard_lets_public_uses_pass(source):
    assert internal_uses(source) == []

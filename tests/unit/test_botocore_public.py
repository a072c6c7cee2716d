"""The shipped package uses botocore's public surface only: no retry internals, no private attributes.

botocore's retry quota and handlers are internal (``botocore.retries.*``,
``client.meta.events._emitter``...); the store used to widen the quota by
writing them. Retries now have one owner (``S3ObjectStore._request``) and
botocore makes one attempt per call through its public ``Config``, so nothing
needs its internals; this guard keeps it that way.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from iceberg_cdc.storage.s3_client import BOTOCORE_ATTEMPTS, s3_client

PACKAGE = Path(__file__).resolve().parents[2] / "plugins" / "iceberg_cdc"
PUBLIC_MODULES = {"boto3", "botocore.config", "botocore.exceptions"}


def _own_private_names() -> set[str]:
    """Underscored methods and attributes the package defines itself (``store._call``): not botocore's."""
    names = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                names.add(node.attr)
    return {name for name in names if name.startswith("_")}


OWN = _own_private_names()


def botocore_internals(source: str) -> list[str]:
    """Uses of botocore internals in a module that imports boto3 or botocore (empty: none)."""
    tree = ast.parse(source)
    modules = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            modules += [f"{node.module}.{alias.name}" for alias in node.names]
    aws = [m for m in modules if m.split(".")[0] in ("boto3", "botocore")]
    if not aws:
        return []
    found = [
        f"imports {m}" for m in aws if m not in PUBLIC_MODULES and m.rpartition(".")[0] not in PUBLIC_MODULES
    ]
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and node.attr not in OWN
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        ):
            found.append(f"reads .{node.attr}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and str(node.args[1].value).startswith("_")
            and not str(node.args[1].value).startswith("__")
        ):
            found.append(f"{node.func.id} {node.args[1].value}")
    return found


def test_no_shipped_module_uses_botocore_internals():
    leaks = {
        str(path.relative_to(PACKAGE)): uses
        for path in sorted(PACKAGE.rglob("*.py"))
        if (uses := botocore_internals(path.read_text()))
    }
    assert leaks == {}


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import botocore.retries.standard", "imports botocore.retries.standard"),
        ("from botocore.retries import quota", "imports botocore.retries.quota"),
        ("import boto3\nq = client.meta.events._emitter", "reads ._emitter"),
        ("import boto3\nq = getattr(checker, '_retry_quota', None)", "getattr _retry_quota"),
        ("import botocore.config\nquota._max_capacity = 1", "reads ._max_capacity"),
    ],
)
def test_the_guard_fails_on_each_pattern(source, expected):
    assert expected in botocore_internals(source)


def test_botocore_internals_the_store_once_wrote_are_not_the_packages_own_names():
    assert not {"_emitter", "_unique_id_handlers", "_retry_quota", "_quota", "_max_capacity"} & OWN


def test_the_guard_lets_public_uses_pass():
    assert (
        botocore_internals("import botocore.config\nimport botocore.exceptions\nbotocore.config.Config()")
        == []
    )
    assert botocore_internals("import boto3\nself._client = boto3.client('s3')") == []


def test_the_client_makes_one_attempt_per_call_through_public_config():
    config = s3_client({"s3.endpoint": "http://127.0.0.1:9", "s3.region": "us-east-1"}).meta.config
    assert BOTOCORE_ATTEMPTS == 1
    assert config.retries == {"mode": "standard", "total_max_attempts": 1}

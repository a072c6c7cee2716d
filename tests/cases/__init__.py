"""Changelog cases ported from Apache Iceberg's tests, kept as data (the YAML files next to this one).

This module only turns the files' column types and values into Arrow and Iceberg objects; the tests
that run the cases are ``tests/unit/test_iceberg_cases.py`` (merge and shuffle) and
``tests/integration/test_iceberg_table_cases.py`` (real tables through the in-process pipeline).
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BooleanType,
    DateType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    PrimitiveType,
    StringType,
)

CASES_DIR = Path(__file__).resolve().parent
MERGE_CASES = CASES_DIR / "iceberg_changelog_cases.yaml"
TABLE_CASES = CASES_DIR / "iceberg_table_cases.yaml"
CHANGE_TYPES = ("DELETE", "INSERT", "UPDATE_BEFORE", "UPDATE_AFTER")

_PRIMITIVES: dict[str, tuple[pa.DataType, PrimitiveType]] = {
    "boolean": (pa.bool_(), BooleanType()),
    "int": (pa.int32(), IntegerType()),
    "long": (pa.int64(), LongType()),
    "float": (pa.float32(), FloatType()),
    "double": (pa.float64(), DoubleType()),
    "string": (pa.string(), StringType()),
    "date": (pa.date32(), DateType()),
}
_MAP = re.compile(r"map<(\w+),(.+)>")
_LIST = re.compile(r"list<(.+)>")


def load(path: Path) -> list[dict[str, Any]]:
    """The ``cases`` list of a case file."""
    return yaml.safe_load(path.read_text())["cases"]


def _normal(type_text: str) -> str:
    return type_text.replace(" ", "")


def arrow_type(type_text: str) -> pa.DataType:
    """The Arrow type of an Iceberg type written as in the case files (``int``, ``map<string, string>``)."""
    text = _normal(type_text)
    if match := _MAP.fullmatch(text):
        return pa.map_(arrow_type(match[1]), arrow_type(match[2]))
    if match := _LIST.fullmatch(text):
        return pa.list_(arrow_type(match[1]))
    if text not in _PRIMITIVES:
        raise ValueError(f"unknown Iceberg type {type_text!r} in a case file")
    return _PRIMITIVES[text][0]


def iceberg_type(type_text: str, ids: itertools.count) -> IcebergType:
    """The Iceberg type; nested field ids are drawn from ``ids``."""
    text = _normal(type_text)
    if match := _MAP.fullmatch(text):
        key_id, value_id = next(ids), next(ids)
        return MapType(key_id, iceberg_type(match[1], ids), value_id, iceberg_type(match[2], ids), False)
    if match := _LIST.fullmatch(text):
        return ListType(next(ids), iceberg_type(match[1], ids), element_required=False)
    if text not in _PRIMITIVES:
        raise ValueError(f"unknown Iceberg type {type_text!r} in a case file")
    return _PRIMITIVES[text][1]


def iceberg_schema(columns: list[dict[str, Any]], identifier_fields: list[str] | None = None) -> Schema:
    """A table schema from a case's ``columns``: top-level ids 1..n, nested ids after them."""
    nested_ids = itertools.count(len(columns) + 1)
    fields = [
        NestedField(
            i + 1,
            column["name"],
            iceberg_type(column["type"], nested_ids),
            required=column.get("required", False),
        )
        for i, column in enumerate(columns)
    ]
    by_name = {field.name: field.field_id for field in fields}
    return Schema(*fields, identifier_field_ids=[by_name[name] for name in identifier_fields or []])


def arrow_value(value: Any, typ: pa.DataType) -> Any:
    """A YAML value as pyarrow takes it: map values are written as lists of [key, value] pairs."""
    if value is None:
        return None
    if pa.types.is_map(typ):
        return [(arrow_value(k, typ.key_type), arrow_value(v, typ.item_type)) for k, v in value]
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        return [arrow_value(v, typ.value_type) for v in value]
    return value


def arrow_rows(schema: pa.Schema, rows: list[list[Any]]) -> pa.Table:
    """Rows (values in column order) as a table of ``schema``."""
    for row in rows:
        if len(row) != len(schema):
            raise ValueError(f"row {row} does not match the columns {schema.names}")
    columns = [pa.array([arrow_value(row[i], f.type) for row in rows], f.type) for i, f in enumerate(schema)]
    return pa.Table.from_arrays(columns, schema=schema)


def split_change(row: list[Any]) -> tuple[list[Any], str]:
    """An expected change row: (the values, the change type written last)."""
    if not row or row[-1] not in CHANGE_TYPES:
        raise ValueError(f"expected change row {row} does not end with one of {CHANGE_TYPES}")
    return list(row[:-1]), row[-1]

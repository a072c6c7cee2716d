"""The verdict on a mirror: it holds exactly the source's rows at the mirror's watermark.

Rows of the PostgreSQL mirror (read back through ADBC) and of the source
table's state at the watermark's snapshot (read by the tests' own readers,
:func:`cdc_devtools.cow.table_state`, which applies merge-on-read
deletes with a reference reader) are turned into comparable Python values --
decimals by their digits, floats by ``repr`` (NaN and -0.0 kept apart),
structs and maps as JSON objects, uuids as text, times in UTC -- and compared
as multisets over the source's current columns. Rows lost and rows
duplicated are counted, as the changelog's fault report counts them.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from cdc_devtools.cow import table_state
from iceberg_cdc.mirror.net_changes import ChangelogMark
from iceberg_cdc.mirror.postgres.target import PostgresTarget


def _value(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dt.datetime):
        return (value.astimezone(dt.UTC) if value.tzinfo else value).isoformat()
    if isinstance(value, dict):
        return json.dumps({k: _value(v) for k, v in value.items()}, sort_keys=True)
    if isinstance(value, list):
        return json.dumps([_value(v) for v in value])
    if isinstance(value, bytes):
        return value.hex()
    return value


def _pg_value(value: Any, typ: pa.DataType) -> Any:
    if value is None:
        return None
    name = getattr(typ, "extension_name", "")
    if name == "arrow.json":
        parsed = json.loads(value)
        return json.dumps(_json_values(parsed), sort_keys=True) if isinstance(parsed, dict) else parsed
    if name == "arrow.opaque":  # numeric
        return format(decimal.Decimal(value), "f")
    return _value(value)


def _json_values(value: Any) -> Any:
    """JSON from PostgreSQL as the source side's ``_value`` renders nested values (floats by repr)."""
    if isinstance(value, dict):
        return {k: _json_values(v) for k, v in value.items()}
    if isinstance(value, float):
        return repr(value)
    return value


def _rows(table: pa.Table, names: list[str], pg: bool) -> Counter:
    columns = []
    for name in names:
        column = table.column(name)
        values = column.to_pylist()
        if pg:
            columns.append([_pg_value(v, column.type) for v in values])
        elif pa.types.is_map(column.type):  # a map is a JSON object in the mirror, also when empty
            columns.append(
                [
                    None if v is None else json.dumps({str(k): _value(x) for k, x in v}, sort_keys=True)
                    for v in values
                ]
            )
        else:
            columns.append([_value(v) for v in values])
    return Counter(zip(*columns, strict=True)) if columns else Counter()


@dataclass
class MirrorVerdict:
    mark: ChangelogMark | None
    lost: int
    duplicated: int
    rows: int

    @property
    def exact(self) -> bool:
        return self.lost == 0 and self.duplicated == 0


def verdict(source_table, target: PostgresTarget) -> MirrorVerdict:
    """Compare a PostgreSQL mirror with the source's rows at the mirror's watermark."""
    return compare(source_table, target.read_mark(), target.read_rows(), pg=True, name=target.table)


def compare(
    source_table, mark: ChangelogMark | None, mirror: pa.Table | None, *, pg: bool, name: str = ""
) -> MirrorVerdict:
    """Compare mirror rows (from PostgreSQL, ``pg``, or an Iceberg scan) with the source at ``mark``."""
    if mark is None:  # never applied: the mirror must be empty (or not exist yet)
        rows = mirror.num_rows if mirror is not None else 0
        return MirrorVerdict(None, 0, rows, rows)
    assert mirror is not None, f"the mirror table {name} has a watermark but does not exist"
    state = table_state(source_table, mark.source_snapshot_id)
    names = [n for n in state.column_names if n in mirror.column_names]
    expected = _rows(state, names, pg=False)
    found = _rows(mirror, names, pg=pg)
    return MirrorVerdict(
        mark,
        lost=sum((expected - found).values()),
        duplicated=sum((found - expected).values()),
        rows=mirror.num_rows,
    )


def assert_mirror_exact(source_table, target: PostgresTarget) -> MirrorVerdict:
    result = verdict(source_table, target)
    assert result.exact, (
        f"mirror differs from the source at {result.mark}: {result.lost} lost, {result.duplicated} duplicated"
    )
    return result

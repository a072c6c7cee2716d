"""Key ranges of data files, from manifest statistics: a large partition split where rows cannot meet.

Carryover is a removed and an added copy of one row, so both copies have the
same identifier key. When the manifests' lower and upper bounds of the first
identifier column show that two files' key ranges do not overlap, no row of
one can be carryover of a row of the other. A partition whose removed and
added files are too many bytes for one write task is therefore split into the
connected components of its files' overlapping key ranges: every possible
pair of copies stays inside one component, so cancelling component by
component cancels exactly what cancelling the whole partition would, with a
fraction of the memory and in parallel tasks. A table written sorted or
clustered by its key (or appended in key order and rewritten file by file)
splits into many small components; one written in random key order gives one
component, handled as a whole partition is (hash buckets on local disk).

Bounds are only trusted where they are safe: a column of a type whose bounds
compare exactly in Python (integers, dates, times, timestamps, strings), and
a file that records both bounds and no null in it. Truncated string bounds
(Iceberg's default ``truncate(16)`` metrics) are still bounds: the lower one is
at most the minimum, the upper one at least the maximum. Any file without a
usable range leaves its partition unsplit.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from pyiceberg.conversions import from_bytes
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.types import (
    DateType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
    TimestamptzType,
    TimeType,
)

from iceberg_cdc.config import TableConfig
from iceberg_cdc.errors import ConfigError
from iceberg_cdc.source.tables import resolve_identifier_columns

_EXACT_TYPES = (IntegerType, LongType, DateType, TimeType, TimestampType, TimestamptzType, StringType)
KeyRange = tuple[Any, Any]
T = TypeVar("T")


def key_field_id(table_config: TableConfig, schema: Schema) -> int | None:
    """The field id of the table's first identifier column (configured or the table's), if any.

    A name that does not resolve gives None here; detect reports it with the
    snapshot's schema.
    """
    try:
        names = resolve_identifier_columns(table_config, schema)
        return schema.find_field(names[0]).field_id if names else None
    except (ConfigError, ValueError):
        return None


def usable_key_field(field: NestedField | None) -> bool:
    """Whether bounds of ``field`` can split partitions (a type whose bounds compare exactly)."""
    return field is not None and isinstance(field.field_type, _EXACT_TYPES)


def key_range(data_file: DataFile, field: NestedField | None) -> KeyRange | None:
    """The file's ``(lower, upper)`` bound of ``field`` in JSON form, or None when it cannot be trusted."""
    if not usable_key_field(field):
        return None
    assert field is not None
    nulls = (data_file.null_value_counts or {}).get(field.field_id)
    lower = (data_file.lower_bounds or {}).get(field.field_id)
    upper = (data_file.upper_bounds or {}).get(field.field_id)
    if nulls is None or nulls > 0 or lower is None or upper is None:
        return None
    try:  # a bound written before a type promotion (4-byte int read as long) does not decode: unsplit
        low, high = from_bytes(field.field_type, lower), from_bytes(field.field_type, upper)
    except (struct.error, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(low, int | str) or type(low) is not type(high) or low > high:
        return None
    return low, high


def split_by_key_range(files: Sequence[T], range_of: Callable[[T], KeyRange | None]) -> list[list[T]]:
    """The connected components of ``files`` by overlapping key ranges, in key order.

    Two files whose ranges overlap (bounds inclusive) are in one component;
    so are files linked through others. One component with every file when
    any file has no range, or ranges of different types.
    """
    ranges = [range_of(f) for f in files]
    if not files or any(r is None for r in ranges) or len({type(r[0]) for r in ranges if r}) > 1:
        return [list(files)] if files else []
    order = sorted(range(len(files)), key=lambda i: (ranges[i][0], ranges[i][1]))  # type: ignore[index]
    components: list[list[T]] = []
    reach: Any = None
    for i in order:
        low, high = ranges[i]  # type: ignore[misc]
        if components and low <= reach:
            components[-1].append(files[i])
            reach = max(reach, high)
        else:
            components.append([files[i]])
            reach = high
    return components

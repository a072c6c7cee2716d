"""The configured source table and its identifier columns, with errors that say what exists instead.

A misspelt ``tables[].source`` otherwise surfaces as pyiceberg's bare
``NoSuchTableError: Table does not exist: shop.order``, which names neither
the config key nor the catalog, nor what the namespace does hold. Here the
error names all of them and the closest existing tables.

Identifier columns are the configured ``identifier_columns`` or else the
table's identifier fields. Iceberg lets an identifier field sit inside a
struct (full name ``k.a``); the partitioner and the merge resolve such dotted
paths to the struct field (:func:`iceberg_cdc.canonical.column_at`), so they
work end to end. A path through a list or a map cannot be a key (one row
would have several values) and is refused with the fix.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import NestedField, StructType

from iceberg_cdc.config import TableConfig
from iceberg_cdc.errors import ConfigError

_LISTED = 8  # tables (or namespaces) named in a message; more are counted, not listed


def load_source_table(catalog: Catalog, table_config: TableConfig) -> Table:
    """``catalog.load_table(tables[].source)``; a missing table or namespace raises :class:`ConfigError`.

    The message names the config key, the identifier, the catalog, and what
    the namespace holds (or which namespaces exist), closest names first.
    """
    try:
        return catalog.load_table(table_config.source)
    except (NoSuchTableError, NoSuchNamespaceError):
        raise ConfigError(_missing_table_message(catalog, table_config.source)) from None


def _joined(identifier: tuple[str, ...]) -> str:
    return ".".join(identifier)


def _some(names: Sequence[str], near: str) -> str:
    """A few of ``names``, the ones closest to ``near`` first, and how many more there are."""
    close = difflib.get_close_matches(near, names, n=3, cutoff=0.6)
    ordered = close + sorted(name for name in names if name not in close)
    shown = ", ".join(ordered[:_LISTED])
    more = len(ordered) - _LISTED
    return f"{shown} (and {more} more)" if more > 0 else shown


def _existing_elsewhere(catalog: Catalog, namespace: tuple[str, ...]) -> str:
    """What to say when ``namespace`` itself does not exist: the namespaces that do."""
    try:
        namespaces = [_joined(ns) for ns in catalog.list_namespaces()]
    except Exception as error:  # only a hint: never let it hide the real problem
        return f"Namespace {_joined(namespace)!r} does not exist (listing namespaces failed: {type(error).__name__})."
    if not namespaces:
        return f"Namespace {_joined(namespace)!r} does not exist; the catalog has no namespaces at all."
    return (
        f"Namespace {_joined(namespace)!r} does not exist; the catalog's namespaces are: "
        f"{_some(namespaces, _joined(namespace))}."
    )


def _what_exists(catalog: Catalog, identifier: str) -> str:
    namespace = Catalog.namespace_from(identifier)
    try:
        tables = [_joined(t) for t in catalog.list_tables(namespace)]
    except NoSuchNamespaceError:
        return _existing_elsewhere(catalog, namespace)
    except Exception as error:  # only a hint
        return f"(Listing the tables of namespace {_joined(namespace)!r} failed: {type(error).__name__}.)"
    if not tables:
        return f"Namespace {_joined(namespace)!r} holds no tables."
    return f"Namespace {_joined(namespace)!r} holds {len(tables)} table(s): {_some(tables, identifier)}."


def _missing_table_message(catalog: Catalog, identifier: str) -> str:
    return (
        f"tables[].source: table {identifier!r} does not exist in catalog {catalog.name!r}. "
        f"{_what_exists(catalog, identifier)} Fix tables[].source in the config (namespace.table, as "
        "the catalog names it), or check that the catalog section points at the catalog that holds it."
    )


# --- identifier columns ------------------------------------------------------------------------------


def _field_path(struct: StructType, name: str) -> list[NestedField] | None:
    """The fields from the top down to ``name``: an exact name first, else ``struct.rest`` through structs.

    The same resolution as :func:`iceberg_cdc.canonical.column_at` on the Arrow
    side, so a name means the same column in the plan and in the data.
    """
    for field in struct.fields:
        if field.name == name:
            return [field]
    for field in struct.fields:
        if isinstance(field.field_type, StructType) and name.startswith(field.name + "."):
            rest = _field_path(field.field_type, name[len(field.name) + 1 :])
            if rest is not None:
                return [field, *rest]
    return None


def _column_names(schema: Schema) -> list[str]:
    """Every name an identifier column may take: top-level columns and fields nested in structs only."""
    names: list[str] = []

    def walk(struct: StructType, prefix: str) -> None:
        for field in struct.fields:
            names.append(prefix + field.name)
            if isinstance(field.field_type, StructType):
                walk(field.field_type, f"{prefix}{field.name}.")

    walk(schema.as_struct(), "")
    return names


def _through_list_or_map(schema: Schema, name: str) -> bool:
    """Whether ``name`` is a field of the schema that sits inside a list or a map."""
    try:
        field_id = schema.find_field(name).field_id
    except ValueError:
        return False
    try:
        schema.accessor_for_field(field_id)  # accessors reach fields through structs only
    except ValueError:
        return True
    return False


def resolve_identifier_columns(table_config: TableConfig, schema: Schema) -> list[str] | None:
    """The identifier columns of the source: configured ``identifier_columns``, else the table's identifier fields.

    Names are top-level columns or dotted paths to fields nested in structs
    (``k.a``, Iceberg's full name). ``None`` means the table has none: the
    whole row is the key. A name that does not exist, or that sits inside a
    list or map, raises :class:`ConfigError` naming the table, the key and the fix.
    """
    configured = table_config.identifier_columns
    names = list(configured) if configured else sorted(schema.identifier_field_names()) or None
    if not names:
        return None
    where = "tables[].identifier_columns" if configured else "the table's identifier fields"
    struct = schema.as_struct()
    for name in names:
        if _field_path(struct, name) is not None:
            continue
        if _through_list_or_map(schema, name):
            raise ConfigError(
                f"table {table_config.source}: identifier column {name!r} ({where}) is inside a list or a "
                "map, so one row would have several key values. Set tables[].identifier_columns to "
                "top-level columns or fields nested in structs only."
            )
        known = _column_names(schema)
        close = difflib.get_close_matches(name, known, n=3)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise ConfigError(
            f"table {table_config.source}: identifier column {name!r} ({where}) does not exist in the "
            f"source schema (columns: {sorted(known)}).{hint} Fix tables[].identifier_columns in the "
            "config, or leave it out to use the table's identifier fields."
        )
    return names

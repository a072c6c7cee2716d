"""Cheap change detection on a catalog: every watched table's metadata location, in as few calls as it allows.

An Iceberg commit always writes a new metadata file and swaps the catalog's
pointer to it, so "the metadata location changed" is the cheapest complete
signal that a table may have a new snapshot. What one poll costs depends on
the catalog:

* **SQL** (the JDBC catalog schema, SQLite/PostgreSQL/MySQL): one query over
  its ``iceberg_tables`` table for the whole catalog, however many tables are
  watched;
* **Glue**: one ``GetTables`` call per namespace (database) that holds a
  watched table (more only past 100 tables in one database: pagination);
* **anything else** (REST, Hive, ...): one ``load_table`` per watched table --
  these catalogs have no listing that returns metadata locations.

Only when a location changed is the new metadata file read
(:func:`main_snapshot_id`), to tell a new snapshot on ``main`` apart from a
commit that only changed properties or refs (the pipeline's own
``protect_pending`` tags): one object read per change, never per poll.

No Airflow here: :mod:`iceberg_cdc.airflow.triggers.catalog_snapshots` runs it
in Airflow's triggerer, one poll shared by all tables of a catalog.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
from pyiceberg.serializers import FromInputFile
from pyiceberg.table.refs import MAIN_BRANCH

from iceberg_cdc.config import CatalogConfig, catalog_key  # noqa: F401  (catalog_key: its callers' import)

log = logging.getLogger("iceberg_cdc")

# The JDBC catalog's table of tables (Iceberg's JdbcCatalog and pyiceberg's SqlCatalog share it).
_SQL_LOCATIONS = (
    "SELECT table_namespace, table_name, metadata_location FROM iceberg_tables WHERE catalog_name = :catalog"
)


@dataclass
class CatalogPoller:
    """Polls one catalog for the metadata locations of ``tables`` (``namespace.table`` identifiers).

    ``calls`` counts the catalog calls made (SQL queries, Glue requests, table
    loads), for the poll's cost figure.
    """

    catalog: Catalog
    tables: list[str]
    calls: int = 0
    _by_namespace: dict[str, list[str]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        grouped: dict[str, list[str]] = defaultdict(list)
        for identifier in self.tables:
            namespace, _, name = identifier.rpartition(".")
            grouped[namespace].append(name)
        self._by_namespace = dict(grouped)

    @property
    def kind(self) -> str:
        """``sql``, ``glue`` or ``per-table``: how one poll reaches the catalog."""
        from pyiceberg.catalog.sql import SqlCatalog

        if isinstance(self.catalog, SqlCatalog):
            return "sql"
        if type(self.catalog).__name__ == "GlueCatalog":
            return "glue"
        return "per-table"

    def locations(self) -> dict[str, str | None]:
        """``identifier -> metadata location`` for every watched table (None: the table does not exist)."""
        kind = self.kind
        if kind == "sql":
            found = self._sql()
        elif kind == "glue":
            found = self._glue()
        else:
            found = self._per_table()
        return {identifier: found.get(identifier) for identifier in self.tables}

    def _sql(self) -> dict[str, str | None]:
        from sqlalchemy import text

        with self.catalog.engine.connect() as connection:  # type: ignore[attr-defined]
            self.calls += 1
            rows = connection.execute(text(_SQL_LOCATIONS), {"catalog": self.catalog.name}).all()
        return {f"{namespace}.{name}": location for namespace, name, location in rows}

    def _glue(self) -> dict[str, str | None]:
        client = self.catalog.glue  # type: ignore[attr-defined]
        found: dict[str, str | None] = {}
        for namespace in self._by_namespace:
            token = None
            while True:
                arguments: dict[str, Any] = {"DatabaseName": namespace}
                if token:
                    arguments["NextToken"] = token
                self.calls += 1
                try:
                    page = client.get_tables(**arguments)
                except client.exceptions.EntityNotFoundException:
                    break
                for entry in page.get("TableList", []):
                    location = (entry.get("Parameters") or {}).get("metadata_location")
                    found[f"{namespace}.{entry['Name']}"] = location
                token = page.get("NextToken")
                if not token:
                    break
        return found

    def _per_table(self) -> dict[str, str | None]:
        found: dict[str, str | None] = {}
        for identifier in self.tables:
            self.calls += 1
            try:
                found[identifier] = self.catalog.load_table(identifier).metadata_location
            except (NoSuchTableError, NoSuchNamespaceError):
                found[identifier] = None
        return found


def main_snapshot_id(file_io_for: Callable[[str], Any], metadata_location: str) -> int | None:
    """The snapshot ``main`` points at in one metadata file (None for a table without snapshots)."""
    metadata = FromInputFile.table_metadata(file_io_for(metadata_location).new_input(metadata_location))
    ref = metadata.refs.get(MAIN_BRANCH)
    if ref is not None:
        return ref.snapshot_id
    return metadata.current_snapshot_id

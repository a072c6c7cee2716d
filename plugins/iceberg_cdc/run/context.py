"""What every step of a DAG run works with: one table of the config, its storage and catalog."""

from __future__ import annotations

from dataclasses import dataclass

from iceberg_cdc.config import CdcConfig, TableConfig
from iceberg_cdc.coordination.lease import TableLease
from iceberg_cdc.pipeline.runtime import (
    ConnectionProperties,
    Runtime,
    load_catalog_from_config,
    runtime_from_config,
)


@dataclass(frozen=True)
class Context:
    """One table of the config, with storage and catalog access."""

    config: CdcConfig
    table: TableConfig
    runtime: Runtime
    connections: ConnectionProperties | None = None  # resolves named connections (the Airflow hook)

    @classmethod
    def of(cls, config: CdcConfig, source: str, connections: ConnectionProperties | None = None) -> Context:
        return cls(config, config.table(source), runtime_from_config(config, connections), connections)

    def catalog(self):
        return load_catalog_from_config(self.config, self.connections)

    def lease(self) -> TableLease:
        return TableLease(self.runtime.store(), self.table.source)

    def __repr__(self) -> str:
        # The config holds credentials; a context may end up in a log or a traceback.
        return f"Context(table={self.table.source!r}, sink={self.table.sink!r}, runtime={self.runtime!r})"

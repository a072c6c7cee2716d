"""The whole config (:class:`CdcConfig`): its sections, its tables, and the rules across them."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from iceberg_cdc.config.base import Strict
from iceberg_cdc.config.sections import CatalogConfig, EventsConfig, ShuffleConfig, SparkConfig
from iceberg_cdc.config.tables import TableConfig
from iceberg_cdc.errors import ConfigError
from iceberg_cdc.redaction import redact_value


class CdcConfig(Strict):
    catalog: CatalogConfig
    shuffle: ShuffleConfig
    tables: list[TableConfig] = Field(min_length=1)
    spark: SparkConfig = Field(default_factory=SparkConfig)
    events: EventsConfig = Field(default_factory=EventsConfig)

    @model_validator(mode="after")
    def _distinct(self) -> CdcConfig:
        for attr in ("source", "sink"):
            seen = [getattr(t, attr) for t in self.tables]
            dupes = sorted({s for s in seen if seen.count(s) > 1})
            if dupes:
                raise ValueError(f"tables: {attr} {dupes} configured more than once")
        captured = {t.source.lower() for t in self.tables} | {t.sink.lower() for t in self.tables}
        targets: dict[tuple[str, str | None, str], str] = {}
        for table in self.tables:
            for mirror in table.mirrors:
                if mirror.type == "iceberg" and mirror.table.lower() in captured:
                    raise ValueError(
                        f"tables: the Iceberg mirror {mirror.table!r} of {table.source} is a configured source "
                        "or sink; give the mirror a table of its own"
                    )
                where = (mirror.type, mirror.conn_id or mirror.dsn, mirror.table.lower())
                if where in targets:
                    raise ValueError(
                        f"tables: {mirror.describe()} is configured twice ({targets[where]} and {table.source}); "
                        "two mirrors must not write one table"
                    )
                targets[where] = table.source
        return self

    def table(self, source: str) -> TableConfig:
        for table in self.tables:
            if table.source == source:
                return table
        raise ConfigError(
            f"table {source!r} is not in the config (configured: {[t.source for t in self.tables]})"
        )

    def s3_properties(self) -> dict[str, str]:
        """S3 properties for shuffle objects: the shuffle's own, else the catalog's ``s3.*``."""
        own = self.shuffle.s3_properties
        if own:
            return own
        return {k: v for k, v in self.catalog.properties.items() if k.startswith("s3.")}

    def redacted(self) -> dict[str, Any]:
        """The config as a dict with every secret value replaced, safe to log."""
        return redact_value(self.model_dump(mode="json"))

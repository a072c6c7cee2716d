"""The watermark: how far the sink has processed one source table.

Shared by the source side (which snapshot comes next) and the sink side (where
it is kept). It is a value, not a location: :mod:`iceberg_cdc.sink.table` stores it in the
sink table's properties (per source table) and :mod:`iceberg_cdc.sink.commit`
moves it in the same Iceberg commit as the change rows it covers, so the sink's
data and its progress can never disagree after a crash.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Watermark:
    """The last source snapshot whose changes are in the sink (or that was skipped).

    ``source_uuid`` is the source table's ``table-uuid``: a source table dropped
    and recreated under the same name has a new uuid, so an old watermark is
    never taken for the new table's progress. ``ordinal`` increases along the
    source's history (snapshot ids are random), so "not backwards" compares it.
    """

    source_uuid: str
    snapshot_id: int
    ordinal: int

    def to_dict(self) -> dict[str, Any]:
        return {"source_uuid": self.source_uuid, "snapshot_id": self.snapshot_id, "ordinal": self.ordinal}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Watermark:
        return cls(str(data["source_uuid"]), int(data["snapshot_id"]), int(data["ordinal"]))

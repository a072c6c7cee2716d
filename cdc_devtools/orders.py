"""The small ``shop.orders`` table of the pipeline tests: id (key), region (partition), status."""

from __future__ import annotations

import pyarrow as pa
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "region", StringType(), required=False),
    NestedField(3, "status", StringType(), required=False),
    identifier_field_ids=[1],
)
BY_REGION = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "region"))


def rows(ids, region: str | list[str] = "us", status: str = "new") -> pa.Table:
    """Orders ``ids``, all in ``region`` (or one region per id), with ``status``."""
    ids = list(ids)
    regions = region if isinstance(region, list) else [region] * len(ids)
    return pa.Table.from_pydict(
        {"id": ids, "region": regions, "status": [status] * len(ids)}, schema=SCHEMA.as_arrow()
    )

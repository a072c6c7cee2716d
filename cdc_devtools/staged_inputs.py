"""Net changes staged for the Iceberg mirror target directly, without the mirror DAG: tests and benches.

The target (:mod:`iceberg_cdc.mirror.iceberg.steps`) reads two staged
documents (:mod:`iceberg_cdc.mirror.iceberg.inputs`): the mirror DAG's plan,
and this list of Parquet parts, which only the harnesses write -- so its
writer lives here, outside the ``iceberg_cdc`` the wheel ships. A harness run
holds the lease :func:`default_lease_name` names and passes it in ``staged``
with ``run_id`` and ``epoch``.
"""

from __future__ import annotations

import io
import json
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from iceberg_cdc.storage import ObjectStore


class MarkLike(Protocol):
    changelog_snapshot_id: int
    source_snapshot_id: int
    ordinal: int


class NetChangesLike(Protocol):
    upserts: pa.Table
    deletes: pa.Table
    key_columns: tuple[str, ...]
    through: MarkLike


def default_lease_name(mirror_table: str) -> str:
    """The lease a harness's apply to ``mirror_table`` runs under (the mirror DAG has its own)."""
    return f"mirror.{mirror_table}"


def _parquet_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def stage_net_changes(
    store: ObjectStore, prefix: str, net: NetChangesLike, *, source: str = "", part_rows: int = 1_000_000
) -> str:
    """Stage ``net`` under ``prefix`` (Parquet parts of at most ``part_rows`` rows); returns the document's key."""
    prefix = prefix.rstrip("/") + "/"

    def parts(name: str, table: pa.Table) -> list[dict[str, Any]]:
        out = []
        for i, start in enumerate(range(0, table.num_rows, part_rows)):
            key = f"{prefix}{name}-{i:05d}.parquet"
            chunk = table.slice(start, part_rows)
            store.put(key, _parquet_bytes(chunk))
            out.append({"key": key, "rows": chunk.num_rows})
        return out

    document = {
        "key_columns": list(net.key_columns),
        "through": {
            "changelog_snapshot_id": int(net.through.changelog_snapshot_id),
            "source_snapshot_id": int(net.through.source_snapshot_id),
            "ordinal": int(net.through.ordinal),
        },
        "upserts": parts("upserts", net.upserts),
        "deletes": parts("deletes", net.deletes.select(list(net.key_columns))),
        "source": source,
    }
    key = f"{prefix}net-changes.json"
    store.put(key, json.dumps(document).encode())
    return key

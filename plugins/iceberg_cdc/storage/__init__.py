"""Object stores for shuffle files: ``s3://`` and ``file://``."""

from __future__ import annotations

from collections.abc import Mapping

from iceberg_cdc.storage.base import ObjectInfo, ObjectStore, ObjectWriter
from iceberg_cdc.storage.local import LocalObjectStore

__all__ = ["ObjectInfo", "ObjectStore", "ObjectWriter", "LocalObjectStore", "open_store"]


def open_store(uri: str, properties: Mapping[str, str] | None = None) -> ObjectStore:
    """Open the store behind ``uri``.

    ``properties`` are pyiceberg-style ``s3.*`` keys (endpoint, credentials,
    region) plus ``s3.sse`` / ``s3.sse-kms-key-id`` / ``s3.part-size`` for
    writes; credentials left out come from boto3's default chain.
    """
    properties = dict(properties or {})
    if uri.startswith("s3://"):
        from iceberg_cdc.storage.s3 import DEFAULT_PART_SIZE, S3ObjectStore, s3_client

        return S3ObjectStore(
            uri,
            s3_client(properties),
            part_size=int(properties.get("s3.part-size", DEFAULT_PART_SIZE)),
            sse=properties.get("s3.sse"),
            sse_kms_key_id=properties.get("s3.sse-kms-key-id"),
        )
    if uri.startswith("file://"):
        return LocalObjectStore(uri[len("file://") :])
    raise ValueError(f"unsupported shuffle URI {uri!r}: use s3://bucket/prefix or file:///absolute/dir")

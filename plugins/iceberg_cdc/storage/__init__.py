"""Object stores for shuffle files: ``s3://`` and ``file://``."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

from iceberg_cdc.errors import ConfigError
from iceberg_cdc.storage.base import ObjectInfo, ObjectStore, ObjectWriter, get_json_many
from iceberg_cdc.storage.local import LocalObjectStore

__all__ = [
    "RETRYING_IO_IMPL",
    "ObjectInfo",
    "ObjectStore",
    "ObjectWriter",
    "LocalObjectStore",
    "get_json_many",
    "open_store",
]

# ``py-io-impl`` of the FileIO that retries transient S3 errors (:mod:`iceberg_cdc.storage.retrying_io`).
# A string, so the config layer can name it without importing pyiceberg.
RETRYING_IO_IMPL = "iceberg_cdc.storage.retrying_io.RetryingPyArrowFileIO"


_S3_CLIENTS: dict[tuple[int, tuple[tuple[str, str], ...]], Any] = {}
_S3_CLIENTS_LOCK = threading.Lock()


def _shared_s3_client(properties: Mapping[str, str]) -> Any:
    """One boto3 S3 client per process and set of properties.

    Making a client costs about 0.3 s here (a new botocore session loads the
    service model from disk), and a DAG step opens the store several times. A
    boto3 client is thread-safe, so one can serve every store of the process;
    the pid in the key keeps a forked child (Spark's Python workers) off the
    connections of its parent.
    """
    from iceberg_cdc.storage.s3 import s3_client

    key = (os.getpid(), tuple(sorted(properties.items())))
    with _S3_CLIENTS_LOCK:
        client = _S3_CLIENTS.get(key)
        if client is None:
            client = _S3_CLIENTS[key] = s3_client(properties)
        return client


def open_store(uri: str, properties: Mapping[str, str] | None = None) -> ObjectStore:
    """Open the store behind ``uri``.

    ``properties`` are pyiceberg-style ``s3.*`` keys (endpoint, credentials,
    region) plus ``s3.sse`` / ``s3.sse-kms-key-id`` / ``s3.part-size`` for
    writes; credentials left out come from boto3's default chain.
    """
    properties = dict(properties or {})
    if uri.startswith("s3://"):
        from iceberg_cdc.storage.s3 import DEFAULT_PART_SIZE, S3ObjectStore

        return S3ObjectStore(
            uri,
            _shared_s3_client(properties),
            part_size=int(properties.get("s3.part-size", DEFAULT_PART_SIZE)),
            sse=properties.get("s3.sse"),
            sse_kms_key_id=properties.get("s3.sse-kms-key-id"),
        )
    if uri.startswith("file://"):
        return LocalObjectStore(uri[len("file://") :])
    raise ConfigError(
        f"unsupported shuffle URI {uri!r}: set shuffle.uri to s3://bucket/prefix or file:///absolute/dir"
    )

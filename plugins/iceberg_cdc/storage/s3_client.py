"""The boto3 S3 client the shuffle store uses: ``s3.*`` properties, standard retries, a wide retry quota."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import boto3
import botocore.config


def split_s3_uri(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise ValueError(f"not an s3:// URI: {uri!r}")
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    if not bucket:
        raise ValueError(f"S3 URI {uri!r} has no bucket")
    return bucket, prefix.strip("/")


def s3_client(properties: Mapping[str, str], max_attempts: int = 8) -> Any:
    """A boto3 S3 client from pyiceberg-style ``s3.*`` properties.

    Properties left out fall back to boto3's own chain (environment, shared
    config, instance role), so credentials need not be in any file.
    """
    config = botocore.config.Config(
        retries={"max_attempts": max_attempts, "mode": "standard"},
        max_pool_connections=32,
        s3={"addressing_style": "path"} if properties.get("s3.endpoint") else None,
    )
    client = boto3.session.Session().client(
        "s3",
        endpoint_url=properties.get("s3.endpoint"),
        aws_access_key_id=properties.get("s3.access-key-id"),
        aws_secret_access_key=properties.get("s3.secret-access-key"),
        aws_session_token=properties.get("s3.session-token"),
        region_name=properties.get("s3.region") or "us-east-1",
        config=config,
    )
    widen_retry_quota(client)
    return client


def widen_retry_quota(client: Any, capacity: int = 1_000_000) -> bool:
    """Give the client's retry quota (standard mode's token bucket) room for a burst of errors.

    botocore spends 14 of 500 tokens per retry and returns only the last
    retry's on success, so an error burst (measured: a proxy failing half the
    requests empties it within seconds) leaves every later request of the
    process, on this shared client, with no retry at all. Each request's
    attempts stay bounded by ``max_attempts``, which is what protects S3
    here. The quota is internal to botocore, hence the guarded lookup:
    returns False (and leaves the client as it is) where it is not found.
    """
    emitter = getattr(client.meta.events, "_emitter", None)
    entry = (getattr(emitter, "_unique_id_handlers", None) or {}).get("retry-config-s3") or {}
    checker = getattr(getattr(entry.get("handler"), "__self__", None), "_retry_quota", None)
    quota = getattr(checker, "_quota", None)
    if quota is None or not hasattr(quota, "_available_capacity") or not hasattr(quota, "_max_capacity"):
        return False
    quota._max_capacity = quota._available_capacity = capacity
    return True

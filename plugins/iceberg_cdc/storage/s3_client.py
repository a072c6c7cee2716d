"""The boto3 S3 client the shuffle store and the leases use: ``s3.*`` properties, one attempt per call.

botocore makes **one attempt** per call (``retries={"mode": "standard",
"total_max_attempts": 1}``, its public configuration): retries belong to
:meth:`iceberg_cdc.storage.s3.S3ObjectStore._request` alone, which also
covers what botocore cannot (a body cut mid-stream, a batch DELETE's failed
keys) and counts every request it makes. With botocore retrying too, the
attempts multiplied (its ``max_attempts=8`` means 9 attempts, times 3 of
the store's rounds: 27 requests per failing call, 135 for a GET whose body
kept breaking off) and its standard mode's per-client retry quota, emptied
by a burst of errors, could only be widened through botocore's private
attributes. With one attempt the quota is never drawn on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import boto3
import botocore.config

# botocore's own attempts per call: one, the first (see the module docstring).
BOTOCORE_ATTEMPTS = 1


def split_s3_uri(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise ValueError(f"not an s3:// URI: {uri!r}")
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    if not bucket:
        raise ValueError(f"S3 URI {uri!r} has no bucket")
    return bucket, prefix.strip("/")


def s3_client(properties: Mapping[str, str]) -> Any:
    """A boto3 S3 client from pyiceberg-style ``s3.*`` properties, making one attempt per call.

    Properties left out fall back to boto3's own chain (environment, shared
    config, instance role), so credentials need not be in any file.
    """
    config = botocore.config.Config(
        retries={"mode": "standard", "total_max_attempts": BOTOCORE_ATTEMPTS},
        max_pool_connections=32,
        s3={"addressing_style": "path"} if properties.get("s3.endpoint") else None,
    )
    return boto3.session.Session().client(
        "s3",
        endpoint_url=properties.get("s3.endpoint"),
        aws_access_key_id=properties.get("s3.access-key-id"),
        aws_secret_access_key=properties.get("s3.secret-access-key"),
        aws_session_token=properties.get("s3.session-token"),
        region_name=properties.get("s3.region") or "us-east-1",
        config=config,
    )

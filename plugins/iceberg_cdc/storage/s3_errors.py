"""What an S3 answer means: done or not (conditional requests), worth another attempt, or a named error.

The one retry loop (:meth:`iceberg_cdc.storage.s3.S3ObjectStore._request`)
asks this module how to read each failure; every message names the object and
the fix, and a transient one that ran out of attempts says how many were made.
"""

from __future__ import annotations

from typing import Any

import botocore.exceptions

from iceberg_cdc.errors import (
    MissingBucketError,
    ObjectNotFoundError,
    ShortObjectError,
    StorageError,
    TransientStorageError,
)

# Answers to a conditional request whose precondition did not hold: nothing was done.
_CONDITION_FAILED = frozenset(
    {"PreconditionFailed", "412", "ConditionalRequestConflict", "409", "NoSuchKey", "404"}
)
# Answers that a later attempt may not get: server errors and throttling (botocore's lists).
TRANSIENT_CODES = frozenset(
    {
        "InternalError",
        "ServiceUnavailable",
        "SlowDown",
        "RequestTimeout",
        "RequestTimeoutException",
        "Throttling",
        "ThrottlingException",
        "RequestThrottled",
        "TooManyRequestsException",
        "BandwidthLimitExceeded",
    }
)
_RETRY_SAFE = (
    "Retrying the DAG run is safe: nothing was committed to the sink and its watermark did not move."
)
# Failures of the connection, not answers: worth another round (NoCredentialsError & co. are not).
CONNECTION_ERRORS = (botocore.exceptions.ConnectionError, botocore.exceptions.HTTPClientError)
# A response body that broke off while it was read.
STREAM_ERRORS = (
    botocore.exceptions.IncompleteReadError,
    botocore.exceptions.ResponseStreamingError,
    botocore.exceptions.ReadTimeoutError,
    botocore.exceptions.ConnectionClosedError,
)

# How a transient failure that outlasted the attempts is told (``transient``'s ``what``).
UNREACHABLE = "failed after {attempts} attempts ({exc}); check that the endpoint is reachable and healthy"
BODY_BROKE_OFF = "response body broke off {attempts} times ({exc})"
KEYS_FAILING = "left keys failing for {attempts} attempts ({exc})"


def condition_failed(exc: botocore.exceptions.ClientError) -> bool:
    """S3's "precondition did not hold" answers to a conditional request: nothing was done."""
    code = exc.response.get("Error", {}).get("Code", "")
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code in _CONDITION_FAILED or (not code and status in (404, 409, 412))


def transient(where: str, method: Any, attempts: int, what: str, **values: Any) -> TransientStorageError:
    """Retries ran out on a transient failure: name the object, the operation and the attempts."""
    operation = getattr(method, "__name__", "request")
    return TransientStorageError(
        f"{where}: S3 {operation} {what.format(attempts=attempts, **values)}. {_RETRY_SAFE}",
        retry_safe=True,
        location=where,
        operation=operation,
        attempts=attempts,
    )


def translate(
    exc: botocore.exceptions.ClientError, where: str, bucket: str, prefix: str, method: Any, attempts: int
) -> StorageError:
    """An S3 error answer as the StorageError that names it (a TransientStorageError when worth retrying)."""
    code = exc.response.get("Error", {}).get("Code", "")
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if code in TRANSIENT_CODES or (isinstance(status, int) and (status >= 500 or status == 429)):
        return transient(
            where,
            method,
            attempts,
            "kept answering {answer} for {attempts} attempts; check the endpoint's "
            "health (or raise its request rate limit)",
            answer=code or status,
        )
    if code in ("NoSuchKey", "404", "NotFound"):
        return ObjectNotFoundError(f"{where} does not exist")
    if code == "InvalidRange" or status == 416:
        return ShortObjectError(f"{where}: the requested byte range starts past the end of the object")
    if code == "NoSuchBucket":
        return MissingBucketError(
            f"{where}: bucket {bucket!r} does not exist. Create it, or fix shuffle.uri."
        )
    if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403"):
        return StorageError(
            f"{where}: access denied ({code}); check the S3 credentials (s3.access-key-id and "
            "s3.secret-access-key under shuffle or catalog in the config, the Airflow connection "
            "named by airflow_conn_id, or the environment) and that they may read, write, list and "
            f"delete under s3://{bucket}/{prefix}"
        )
    return StorageError(f"{where}: S3 answered {code or status} after retries: {exc}")

"""S3 object store through boto3.

Retries, on every verb (GET, ranged GET, PUT, multipart create / part /
complete, LIST, DELETE, conditional PUT / DELETE): botocore's ``standard``
mode retries 5xx answers, throttling (``SlowDown``, 503, 429) and connection
errors -- refused, reset, closed before the answer, a response cut
mid-body for non-streaming calls (measured through ``cdc_devtools.fault_proxy``)
-- with exponential backoff and jitter, ``max_attempts`` in all. botocore
only retries until a GET's response headers arrive, so a GET whose body
breaks off mid-stream is retried here (:meth:`S3ObjectStore._read_versioned`).
botocore's per-client retry quota (which, once a burst of errors has
emptied it, lets no request retry at all) is widened (:func:`widen_retry_quota`),
and when botocore gives up on a transient failure the call is made again, up
to ``request_rounds`` times with backoff (:meth:`S3ObjectStore._request`).
Three more gaps are closed here: a batch DELETE answers 200 with per-key
``InternalError`` / ``SlowDown`` entries (those keys are deleted again); a
multipart COMPLETE whose answer was lost and that is retried may find the
upload gone (``NoSuchUpload``) -- it is done when the object's ETag is the one
the parts make; and when retries run out on a transient error, the error is
:class:`~iceberg_cdc.errors.TransientStorageError` naming the object, the
operation and the attempts. 4xx answers (not found, access denied, bad
request) are never retried.

Whole-object writes are idempotent: repeating a PUT whose answer was lost
writes the same bytes again. Conditional writes are not: a conditional PUT or
DELETE that S3 applied but whose answer was lost is retried by botocore and
then fails its own precondition (the ETag changed, or the key is gone), so it
comes back as "not done" (None / False) although it was done. Callers must
read the object back and recognise their own write; ``coordination.lease``
does, by the random token inside every write (an unrecognised release only
reports "not released" while the tombstone is in place).

Large objects go up as multipart uploads (parts of ``part_size`` bytes, at
least the 5 MiB S3 minimum); small ones as one PUT. Server-side encryption is
applied to every object written when configured.

Conditional writes (for leases) use S3's preconditions: ``If-None-Match: *``
on PUT (AWS since August 2024), ``If-Match: <ETag>`` on PUT (November 2024)
and on DELETE (general purpose buckets since September 2025). S3 answers a
failed precondition with 412 ``PreconditionFailed`` (409
``ConditionalRequestConflict`` when a concurrent write to the key is in
flight; 404 ``NoSuchKey`` for ``If-Match`` on a missing key): these mean
"not done", not an error. An S3-compatible store that *ignores* these
headers makes them unconditional; see ``coordination.lease.probe_conditional_writes``.
moto 5.2.5 (the local S3 server) honours all three but checks and then writes
without a lock, so two *concurrent* conditional requests can both pass
(measured: 5 in 2,300 four-way races): good for tests, not for coordination.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, BinaryIO

import botocore.config
import botocore.exceptions

from iceberg_cdc.errors import ObjectNotFoundError, ShortObjectError, StorageError, TransientStorageError
from iceberg_cdc.retry import S3_REQUEST_ROUNDS, S3_STREAM_RETRIES
from iceberg_cdc.storage.base import ObjectInfo, ObjectStore, ObjectWriter
from iceberg_cdc.storage.s3_client import s3_client, split_s3_uri, widen_retry_quota
from iceberg_cdc.storage.s3_writer import DEFAULT_PART_SIZE, MIN_PART_SIZE, S3Writer, multipart_etag

__all__ = [
    "DEFAULT_PART_SIZE",
    "MIN_PART_SIZE",
    "S3ObjectStore",
    "multipart_etag",
    "s3_client",
    "split_s3_uri",
    "widen_retry_quota",
]

# Answers to a conditional request whose precondition did not hold: nothing was done.
_CONDITION_FAILED = frozenset(
    {"PreconditionFailed", "412", "ConditionalRequestConflict", "409", "NoSuchKey", "404"}
)
# Answers that a later attempt may not get: server errors and throttling (botocore's lists).
_TRANSIENT_CODES = frozenset(
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
_CONNECTION_ERRORS = (botocore.exceptions.ConnectionError, botocore.exceptions.HTTPClientError)
_STREAM_CHUNK = 1 << 20
_STREAM_ERRORS = (
    botocore.exceptions.IncompleteReadError,
    botocore.exceptions.ResponseStreamingError,
    botocore.exceptions.ReadTimeoutError,
    botocore.exceptions.ConnectionClosedError,
)


def _condition_failed(exc: botocore.exceptions.ClientError) -> bool:
    """S3's "precondition did not hold" answers to a conditional request: nothing was done."""
    code = exc.response.get("Error", {}).get("Code", "")
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code in _CONDITION_FAILED or (not code and status in (404, 409, 412))


class S3ObjectStore(ObjectStore):
    def __init__(
        self,
        uri: str,
        client: Any,
        *,
        part_size: int = DEFAULT_PART_SIZE,
        sse: str | None = None,
        sse_kms_key_id: str | None = None,
        stream_retries: int = S3_STREAM_RETRIES.retries,
        request_rounds: int = S3_REQUEST_ROUNDS.attempts,
    ) -> None:
        if part_size < MIN_PART_SIZE:
            raise ValueError(f"S3 multipart part size must be at least 5 MiB, got {part_size}")
        self.bucket, self.prefix = split_s3_uri(uri)
        self.uri = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        self.client = client
        self.part_size = part_size
        self.sse_args: dict[str, str] = {}
        if sse:
            self.sse_args["ServerSideEncryption"] = sse
        if sse_kms_key_id:
            self.sse_args["SSEKMSKeyId"] = sse_kms_key_id
        self.stream_retries = stream_retries
        self.request_rounds = request_rounds
        self.requests: Counter[str] = Counter()

    def full_key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _call(self, method: Any, key: str, **kwargs: Any) -> Any:
        """``method(**kwargs)``; see :meth:`_request`."""
        return self._request(method, key, kwargs, conditional=False)

    def _conditional(self, method: Any, key: str, **kwargs: Any) -> Any | None:
        """``method(**kwargs)``, or None when S3 says a precondition did not hold."""
        return self._request(method, key, kwargs, conditional=True)

    def _request(self, method: Any, key: str, kwargs: dict[str, Any], *, conditional: bool) -> Any:
        """One S3 call with botocore's retries, repeated (bounded, with backoff) while it fails transiently.

        Why a second layer: when botocore gives up (all its attempts failed,
        or its retry quota ran dry where :func:`widen_retry_quota` could not
        widen it), a short wait and a new round still often succeed in an
        error burst. Errors are translated into :class:`StorageError`
        subclasses naming the object.
        """
        for round_ in range(1, self.request_rounds + 1):
            try:
                return method(**kwargs)
            except botocore.exceptions.ClientError as exc:
                if conditional and _condition_failed(exc):
                    return None
                error = self._translate(exc, key, method, round_)
            except _CONNECTION_ERRORS as exc:
                error = self._unreachable(exc, key, method, round_)
            except botocore.exceptions.BotoCoreError as exc:  # no credentials, bad parameters...
                raise StorageError(f"{self.describe(key)}: S3 request not made: {exc}") from None
            if not isinstance(error, TransientStorageError) or round_ == self.request_rounds:
                raise error from None
            S3_REQUEST_ROUNDS.sleep(round_ - 1)
        raise AssertionError("unreachable")

    def _attempts(self) -> int:
        """How many attempts botocore makes of a request (for messages)."""
        config = getattr(getattr(self.client, "meta", None), "config", None)
        retries = getattr(config, "retries", None) or {}
        configured = retries.get("total_max_attempts") or retries.get("max_attempts")
        return int(configured) if configured else 1

    def _unreachable(self, exc: Exception, key: str, method: Any, rounds: int = 1) -> TransientStorageError:
        """A connection-level failure that outlasted the retries."""
        return self._transient(
            key,
            method,
            rounds,
            "failed after {attempts} attempts ({exc}); check that the endpoint is reachable and healthy",
            exc=exc,
        )

    def _transient(
        self, key: str, method: Any, rounds: int, what: str, **values: Any
    ) -> TransientStorageError:
        """Retries ran out on a transient failure: name the object, the operation and the attempts."""
        operation = getattr(method, "__name__", "request")
        attempts = self._attempts() * rounds
        return TransientStorageError(
            f"{self.describe(key)}: S3 {operation} {what.format(attempts=attempts, **values)}. {_RETRY_SAFE}",
            retry_safe=True,
            location=self.describe(key),
            operation=operation,
            attempts=attempts,
        )

    def _translate(
        self, exc: botocore.exceptions.ClientError, key: str, method: Any = None, rounds: int = 1
    ) -> StorageError:
        code = exc.response.get("Error", {}).get("Code", "")
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        where = self.describe(key)
        if code in _TRANSIENT_CODES or (isinstance(status, int) and (status >= 500 or status == 429)):
            return self._transient(
                key,
                method,
                rounds,
                "kept answering {answer} for {attempts} attempts; check the endpoint's "
                "health (or raise its request rate limit)",
                answer=code or status,
            )
        if code in ("NoSuchKey", "404", "NotFound"):
            return ObjectNotFoundError(f"{where} does not exist")
        if code == "InvalidRange" or status == 416:
            return ShortObjectError(f"{where}: the requested byte range starts past the end of the object")
        if code == "NoSuchBucket":
            return StorageError(f"bucket {self.bucket!r} does not exist: create it or fix shuffle.uri")
        if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403"):
            return StorageError(
                f"{where}: access denied ({code}); check the S3 credentials (s3.access-key-id and "
                "s3.secret-access-key under shuffle or catalog in the config, the Airflow connection "
                "named by airflow_conn_id, or the environment) and that they may read, write, list and "
                f"delete under s3://{self.bucket}/{self.prefix}"
            )
        return StorageError(f"{where}: S3 answered {code or status} after retries: {exc}")

    def open_writer(self, key: str) -> ObjectWriter:
        return S3Writer(self, key)

    def get(self, key: str) -> bytes:
        return self._read(key, None)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        data = self._read(key, (start, end))
        if len(data) != end - start:
            raise ShortObjectError(
                f"{self.describe(key)}: asked for bytes [{start}, {end}) but got {len(data)}"
            )
        return data

    def get_range_into(self, key: str, start: int, end: int, sink: BinaryIO) -> None:
        """One ranged GET streamed to ``sink`` in 1 MiB pieces; a body that breaks off resumes where it stopped."""
        position = start
        for attempt in range(self.stream_retries + 1):
            if position >= end:
                break
            self.requests["GET_RANGE"] += 1
            response = self._call(
                self.client.get_object,
                key,
                Bucket=self.bucket,
                Key=self.full_key(key),
                Range=f"bytes={position}-{end - 1}",
            )
            try:
                for piece in response["Body"].iter_chunks(_STREAM_CHUNK):
                    sink.write(piece)
                    position += len(piece)
                break
            except _STREAM_ERRORS as exc:
                if attempt == self.stream_retries:
                    raise self._body_failed(key, "GET_RANGE", attempt + 1, exc) from None
                S3_STREAM_RETRIES.sleep(attempt)
        if position != end:
            raise ShortObjectError(
                f"{self.describe(key)}: asked for bytes [{start}, {end}) but got {position - start}"
            )

    def _read(self, key: str, byte_range: tuple[int, int] | None) -> bytes:
        return self._read_versioned(key, byte_range)[0]

    def _read_versioned(self, key: str, byte_range: tuple[int, int] | None) -> tuple[bytes, str]:
        """Body and ETag of one GET; a body that breaks off mid-stream is fetched again."""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self.full_key(key)}
        if byte_range is not None:
            kwargs["Range"] = f"bytes={byte_range[0]}-{byte_range[1] - 1}"
        kind = "GET_RANGE" if byte_range else "GET"
        for attempt in range(self.stream_retries + 1):
            self.requests[kind] += 1
            response = self._call(self.client.get_object, key, **kwargs)
            try:
                return response["Body"].read(), response["ETag"]
            except _STREAM_ERRORS as exc:
                if attempt == self.stream_retries:
                    raise self._body_failed(key, kind, attempt + 1, exc) from None
                S3_STREAM_RETRIES.sleep(attempt)
        raise AssertionError("unreachable")

    def _body_failed(self, key: str, kind: str, attempts: int, exc: BaseException) -> TransientStorageError:
        return TransientStorageError(
            f"{self.describe(key)}: reading the response body of {kind} failed {attempts} times ({exc}). "
            f"{_RETRY_SAFE}",
            retry_safe=True,
            location=self.describe(key),
            operation=kind,
            attempts=attempts,
        )

    def list(self, prefix: str) -> list[ObjectInfo]:
        found: list[ObjectInfo] = []
        token: str | None = None
        strip = len(self.prefix) + 1 if self.prefix else 0
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.full_key(prefix)}
            if token:
                kwargs["ContinuationToken"] = token
            self.requests["LIST"] += 1
            response = self._call(self.client.list_objects_v2, prefix, **kwargs)
            for item in response.get("Contents", []):
                found.append(ObjectInfo(item["Key"][strip:], int(item["Size"])))
            if not response.get("IsTruncated"):
                return found
            token = response["NextContinuationToken"]

    def delete_prefix(self, prefix: str) -> int:
        keys = [info.key for info in self.list(prefix)]
        for start in range(0, len(keys), 1000):
            self._delete_batch(prefix, keys[start : start + 1000])
        return len(keys)

    def _delete_batch(self, prefix: str, keys: list[str]) -> None:
        """One batch DELETE; keys S3 reports as failed with a transient code are deleted again.

        A batch DELETE answers 200 even when some keys failed, listing them
        with their own code (``InternalError``, ``SlowDown``...): botocore sees
        a success and retries nothing.
        """
        errors: list[dict[str, Any]] = []
        for attempt in range(self.stream_retries + 1):
            self.requests["DELETE"] += 1
            response = self._call(
                self.client.delete_objects,
                prefix,
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": self.full_key(k)} for k in keys], "Quiet": True},
            )
            errors = response.get("Errors") or []
            if not errors:
                return
            if any(e.get("Code") not in _TRANSIENT_CODES for e in errors) or attempt == self.stream_retries:
                break
            strip = len(self.prefix) + 1 if self.prefix else 0
            keys = [e["Key"][strip:] for e in errors]
            S3_STREAM_RETRIES.sleep(attempt)
        first = errors[0]
        strip = len(self.prefix) + 1 if self.prefix else 0
        raise StorageError(
            f"{self.describe(first.get('Key', self.full_key(prefix))[strip:])}: delete failed "
            f"({first.get('Code')}: {first.get('Message')}); {len(errors)} objects left. "
            "Deleting is repeated by the next run's cleanup, so retrying the DAG run is safe."
        )

    # Conditional operations (leases): see the module docstring.

    def _conditional_put(self, key: str, data: bytes, **condition: str) -> str | None:
        """PUT with an If-None-Match / If-Match condition: the new ETag, or None if it failed."""
        self.requests["PUT"] += 1
        response = self._conditional(
            self.client.put_object,
            key,
            Bucket=self.bucket,
            Key=self.full_key(key),
            Body=data,
            **condition,
            **self.sse_args,
        )
        return None if response is None else response["ETag"]

    def put_if_absent(self, key: str, data: bytes) -> str | None:
        return self._conditional_put(key, data, IfNoneMatch="*")

    def get_with_version(self, key: str) -> tuple[bytes, str] | None:
        try:
            return self._read_versioned(key, None)
        except ObjectNotFoundError:
            return None

    def put_if_version(self, key: str, data: bytes, version: str) -> str | None:
        return self._conditional_put(key, data, IfMatch=version)

    def delete_if_version(self, key: str, version: str) -> bool:
        self.requests["DELETE"] += 1
        response = self._conditional(
            self.client.delete_object, key, Bucket=self.bucket, Key=self.full_key(key), IfMatch=version
        )
        return response is not None

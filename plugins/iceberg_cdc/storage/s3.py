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

import hashlib
from collections import Counter
from collections.abc import Mapping
from typing import Any, BinaryIO

import boto3
import botocore.config
import botocore.exceptions

from iceberg_cdc.errors import ObjectNotFoundError, ShortObjectError, StorageError, TransientStorageError
from iceberg_cdc.retry import S3_REQUEST_ROUNDS, S3_STREAM_RETRIES
from iceberg_cdc.storage.base import ObjectInfo, ObjectStore, ObjectWriter

MIN_PART_SIZE = 5 * 1024 * 1024
DEFAULT_PART_SIZE = 16 * 1024 * 1024
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


def multipart_etag(part_etags: list[str]) -> str:
    """The ETag S3 gives an object completed from parts with these ETags (no SSE-KMS / SSE-C)."""
    digests = b"".join(bytes.fromhex(etag.strip('"')) for etag in part_etags)
    return f"{hashlib.md5(digests, usedforsecurity=False).hexdigest()}-{len(part_etags)}"


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


class _S3Writer(ObjectWriter):
    def __init__(self, store: S3ObjectStore, key: str) -> None:
        self._store = store
        self._key = key
        self._buffer = bytearray()
        self._upload_id: str | None = None
        self._parts: list[dict[str, Any]] = []
        self._size = 0

    def write(self, data: bytes | memoryview) -> None:
        self._buffer += data
        self._size += len(data)
        while len(self._buffer) >= self._store.part_size:
            self._upload_part(bytes(self._buffer[: self._store.part_size]))
            del self._buffer[: self._store.part_size]

    def _upload_part(self, body: bytes) -> None:
        store = self._store
        if self._upload_id is None:
            store.requests["CREATE_MULTIPART"] += 1
            response = store._call(
                store.client.create_multipart_upload,
                self._key,
                Bucket=store.bucket,
                Key=store.full_key(self._key),
                **store.sse_args,
            )
            self._upload_id = response["UploadId"]
        number = len(self._parts) + 1
        store.requests["UPLOAD_PART"] += 1
        response = store._call(
            store.client.upload_part,
            self._key,
            Bucket=store.bucket,
            Key=store.full_key(self._key),
            UploadId=self._upload_id,
            PartNumber=number,
            Body=body,
        )
        self._parts.append({"ETag": response["ETag"], "PartNumber": number})

    def close(self) -> int:
        store = self._store
        if self._upload_id is None:
            store.requests["PUT"] += 1
            store._call(
                store.client.put_object,
                self._key,
                Bucket=store.bucket,
                Key=store.full_key(self._key),
                Body=bytes(self._buffer),
                **store.sse_args,
            )
        else:
            if self._buffer:
                self._upload_part(bytes(self._buffer))
            self._complete()
        self._buffer = bytearray()
        return self._size

    def _complete(self) -> None:
        """COMPLETE the upload; a retry that finds it gone checks whether the lost attempt completed it.

        botocore retries a COMPLETE whose answer was lost; S3 may then answer
        ``NoSuchUpload`` because the first attempt did complete it. The
        object's ETag then is the MD5 of the parts' MD5s, "-" and their count.
        """
        store = self._store

        def complete_multipart_upload(**kwargs: Any) -> Any:
            try:
                return store.client.complete_multipart_upload(**kwargs)
            except botocore.exceptions.ClientError as exc:
                if exc.response.get("Error", {}).get("Code") == "NoSuchUpload" and self._is_completed():
                    return {}
                raise

        store.requests["COMPLETE_MULTIPART"] += 1
        store._call(
            complete_multipart_upload,
            self._key,
            Bucket=store.bucket,
            Key=store.full_key(self._key),
            UploadId=self._upload_id,
            MultipartUpload={"Parts": self._parts},
        )

    def _is_completed(self) -> bool:
        store = self._store
        store.requests["HEAD"] += 1
        try:
            head = store.client.head_object(Bucket=store.bucket, Key=store.full_key(self._key))
        except botocore.exceptions.ClientError:
            return False
        try:
            expected = multipart_etag([p["ETag"] for p in self._parts])
        except ValueError:  # part ETags that are not MD5s (SSE-KMS, SSE-C): cannot tell
            return False
        return head.get("ETag", "").strip('"') == expected

    def abort(self) -> None:
        self._buffer = bytearray()
        if self._upload_id is not None:
            store = self._store
            try:
                store.client.abort_multipart_upload(
                    Bucket=store.bucket, Key=store.full_key(self._key), UploadId=self._upload_id
                )
            except botocore.exceptions.BotoCoreError:
                pass  # an unfinished upload is reaped by the bucket's lifecycle rule
            except botocore.exceptions.ClientError:
                pass


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
        return _S3Writer(self, key)

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

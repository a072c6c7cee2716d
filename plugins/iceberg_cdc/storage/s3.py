"""S3 object store through boto3.

Retries, on every verb (GET, ranged GET, PUT, multipart create / part /
complete, LIST, DELETE, conditional PUT / DELETE), have **one owner**:
:meth:`S3ObjectStore._request`, timed by :data:`iceberg_cdc.retry.S3_REQUEST`
(8 attempts in all, full-jitter backoff). botocore makes one attempt per call
(:func:`~iceberg_cdc.storage.s3_client.s3_client`), so a request that meets N
transient failures and then succeeds reaches S3 exactly N + 1 times, and the
attempts a message reports are the requests made. Transient: 5xx answers,
throttling (``SlowDown``, 503, 429), connection errors (refused, reset, closed
before the answer) and a response body that breaks off mid-stream -- the
request and the reading of its body are one attempt, so a cut GET is made
again (a streamed range resumes where it stopped). Two more gaps are closed
in the same loop: a batch DELETE answers 200 with per-key ``InternalError`` /
``SlowDown`` entries (those keys are deleted again, as the next attempt); a
multipart COMPLETE whose answer was lost and that is retried may find the
upload gone (``NoSuchUpload``) -- it is done when the object's ETag is the one
the parts make. When the attempts run out on a transient error, the error is
:class:`~iceberg_cdc.errors.TransientStorageError` naming the object, the
operation and the attempts. 4xx answers (not found, access denied, bad
request) are never retried.

Why the project's loop and not botocore's: botocore retries only until a
GET's headers arrive (a cut body would need a second loop around it), and its
standard mode spends a per-client retry quota that a burst of errors empties
for every later request of the process; widening it meant writing botocore's
private attributes.

Whole-object writes are idempotent: repeating a PUT whose answer was lost
writes the same bytes again. Conditional writes are not: a conditional PUT or
DELETE that S3 applied but whose answer was lost is retried and
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
from collections.abc import Callable
from typing import Any, BinaryIO

import botocore.exceptions

from iceberg_cdc.errors import ObjectNotFoundError, ShortObjectError, StorageError, TransientStorageError
from iceberg_cdc.retry import S3_REQUEST, RetryPolicy
from iceberg_cdc.storage.base import ObjectInfo, ObjectStore, ObjectWriter
from iceberg_cdc.storage.s3_client import s3_client, split_s3_uri
from iceberg_cdc.storage.s3_errors import (
    BODY_BROKE_OFF,
    CONNECTION_ERRORS,
    KEYS_FAILING,
    STREAM_ERRORS,
    TRANSIENT_CODES,
    UNREACHABLE,
    condition_failed,
    transient,
    translate,
)
from iceberg_cdc.storage.s3_writer import DEFAULT_PART_SIZE, MIN_PART_SIZE, S3Writer, multipart_etag

__all__ = [
    "DEFAULT_PART_SIZE",
    "MIN_PART_SIZE",
    "S3ObjectStore",
    "multipart_etag",
    "s3_client",
    "split_s3_uri",
]

_STREAM_CHUNK = 1 << 20


class _KeysFailed(Exception):
    """A batch DELETE answered 200 but listed keys that failed transiently: the next attempt deletes them."""


class S3ObjectStore(ObjectStore):
    def __init__(
        self,
        uri: str,
        client: Any,
        *,
        part_size: int = DEFAULT_PART_SIZE,
        sse: str | None = None,
        sse_kms_key_id: str | None = None,
        request_attempts: int = S3_REQUEST.attempts,
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
        self.policy = RetryPolicy(request_attempts, S3_REQUEST.base_delay, S3_REQUEST.max_delay)
        self.requests: Counter[str] = Counter()

    def full_key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _call(self, method: Any, key: str, **kwargs: Any) -> Any:
        """``method(**kwargs)``; see :meth:`_request`."""
        return self._request(method, key, lambda: kwargs)

    def _conditional(self, method: Any, key: str, **kwargs: Any) -> Any | None:
        """``method(**kwargs)``, or None when S3 says a precondition did not hold."""
        return self._request(method, key, lambda: kwargs, conditional=True)

    def _request(
        self,
        method: Any,
        key: str,
        kwargs: Callable[[], dict[str, Any]],
        *,
        conditional: bool = False,
        consume: Callable[[Any], Any] | None = None,
    ) -> Any:
        """``consume(method(**kwargs()))`` (the response without ``consume``), retried while it fails transiently.

        The one retry loop of the client (see the module docstring): an
        attempt is the request and the reading of its answer by ``consume``,
        so a body cut mid-stream is retried like a 503. ``kwargs`` is asked
        again for each attempt (a streamed range resumes at its position).
        Errors are translated into :class:`StorageError` subclasses naming
        the object; the transient ones, once :attr:`policy` runs out, into
        :class:`TransientStorageError` with the attempts made.
        """
        for attempt in range(1, self.policy.attempts + 1):
            reading = False  # the answer arrived: a connection error now is a body cut mid-stream
            try:
                response = method(**kwargs())
                if consume is None:
                    return response
                reading = True
                return consume(response)
            except botocore.exceptions.ClientError as exc:
                if conditional and condition_failed(exc):
                    return None
                error = translate(exc, self.describe(key), self.bucket, self.prefix, method, attempt)
            except (*STREAM_ERRORS, *CONNECTION_ERRORS) as exc:
                what = BODY_BROKE_OFF if reading else UNREACHABLE
                error = transient(self.describe(key), method, attempt, what, exc=exc)
            except _KeysFailed as exc:
                error = transient(self.describe(key), method, attempt, KEYS_FAILING, exc=exc)
            except botocore.exceptions.BotoCoreError as exc:  # no credentials, bad parameters...
                raise StorageError(f"{self.describe(key)}: S3 request not made: {exc}") from None
            if not isinstance(error, TransientStorageError) or attempt == self.policy.attempts:
                raise error from None
            self.policy.sleep(attempt - 1)
        raise AssertionError("unreachable")

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

        def remaining() -> dict[str, Any]:
            self.requests["GET_RANGE"] += 1
            return {"Bucket": self.bucket, "Key": self.full_key(key), "Range": f"bytes={position}-{end - 1}"}

        def stream(response: Any) -> None:
            nonlocal position
            try:
                for piece in response["Body"].iter_chunks(_STREAM_CHUNK):
                    sink.write(piece)
                    position += len(piece)
            except STREAM_ERRORS:
                if position < end:  # else every byte arrived before the connection broke: done
                    raise

        self._request(self.client.get_object, key, remaining, consume=stream)
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

        def request() -> dict[str, Any]:
            self.requests[kind] += 1
            return kwargs

        def body(response: Any) -> tuple[bytes, str]:
            return response["Body"].read(), response["ETag"]

        return self._request(self.client.get_object, key, request, consume=body)

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
        strip = len(self.prefix) + 1 if self.prefix else 0
        pending = list(keys)

        def request() -> dict[str, Any]:
            self.requests["DELETE"] += 1
            objects = [{"Key": self.full_key(k)} for k in pending]
            return {"Bucket": self.bucket, "Delete": {"Objects": objects, "Quiet": True}}

        def check(response: Any) -> None:
            errors = response.get("Errors") or []
            if not errors:
                return
            first = errors[0]
            if any(e.get("Code") not in TRANSIENT_CODES for e in errors):
                raise StorageError(
                    f"{self.describe(first.get('Key', self.full_key(prefix))[strip:])}: delete failed "
                    f"({first.get('Code')}: {first.get('Message')}); {len(errors)} objects left. "
                    "Deleting is repeated by the next run's cleanup, so retrying the DAG run is safe."
                )
            pending[:] = [e["Key"][strip:] for e in errors]
            raise _KeysFailed(f"{len(errors)} keys, first {first.get('Key')}: {first.get('Code')}")

        self._request(self.client.delete_objects, prefix, request, consume=check)

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

"""S3 object store through boto3.

Retries: botocore's ``standard`` mode retries throttling (``SlowDown``, 503),
5xx responses and connection errors with exponential backoff and jitter; on
top of that, a ranged GET whose body breaks off mid-stream is retried here,
because botocore only retries until the response headers arrive.

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

import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

import boto3
import botocore.config
import botocore.exceptions

from iceberg_cdc.errors import ObjectNotFoundError, ShortObjectError, StorageError
from iceberg_cdc.storage.base import ObjectInfo, ObjectStore, ObjectWriter

MIN_PART_SIZE = 5 * 1024 * 1024
DEFAULT_PART_SIZE = 16 * 1024 * 1024
# Answers to a conditional request whose precondition did not hold: nothing was done.
_CONDITION_FAILED = frozenset(
    {"PreconditionFailed", "412", "ConditionalRequestConflict", "409", "NoSuchKey", "404"}
)
_STREAM_ERRORS = (
    botocore.exceptions.IncompleteReadError,
    botocore.exceptions.ResponseStreamingError,
    botocore.exceptions.ReadTimeoutError,
    botocore.exceptions.ConnectionClosedError,
)


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
    return boto3.session.Session().client(
        "s3",
        endpoint_url=properties.get("s3.endpoint"),
        aws_access_key_id=properties.get("s3.access-key-id"),
        aws_secret_access_key=properties.get("s3.secret-access-key"),
        aws_session_token=properties.get("s3.session-token"),
        region_name=properties.get("s3.region") or "us-east-1",
        config=config,
    )


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
            store.requests["COMPLETE_MULTIPART"] += 1
            store._call(
                store.client.complete_multipart_upload,
                self._key,
                Bucket=store.bucket,
                Key=store.full_key(self._key),
                UploadId=self._upload_id,
                MultipartUpload={"Parts": self._parts},
            )
        self._buffer = bytearray()
        return self._size

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
        stream_retries: int = 4,
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
        self.requests: Counter[str] = Counter()

    def full_key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _call(self, method: Any, key: str, **kwargs: Any) -> Any:
        try:
            return method(**kwargs)
        except botocore.exceptions.ClientError as exc:
            raise self._translate(exc, key) from None
        except botocore.exceptions.BotoCoreError as exc:
            raise StorageError(
                f"{self.describe(key)}: S3 request failed after retries ({exc}); check that "
                "the endpoint is reachable"
            ) from None

    def _translate(self, exc: botocore.exceptions.ClientError, key: str) -> StorageError:
        code = exc.response.get("Error", {}).get("Code", "")
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        where = self.describe(key)
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
                    raise StorageError(
                        f"{self.describe(key)}: reading the response body failed {attempt + 1} times ({exc})"
                    ) from None
                time.sleep(min(0.2 * 2**attempt, 5.0))
        raise AssertionError("unreachable")

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
            chunk = keys[start : start + 1000]
            self.requests["DELETE"] += 1
            response = self._call(
                self.client.delete_objects,
                prefix,
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": self.full_key(k)} for k in chunk], "Quiet": True},
            )
            errors = response.get("Errors") or []
            if errors:
                first = errors[0]
                raise StorageError(
                    f"{self.describe(first.get('Key', prefix))}: delete failed "
                    f"({first.get('Code')}: {first.get('Message')}); {len(errors)} objects left"
                )
        return len(keys)

    # Conditional operations (leases): see the module docstring.

    def _conditional(self, method: Any, key: str, **kwargs: Any) -> Any | None:
        """``method(**kwargs)``, or None when S3 says a precondition did not hold."""
        try:
            return method(**kwargs)
        except botocore.exceptions.ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in _CONDITION_FAILED or (not code and status in (404, 409, 412)):
                return None
            raise self._translate(exc, key) from None
        except botocore.exceptions.BotoCoreError as exc:
            raise StorageError(
                f"{self.describe(key)}: S3 request failed after retries ({exc}); check that "
                "the endpoint is reachable"
            ) from None

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

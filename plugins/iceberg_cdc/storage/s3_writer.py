"""Writing one S3 object: a single PUT when small, else a multipart upload of ``part_size`` parts.

A multipart COMPLETE whose answer was lost and that botocore retries may find
the upload gone (``NoSuchUpload``): the write is done when the object's ETag
is the one its parts make (:func:`multipart_etag`).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any, Protocol

import botocore.exceptions

from iceberg_cdc.errors import ObjectNotFoundError
from iceberg_cdc.storage.base import ObjectWriter


class S3Target(Protocol):
    """What a writer needs of its store (:class:`iceberg_cdc.storage.s3.S3ObjectStore`)."""

    client: Any
    bucket: str
    part_size: int
    sse_args: dict[str, str]
    requests: Counter[str]

    def full_key(self, key: str) -> str: ...

    def _call(self, method: Any, key: str, **kwargs: Any) -> Any: ...


MIN_PART_SIZE = 5 * 1024 * 1024
DEFAULT_PART_SIZE = 16 * 1024 * 1024


def multipart_etag(part_etags: list[str]) -> str:
    """The ETag S3 gives an object completed from parts with these ETags (no SSE-KMS / SSE-C)."""
    digests = b"".join(bytes.fromhex(etag.strip('"')) for etag in part_etags)
    return f"{hashlib.md5(digests, usedforsecurity=False).hexdigest()}-{len(part_etags)}"


class S3Writer(ObjectWriter):
    """An :class:`ObjectWriter` on one key of ``store``, every request through the store's retries."""

    def __init__(self, store: S3Target, key: str) -> None:
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

        The store retries a COMPLETE whose answer was lost; S3 may then answer
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
            head = store._call(
                store.client.head_object, self._key, Bucket=store.bucket, Key=store.full_key(self._key)
            )
        except ObjectNotFoundError:
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

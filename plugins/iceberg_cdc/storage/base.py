"""The object store interface the shuffle needs, and nothing more.

Keys are relative to the store's root URI (``s3://bucket/prefix`` or
``file:///dir``). A store supports whole-object writes that become visible
atomically (S3 PUT / multipart complete, ``rename`` on a file system), ranged
reads, listing with sizes, and prefix deletes.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, BinaryIO


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int


class ObjectWriter(abc.ABC):
    """A streaming writer; the object appears only when :meth:`close` returns."""

    @abc.abstractmethod
    def write(self, data: bytes | memoryview) -> None: ...

    @abc.abstractmethod
    def close(self) -> int:
        """Make the object visible and return its size."""

    @abc.abstractmethod
    def abort(self) -> None:
        """Discard everything written; the object does not appear."""

    def __enter__(self) -> ObjectWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


class ObjectStore(abc.ABC):
    """Root of a shuffle location."""

    uri: str

    def describe(self, key: str) -> str:
        """Full URI of a key, for messages."""
        return f"{self.uri.rstrip('/')}/{key}"

    @abc.abstractmethod
    def open_writer(self, key: str) -> ObjectWriter: ...

    def put(self, key: str, data: bytes) -> None:
        with self.open_writer(key) as writer:
            writer.write(data)

    @abc.abstractmethod
    def get(self, key: str) -> bytes: ...

    @abc.abstractmethod
    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` with exactly one request; fewer bytes back is an error."""

    def get_range_into(self, key: str, start: int, end: int, sink: BinaryIO) -> None:
        """Bytes ``[start, end)`` written to ``sink`` (one request), for callers that must not hold them.

        Stores that can stream override this; the default reads the range whole.
        """
        sink.write(self.get_range(key, start, end))

    @abc.abstractmethod
    def list(self, prefix: str) -> list[ObjectInfo]: ...

    @abc.abstractmethod
    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under ``prefix``; return how many were deleted."""

    # Conditional operations, for small coordination objects (leases). Not
    # abstract, so stores that do not need them (test doubles) stay valid.

    def put_if_absent(self, key: str, data: bytes) -> str | None:
        """Create ``key`` with ``data`` only if no object exists there, atomically.

        Returns the new object's version, or None when the key already exists
        (nothing is written then).
        """
        raise NotImplementedError(f"{type(self).__name__} does not support conditional writes")

    def get_with_version(self, key: str) -> tuple[bytes, str] | None:
        """The object's bytes and version, read together; None when it does not exist."""
        raise NotImplementedError(f"{type(self).__name__} does not support conditional writes")

    def put_if_version(self, key: str, data: bytes, version: str) -> str | None:
        """Replace ``key`` with ``data`` only if it exists and still has ``version``, atomically.

        Returns the new version, or None when the object is gone or has
        another version (nothing is written then).
        """
        raise NotImplementedError(f"{type(self).__name__} does not support conditional writes")

    def delete_if_version(self, key: str, version: str) -> bool:
        """Delete ``key`` only if it still has ``version``; False when it is gone or changed."""
        raise NotImplementedError(f"{type(self).__name__} does not support conditional writes")


def get_json_many(store: ObjectStore, keys: Sequence[str], threads: int = 16) -> list[Any]:
    """The JSON documents at ``keys``, in that order, fetched concurrently.

    A run leaves one small record per task or range (row records, staged
    records, phase figures); reading hundreds of them one GET after another
    would cost a round trip each on S3.
    """
    if len(keys) <= 1 or threads <= 1:
        return [json.loads(store.get(key)) for key in keys]
    with ThreadPoolExecutor(max_workers=min(threads, len(keys))) as pool:
        return list(pool.map(lambda key: json.loads(store.get(key)), keys))

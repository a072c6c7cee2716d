"""Streams over S3 objects that survive transient errors: reads resume in place, writes upload whole.

pyarrow's S3 client retries requests that fail before their answer arrives,
but not a connection that breaks *inside* a response body: a ranged
``GetObject`` cut mid-body raises ``AWS Error INTERNAL_FAILURE during
GetObject: Failed to flush response stream``. These streams fix that where the
bytes move (:mod:`iceberg_cdc.storage.retrying_io` hands them out as its files' streams):

* **Reads** (:class:`ResumableInputStream`): the stream keeps its own
  position and reads with positional reads (``read_at``: one ranged GET per
  call, at most :data:`READ_CHUNK_BYTES`). A read that fails transiently, or
  returns fewer bytes than the object holds there, is repeated at the *same*
  position after reopening the object, so Parquet, Avro and JSON readers above
  it see every byte exactly once.
* **Writes** (:class:`RetryingUploadStream`): the bytes are spooled (memory
  up to ``cdc.io.spool-bytes``, then a local temp file) and uploaded when the
  stream closes, the whole upload retried. Why not wrap pyarrow's streaming
  upload: a multipart upload that fails in its 3rd part cannot be resumed by
  the caller (pyarrow's stream is dead and the caller's bytes are gone),
  whereas a spooled copy can be sent again; a whole-object PUT of identical
  bytes is idempotent, so repeating one whose answer was lost is harmless,
  and the object still appears only on close. The price: the upload starts
  after the last write instead of overlapping it, and large files pass
  through local disk. A block that raises discards the spool: nothing is
  uploaded.

Only transient errors are retried (:func:`is_transient`): 5xx, throttling,
timeouts, connection errors, cut bodies. Not found, access denied and other
4xx answers are raised at once; access denied becomes a ``PermissionError``
naming the object and the credentials to check. When retries run out,
:class:`~iceberg_cdc.errors.TransientStorageError` names the object, the
operation and the attempts, and says that retrying the run is safe
(:func:`call_with_retries`, timed by a :class:`~iceberg_cdc.retry.RetryPolicy`).
"""

from __future__ import annotations

import logging
import re
import tempfile
import threading
import time
from collections.abc import Callable
from io import SEEK_CUR, SEEK_END, SEEK_SET
from types import TracebackType
from typing import IO, Any, TypeVar

import pyarrow as pa

from iceberg_cdc.errors import IncompleteBodyError, TransientStorageError
from iceberg_cdc.retry import RetryPolicy
from iceberg_cdc.units import MiB

log = logging.getLogger("iceberg_cdc.storage")

T = TypeVar("T")

READ_CHUNK_BYTES = 8 * MiB  # one ranged GET at most: a cut body costs at most this much again

# pyarrow renders AWS errors as "AWS Error <NAME> (HTTP status <n>) during <Op> operation: <message>".
_PERMANENT = re.compile(
    r"HTTP status 4(?!08|29)\d\d|ACCESS_DENIED|INVALID_ACCESS_KEY_ID|SIGNATURE_DOES_NOT_MATCH|"
    r"NO_SUCH_BUCKET|NO_SUCH_KEY|RESOURCE_NOT_FOUND|MISSING_AUTHENTICATION_TOKEN|\[code 15\]|"
    r"InvalidAccessKeyId|SignatureDoesNotMatch|AccessDenied",
)
_DENIED = re.compile(
    r"HTTP status 403|ACCESS_DENIED|INVALID_ACCESS_KEY_ID|SIGNATURE_DOES_NOT_MATCH|\[code 15\]|"
    r"InvalidAccessKeyId|SignatureDoesNotMatch|AccessDenied"
)
_TRANSIENT = re.compile(
    r"HTTP status (5\d\d|408|429)|INTERNAL_FAILURE|NETWORK_CONNECTION|SLOW_DOWN|SERVICE_UNAVAILABLE|"
    r"THROTTLING|REQUEST_TIMEOUT|REQUEST_TIME_TOO_SKEWED|curlCode|Failed to flush response stream|"
    r"connection (was )?(reset|closed|aborted|refused)|broken pipe|timed? ?out|Empty reply|"
    r"incomplete (read|body)|IncompleteRead|unexpected end|premature end|InternalError|SlowDown",
    re.IGNORECASE,
)


def is_transient(error: BaseException) -> bool:
    """True for errors a retry may cure: 5xx, throttling, timeouts, dropped or cut connections.

    Never for not found, access denied or another 4xx: retrying those only
    delays the real message.
    """
    if isinstance(error, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    if isinstance(error, (ConnectionError, TimeoutError, IncompleteBodyError)):
        return True
    if not isinstance(error, OSError):
        return False
    text = str(error)
    return not _PERMANENT.search(text) and bool(_TRANSIENT.search(text))


def _short(error: BaseException, limit: int = 300) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"


def call_with_retries(
    policy: RetryPolicy,
    action: Callable[[], T],
    *,
    operation: str,
    location: str,
    retry_safe: bool = True,
    after_failure: Callable[[BaseException], None] | None = None,
) -> T:
    """``action()``, repeated on transient errors as ``policy`` says; permanent errors are raised as they come.

    ``after_failure(error)`` runs after every failed attempt (e.g. to drop
    a broken stream). Access denied is raised as a ``PermissionError``
    naming ``location``; exhausted retries as :class:`TransientStorageError`.
    """
    started = time.monotonic()
    for attempt in range(1, policy.attempts + 1):
        try:
            return action()
        except Exception as error:
            if after_failure is not None:
                after_failure(error)
            if not is_transient(error):
                raise _permanent(error, operation, location) from error
            if attempt == policy.attempts:
                raise _exhausted(error, operation, location, attempt, started, retry_safe) from error
            log.info("%s %s: attempt %d failed (%s); retrying", operation, location, attempt, _short(error))
            policy.sleep(attempt - 1)
    raise AssertionError("unreachable")


def _permanent(error: Exception, operation: str, location: str) -> Exception:
    """The error to raise for a permanent failure: the same kind, naming the object's full URI."""
    if isinstance(error, FileNotFoundError) and location not in str(error):
        return FileNotFoundError(f"{operation} {location}: the object does not exist ({_short(error)})")
    if isinstance(error, OSError) and not isinstance(error, PermissionError) and _DENIED.search(str(error)):
        return PermissionError(
            f"{operation} {location}: access denied ({_short(error)}). Check the S3 credentials "
            "(s3.access-key-id / s3.secret-access-key of the catalog in the config, its Airflow "
            "connection, or the environment) and that they may read and write this location."
        )
    return error


def _exhausted(
    error: Exception, operation: str, location: str, attempts: int, started: float, retry_safe: bool
) -> TransientStorageError:
    if retry_safe:
        safety = (
            "Retrying the DAG run is safe: nothing was committed to the sink and its watermark did not move."
        )
    else:
        safety = "The request may have been applied: check the object before retrying the DAG run."
    return TransientStorageError(
        f"{operation} {location} still failed after {attempts} attempts over "
        f"{time.monotonic() - started:.1f} s of transient S3 errors (last: {_short(error)}). "
        f"Check the S3 endpoint's health and the network. {safety}",
        retry_safe=retry_safe,
        location=location,
        operation=operation,
        attempts=attempts,
    )


class ResumableInputStream:
    """A seekable, read-only stream over an object that resumes at the same position after a failure.

    Every read is a positional read of at most :data:`READ_CHUNK_BYTES`
    (``read_at``: stateless, one ranged GET on S3), retried on transient
    errors after reopening the object; the position moves only by the bytes
    delivered, so nothing is duplicated or lost. A file-like object, so
    pyarrow (``ParquetFile``, dataset fragments), Avro and JSON readers accept it.
    """

    mode = "rb"

    def __init__(self, opener: Callable[[], pa.NativeFile], location: str, policy: RetryPolicy) -> None:
        self._opener = opener
        self.location = location
        self._policy = policy
        self._lock = threading.RLock()
        self._inner: pa.NativeFile | None = None
        self._position = 0
        self._closed = False
        self.reopens = 0
        self._size = call_with_retries(policy, self._size_of_open, operation="open", location=location)

    def _open(self) -> pa.NativeFile:
        if self._inner is None:
            self._inner = self._opener()
            self.reopens += 1
        return self._inner

    def _size_of_open(self) -> int:
        try:
            return self._open().size()
        except Exception:
            self._drop()
            raise

    def _drop(self, _error: BaseException | None = None) -> None:
        """Forget a (possibly broken) inner stream; the next attempt reopens the object."""
        inner, self._inner = self._inner, None
        if inner is not None:
            try:
                inner.close()
            except Exception as error:  # a broken stream may fail to close; it is gone either way
                log.debug("closing %s after a failure: %s", self.location, _short(error))

    def _read_at(self, nbytes: int, offset: int) -> bytes:
        def attempt() -> bytes:
            inner = self._open()
            if inner.size() != self._size:
                raise OSError(
                    f"{self.location} changed size while being read ({self._size} -> {inner.size()})"
                )
            data = inner.read_at(nbytes, offset)
            if len(data) != nbytes:
                raise IncompleteBodyError(
                    f"read of {nbytes} bytes at {offset} of {self.location} returned {len(data)}"
                )
            return data

        return call_with_retries(
            self._policy, attempt, operation="read", location=self.location, after_failure=self._drop
        )

    # -- file-like interface ------------------------------------------------------------------

    def read(self, size: int | None = -1) -> bytes:
        with self._lock:
            self._check_open()
            remaining = self._size - self._position
            wanted = remaining if size is None or size < 0 else min(size, remaining)
            if wanted <= 0:
                return b""
            parts = []
            while wanted > 0:
                chunk = self._read_at(min(wanted, READ_CHUNK_BYTES), self._position)
                parts.append(chunk)
                self._position += len(chunk)
                wanted -= len(chunk)
            return parts[0] if len(parts) == 1 else b"".join(parts)

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = SEEK_SET) -> int:
        with self._lock:
            self._check_open()
            base = {SEEK_SET: 0, SEEK_CUR: self._position, SEEK_END: self._size}.get(whence)
            if base is None:
                raise ValueError(f"invalid whence {whence}")
            if base + offset < 0:
                raise ValueError(f"cannot seek to {base + offset} in {self.location}")
            self._position = base + offset
            return self._position

    def tell(self) -> int:
        return self._position

    def size(self) -> int:
        return self._size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._drop()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"I/O operation on closed stream of {self.location}")

    def __enter__(self) -> ResumableInputStream:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class RetryingUploadStream:
    """A write-only stream that spools its bytes and uploads them, retried whole, on :meth:`close`.

    ``upload(spool)`` must write the spool's bytes (from offset 0) as the
    complete object. ``tell`` keeps answering after close (callers ask for the
    size then). Leaving a ``with`` block by an exception discards the bytes.
    """

    mode = "wb"

    def __init__(
        self, upload: Callable[[IO[bytes]], None], location: str, policy: RetryPolicy, spool_bytes: int
    ) -> None:
        self._upload = upload
        self.location = location
        self._policy = policy
        self._spool: IO[bytes] | None = tempfile.SpooledTemporaryFile(  # noqa: SIM115
            max_size=spool_bytes, prefix="cdc-upload-"
        )
        self._size = 0
        self._closed = False
        self.uploads = 0

    def write(self, data: Any) -> int:
        if self._closed or self._spool is None:
            raise ValueError(f"I/O operation on closed stream of {self.location}")
        written = self._spool.write(data)
        self._size += written
        return written

    def tell(self) -> int:
        return self._size

    def flush(self) -> None:
        """Nothing to do: the object is uploaded whole on close."""

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Upload the spooled bytes as the whole object, retrying transient failures."""
        if self._closed:
            return
        self._closed = True
        spool, self._spool = self._spool, None
        assert spool is not None
        try:
            call_with_retries(
                self._policy,
                lambda: self._send(spool),
                operation=f"upload ({self._size} bytes) to",
                location=self.location,
            )
        finally:
            spool.close()

    def _send(self, spool: IO[bytes]) -> None:
        self.uploads += 1
        spool.seek(0)
        self._upload(spool)

    def abort(self) -> None:
        """Discard everything written; nothing is uploaded."""
        self._closed = True
        spool, self._spool = self._spool, None
        if spool is not None:
            spool.close()

    def __enter__(self) -> RetryingUploadStream:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

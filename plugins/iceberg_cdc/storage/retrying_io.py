"""A pyiceberg FileIO that survives transient S3 errors: retries where the I/O happens.

Why: pyiceberg's :class:`~pyiceberg.io.pyarrow.PyArrowFileIO` reads data files,
manifests and metadata through pyarrow's S3 client, whose retry strategy
covers requests that fail before their answer arrives, but not a connection
that breaks *inside* a response body: a ranged ``GetObject`` cut mid-body
raises ``AWS Error INTERNAL_FAILURE during GetObject: Failed to flush
response stream`` and the whole DAG run fails (measured through a proxy
answering 10% of requests with 500/503 and dropping 5% of connections:
every run failed). :class:`RetryingPyArrowFileIO` fixes that at the stream:

* **Reads** (:class:`ResumableInputStream`): the stream keeps its own
  position and reads with positional reads (``read_at``: one ranged GET per
  call, at most :data:`READ_CHUNK_BYTES`). A read that fails transiently, or
  returns fewer bytes than the object holds there, is repeated at the *same*
  position after reopening the object, so Parquet, Avro and JSON readers above
  it see every byte exactly once. ``exists``, ``len`` and the open retry too.
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
* **Deletes** retry; a delete that failed transiently and then finds the
  object gone counts as done (the lost attempt deleted it).
* The underlying ``S3FileSystem`` also gets more, quicker retries of its own
  (:class:`PatientS3RetryStrategy` through pyiceberg's
  ``s3.retry-strategy-impl``, unless the properties name another), which
  absorb most 5xx answers and dropped connections before a response.

Only transient errors are retried (:func:`is_transient`): 5xx, throttling,
timeouts, connection errors, cut bodies. Not found, access denied and other
4xx answers are raised at once; access denied becomes a ``PermissionError``
naming the object and the credentials to check. When retries run out,
:class:`~iceberg_cdc.errors.TransientStorageError` names the object, the
operation and the attempts, and says that retrying the run is safe.

Local files (``file://``) go straight through: there is nothing to retry.

Wiring: ``py-io-impl = iceberg_cdc.storage.retrying_io.RetryingPyArrowFileIO``
in the catalog's properties (``pipeline.runtime.catalog_properties`` sets it
unless the config names its own); tuning properties: ``cdc.io.retry-attempts``,
``cdc.io.retry-base-delay-ms``, ``cdc.io.retry-max-delay-ms``,
``cdc.io.spool-bytes``.
"""

from __future__ import annotations

import logging
import re
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from io import SEEK_CUR, SEEK_END, SEEK_SET
from types import TracebackType
from typing import IO, Any, TypeVar

import pyarrow as pa
from pyarrow.fs import AwsDefaultS3RetryStrategy, FileSystem, LocalFileSystem
from pyiceberg.io import S3_RETRY_STRATEGY_IMPL, InputFile, OutputFile
from pyiceberg.io.pyarrow import ONE_MEGABYTE, PyArrowFile, PyArrowFileIO
from pyiceberg.typedef import EMPTY_DICT, Properties

from iceberg_cdc.errors import ConfigError, TransientStorageError
from iceberg_cdc.pyiceberg_internals.file_io import pyarrow_file_arguments
from iceberg_cdc.retry import FILE_IO, RetryPolicy

log = logging.getLogger("iceberg_cdc.storage")

T = TypeVar("T")

PATIENT_S3_RETRY_STRATEGY_IMPL = "iceberg_cdc.storage.retrying_io.PatientS3RetryStrategy"
RETRY_ATTEMPTS = "cdc.io.retry-attempts"
RETRY_BASE_DELAY_MS = "cdc.io.retry-base-delay-ms"
RETRY_MAX_DELAY_MS = "cdc.io.retry-max-delay-ms"
SPOOL_BYTES = "cdc.io.spool-bytes"

READ_CHUNK_BYTES = 8 * ONE_MEGABYTE  # one ranged GET at most: a cut body costs at most this much again
DEFAULT_SPOOL_BYTES = 32 * ONE_MEGABYTE
_UPLOAD_CHUNK = 8 * ONE_MEGABYTE

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


class PatientS3RetryStrategy(AwsDefaultS3RetryStrategy):
    """The AWS SDK's "default" retry strategy with 6 retries, instead of pyarrow's standard one with 3 attempts.

    It retries 5xx answers and connection errors inside pyarrow, before a
    failure reaches :class:`ResumableInputStream`. Why "default" rather than
    "standard": measured here, the standard strategy's backoff grows to
    seconds by the 4th attempt (about 1.5 s, then 6.5 s) and it spends a
    retry quota that a burst of errors empties; the default one waits
    25 ms x 2^n (1.6 s for all 6 retries), leaving longer waits to
    :func:`call_with_retries` (:data:`iceberg_cdc.retry.FILE_IO`), which also covers cut bodies. pyiceberg instantiates
    ``s3.retry-strategy-impl`` without arguments, hence the class.
    """

    def __init__(self, max_attempts: int = 6) -> None:
        super().__init__(max_attempts=max_attempts)


class IncompleteBodyError(OSError):
    """S3 sent fewer bytes than asked for inside the object: the body was cut."""


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


def policy_from_properties(properties: Mapping[str, str]) -> RetryPolicy:
    """The retry policy the catalog properties ``cdc.io.retry-*`` ask for (:data:`~iceberg_cdc.retry.FILE_IO` otherwise)."""
    try:
        return RetryPolicy(
            attempts=int(properties.get(RETRY_ATTEMPTS, FILE_IO.attempts)),
            base_delay=float(properties.get(RETRY_BASE_DELAY_MS, FILE_IO.base_delay * 1000)) / 1000,
            max_delay=float(properties.get(RETRY_MAX_DELAY_MS, FILE_IO.max_delay * 1000)) / 1000,
        )
    except ValueError as error:
        raise ConfigError(
            f"{RETRY_ATTEMPTS} must be a whole number >= 1 and {RETRY_BASE_DELAY_MS} / {RETRY_MAX_DELAY_MS} "
            f"numbers >= 0 ({error}); fix the catalog properties"
        ) from None


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


class RetryingPyArrowFile(PyArrowFile):
    """A :class:`PyArrowFile` whose metadata calls, reads and writes retry transient errors."""

    def __init__(
        self,
        location: str,
        path: str,
        fs: FileSystem,
        buffer_size: int = ONE_MEGABYTE,
        *,
        policy: RetryPolicy,
        spool_bytes: int = DEFAULT_SPOOL_BYTES,
    ) -> None:
        super().__init__(location=location, path=path, fs=fs, buffer_size=buffer_size)
        self._policy = policy
        self._spool_bytes = spool_bytes
        self.local = isinstance(fs, LocalFileSystem)  # nothing to retry on local files

    def _retry(self, operation: str, action: Callable[[], T]) -> T:
        if self.local:
            return action()
        return call_with_retries(self._policy, action, operation=operation, location=self.location)

    def __len__(self) -> int:
        return self._retry("size of", super().__len__)

    def exists(self) -> bool:
        return self._retry("existence check of", super().exists)

    def open(self, seekable: bool = True) -> Any:
        """A stream that resumes where it was after a transient failure (seekable either way)."""
        if self.local:
            return super().open(seekable)
        return ResumableInputStream(
            lambda: PyArrowFile.open(self, seekable=True), self.location, self._policy
        )

    def create(self, overwrite: bool = False) -> Any:
        """A stream that uploads on close, retried whole (see the module's notes)."""
        if self.local:
            return super().create(overwrite)
        if not overwrite and self.exists():
            raise FileExistsError(f"Cannot create file, already exists: {self.location}")
        return RetryingUploadStream(self._upload, self.location, self._policy, self._spool_bytes)

    def _upload(self, spool: IO[bytes]) -> None:
        stream = PyArrowFile.create(self, overwrite=True)
        try:
            while chunk := spool.read(_UPLOAD_CHUNK):
                stream.write(chunk)
        finally:
            stream.close()  # completes the upload; an error here fails the attempt

    def to_input_file(self) -> RetryingPyArrowFile:
        return self


class RetryingPyArrowFileIO(PyArrowFileIO):
    """pyiceberg's PyArrowFileIO with retries where the I/O happens; see the module docstring.

    Load it with ``py-io-impl``; picklable like its parent (Spark executors get it inside closures).
    """

    def __init__(self, properties: Properties = EMPTY_DICT) -> None:
        merged = dict(properties)
        merged.setdefault(S3_RETRY_STRATEGY_IMPL, PATIENT_S3_RETRY_STRATEGY_IMPL)
        super().__init__(properties=merged)
        self.policy = policy_from_properties(merged)
        self.spool_bytes = int(merged.get(SPOOL_BYTES, DEFAULT_SPOOL_BYTES))

    def _file(self, location: str) -> RetryingPyArrowFile:
        return RetryingPyArrowFile(
            **pyarrow_file_arguments(self, location), policy=self.policy, spool_bytes=self.spool_bytes
        )

    def new_input(self, location: str) -> RetryingPyArrowFile:
        return self._file(location)

    def new_output(self, location: str) -> RetryingPyArrowFile:
        return self._file(location)

    def delete(self, location: str | InputFile | OutputFile) -> None:
        """Delete, retrying transient errors; gone after a failed attempt counts as deleted."""
        where = location.location if isinstance(location, (InputFile, OutputFile)) else location
        if self._file(where).local:
            super().delete(where)
            return
        failed = False

        def attempt() -> None:
            nonlocal failed
            try:
                super(RetryingPyArrowFileIO, self).delete(where)
            except FileNotFoundError:
                if not failed:
                    raise
                # an earlier attempt's answer was lost, but it deleted the object
            except Exception:
                failed = True
                raise

        call_with_retries(self.policy, attempt, operation="delete", location=where)

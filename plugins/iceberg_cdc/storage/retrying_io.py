"""A pyiceberg FileIO that survives transient S3 errors: retries where the I/O happens.

Why: pyiceberg's :class:`~pyiceberg.io.pyarrow.PyArrowFileIO` reads data files,
manifests and metadata through pyarrow's S3 client, whose retry strategy
covers requests that fail before their answer arrives, but not a connection
that breaks *inside* a response body: a ranged ``GetObject`` cut mid-body
raises ``AWS Error INTERNAL_FAILURE during GetObject: Failed to flush
response stream`` and the whole DAG run fails (measured through a proxy
answering 10% of requests with 500/503 and dropping 5% of connections:
every run failed). :class:`RetryingPyArrowFileIO` fixes that at the stream
(:mod:`iceberg_cdc.storage.retrying_streams`):

* **Reads** resume at the same position after a transient failure
  (:class:`~iceberg_cdc.storage.retrying_streams.ResumableInputStream`), so
  Parquet, Avro and JSON readers see every byte exactly once; ``exists``,
  ``len`` and the open retry too.
* **Writes** are spooled and uploaded whole on close, the upload retried
  (:class:`~iceberg_cdc.storage.retrying_streams.RetryingUploadStream`).
* **Deletes** retry; a delete that failed transiently and then finds the
  object gone counts as done (the lost attempt deleted it).
* **One retry layer.** The underlying ``S3FileSystem`` makes one attempt
  per request (:class:`OneAttemptS3RetryStrategy` through pyiceberg's
  ``s3.retry-strategy-impl``, unless the properties name another), so the
  retries above are the only ones: a request that meets N transient failures
  and then succeeds reaches S3 N + 1 times, and the attempts an error
  reports are the requests made. (With pyarrow retrying too, each of the 8
  attempts was up to 7 requests: 56 per read.)

Only transient errors are retried
(:func:`~iceberg_cdc.storage.retrying_streams.is_transient`); when retries run
out, :class:`~iceberg_cdc.errors.TransientStorageError` names the object, the
operation and the attempts, and says that retrying the run is safe.

Local files (``file://``) go straight through: there is nothing to retry.

Wiring: ``py-io-impl = iceberg_cdc.storage.retrying_io.RetryingPyArrowFileIO``
in the catalog's properties (``pipeline.runtime.catalog_properties`` sets it
unless the config names its own); tuning properties: ``cdc.io.retry-attempts``,
``cdc.io.retry-base-delay-ms``, ``cdc.io.retry-max-delay-ms``,
``cdc.io.spool-bytes``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import IO, Any, TypeVar

from pyarrow.fs import AwsDefaultS3RetryStrategy, FileSystem, LocalFileSystem
from pyiceberg.io import S3_RETRY_STRATEGY_IMPL, InputFile, OutputFile
from pyiceberg.typedef import EMPTY_DICT, Properties

from iceberg_cdc.errors import ConfigError
from iceberg_cdc.pyiceberg_internals.file_io import (
    ONE_MEGABYTE,
    PyArrowFile,
    PyArrowFileIO,
    pyarrow_file_arguments,
)
from iceberg_cdc.retry import FILE_IO, RetryPolicy
from iceberg_cdc.storage.retrying_streams import ResumableInputStream, RetryingUploadStream, call_with_retries

T = TypeVar("T")

ONE_ATTEMPT_S3_RETRY_STRATEGY_IMPL = "iceberg_cdc.storage.retrying_io.OneAttemptS3RetryStrategy"
RETRY_ATTEMPTS = "cdc.io.retry-attempts"
RETRY_BASE_DELAY_MS = "cdc.io.retry-base-delay-ms"
RETRY_MAX_DELAY_MS = "cdc.io.retry-max-delay-ms"
SPOOL_BYTES = "cdc.io.spool-bytes"

DEFAULT_SPOOL_BYTES = 32 * ONE_MEGABYTE
_UPLOAD_CHUNK = 8 * ONE_MEGABYTE


class OneAttemptS3RetryStrategy(AwsDefaultS3RetryStrategy):
    """The AWS SDK's "default" retry strategy with no retries: pyarrow makes one attempt per request.

    Retrying belongs to :func:`call_with_retries` (:data:`iceberg_cdc.retry.FILE_IO`,
    or the ``cdc.io.retry-*`` properties), which also covers bodies cut
    mid-stream; a second layer inside pyarrow would multiply the attempts.
    ``max_attempts`` of pyarrow's default strategy counts *retries* (the AWS
    SDK's ``DefaultRetryStrategy(maxRetries)``), hence 0. pyiceberg
    instantiates ``s3.retry-strategy-impl`` without arguments, hence the class.
    """

    def __init__(self) -> None:
        super().__init__(max_attempts=0)


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
        merged.setdefault(S3_RETRY_STRATEGY_IMPL, ONE_ATTEMPT_S3_RETRY_STRATEGY_IMPL)
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

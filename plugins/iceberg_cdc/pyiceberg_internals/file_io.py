"""The file objects a pyiceberg ``PyArrowFileIO`` makes, for a FileIO that wraps their streams.

:class:`iceberg_cdc.storage.retrying_io.RetryingPyArrowFileIO` subclasses
``PyArrowFileIO`` (the extension point pyiceberg offers through
``py-io-impl``) and hands out its own ``PyArrowFile`` subclass, so its
``new_input`` / ``new_output`` must build that file exactly as pyiceberg's
do. :func:`pyarrow_file_arguments` is that part of pyiceberg 0.12's
``PyArrowFileIO.new_input``, relying on (pinned by tests):

* ``PyArrowFileIO.parse_location(location, properties)`` -> ``(scheme, netloc, path)``;
* ``io.fs_by_scheme(scheme, netloc)`` -> the (cached) pyarrow ``FileSystem``;
* ``PyArrowFile(location=, path=, fs=, buffer_size=)`` with ``buffer_size``
  from the ``buffer-size`` property (``BUFFER_SIZE``), one MiB by default.

And on one more: pyiceberg instantiates the class named by
``s3.retry-strategy-impl`` *without arguments* (its ``_import_retry_strategy``),
which is why :class:`~iceberg_cdc.storage.retrying_io.OneAttemptS3RetryStrategy`
sets its attempts in its constructor.

``PyArrowFile``, ``PyArrowFileIO`` and ``ONE_MEGABYTE`` are re-exported from
here, so no module outside this package imports ``pyiceberg.io.pyarrow``
(the guard in ``tests/unit/test_pyiceberg_internals.py`` checks that).
"""

from __future__ import annotations

from typing import Any

from pyiceberg.io.pyarrow import BUFFER_SIZE, ONE_MEGABYTE, PyArrowFile, PyArrowFileIO

__all__ = ["ONE_MEGABYTE", "PyArrowFile", "PyArrowFileIO", "pyarrow_file_arguments"]


def pyarrow_file_arguments(io: PyArrowFileIO, location: str) -> dict[str, Any]:
    """The keyword arguments ``io.new_input(location)`` builds its ``PyArrowFile`` with."""
    scheme, netloc, path = io.parse_location(location, io.properties)
    return {
        "location": location,
        "path": path,
        "fs": io.fs_by_scheme(scheme, netloc),
        "buffer_size": int(io.properties.get(BUFFER_SIZE, ONE_MEGABYTE)),
    }

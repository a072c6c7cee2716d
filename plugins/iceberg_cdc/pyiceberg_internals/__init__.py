"""Every use of pyiceberg's internals, behind one door.

pyiceberg's public API does not reach everything the product needs: it
cannot write delete files, format-v3 metadata or manifests whose
``equality_ids`` are typed as the spec says (the mirrors need all three), its
manifest reader drops the v3 fields, and a few reading and committing steps
need more than it promises. So a few places lean on what pyiceberg does not
promise to keep: subclassed visitors and writers, re-implemented private
methods, private attributes, record fields read by position, functions of
``pyiceberg.io.pyarrow`` that are importable but undocumented. All of them
live in this package, one module per area, and nowhere else in :mod:`iceberg_cdc`:

* :mod:`.projection` -- projecting a file's Arrow batch onto a snapshot's
  schema with pyiceberg's ``ArrowProjectionVisitor`` (subclassed so null
  lists and maps stay null);
* :mod:`.commit` -- sink commits without pyiceberg's own commit retry (a
  copy of the table whose ``commit.retry.num-retries`` is 0) and a property
  update that asserts the branch head (an ``UpdateTableMetadata`` whose
  private ``_commit`` is implemented here);
* :mod:`.manifest_reader` -- reading a manifest with the format-v3 entry
  schema (pyiceberg's ``fetch_manifest_entry`` reads v2, which drops the
  fields a deletion vector lives in) and the v3 ``data_file`` fields by position;
* :mod:`.manifests`, :mod:`.row_delta`, :mod:`.format_v3`, :mod:`.data_writer`
  -- writing what the mirrors commit: spec-typed v2/v3 manifests and manifest
  lists, a row delta (data and delete files in one snapshot), v3 metadata,
  data files;
* :mod:`.file_io` -- the file objects a ``PyArrowFileIO`` makes, for the
  retrying FileIO;
* :mod:`.datafiles` -- a ``DataFile`` with statistics from a Parquet footer,
  as pyiceberg's ``add_files`` computes them, and a format-v3 ``DataFile``
  record (``from_args``' private ``_table_format_version``);
* :mod:`.arrow_schema` -- Iceberg <-> Arrow schemas and column pruning
  (``schema_to_pyarrow``, ``pyarrow_to_schema``, ``prune_columns``).

``tests/unit/test_pyiceberg_door.py`` guards the door: outside this package,
an import from a private pyiceberg module or of a private name, any import of
``pyiceberg.io.pyarrow`` and a private keyword argument on a pyiceberg object
fail it.

Each assumption these modules make is pinned by a test in
``tests/unit/test_pyiceberg_internals.py`` or
``tests/unit/test_pyiceberg_internals_<area>.py``: a pyiceberg that changes
a signature, a field or the behaviour relied on fails those tests by name
instead of changing what the pipeline reads or commits.

**Supported pyiceberg: 0.12.x** (:data:`SUPPORTED`, ``>=0.12.0,<0.13``), the
series ``requirements.txt`` and ``constraints.txt`` pin (0.12.0). Why no
wider: pyiceberg makes no promise about any of the above between minor
releases, and one of them guards exactly-once -- if a release stopped reading
``commit.retry.num-retries`` from the table object, its own retry would
rebuild an append on a new head without the sink's marker check, and a
snapshot could be committed twice. A new minor release is supported by
running those tests against it and widening :data:`SUPPORTED` (and the pins)
together. Importing this package with another pyiceberg installed raises
:class:`~iceberg_cdc.errors.UnsupportedDependencyError` naming both versions
(:func:`check_pyiceberg_version`), before anything is read or committed.
"""

from __future__ import annotations

import re

import pyiceberg

from iceberg_cdc.errors import UnsupportedDependencyError

MIN_VERSION = (0, 12, 0)  # inclusive
MAX_VERSION = (0, 13, 0)  # exclusive
SUPPORTED = ">=0.12.0,<0.13"

_RELEASE = re.compile(r"^\s*v?(\d+)(?:\.(\d+))?(?:\.(\d+))?")


def release_of(version: str) -> tuple[int, int, int] | None:
    """``"0.12.1"`` -> ``(0, 12, 1)``; the numeric release of a version string, None if it has none.

    A pre-release or local suffix is ignored (``0.13.0rc1`` is release ``0.13.0``).
    """
    match = _RELEASE.match(version)
    if match is None:
        return None
    major, minor, patch = (int(part) if part else 0 for part in match.groups())
    return major, minor, patch


def check_pyiceberg_version(installed: str | None = None) -> None:
    """Raise :class:`~iceberg_cdc.errors.UnsupportedDependencyError` unless ``installed`` is in :data:`SUPPORTED`.

    ``installed`` defaults to the imported pyiceberg's ``__version__``.
    """
    version = pyiceberg.__version__ if installed is None else installed
    release = release_of(version)
    if release is not None and MIN_VERSION <= release < MAX_VERSION:
        return
    raise UnsupportedDependencyError(
        f"pyiceberg {version} is installed, but iceberg_cdc supports pyiceberg {SUPPORTED} only: it relies "
        "on pyiceberg internals (iceberg_cdc.pyiceberg_internals) that other releases may change, one of "
        "them guarding exactly-once commits. Install the pinned version (pip install -c constraints.txt "
        "-r requirements.txt, i.e. pyiceberg==0.12.0), or run tests/unit/test_pyiceberg_internals.py "
        f"against {version} and widen SUPPORTED with the pins if it passes."
    )


check_pyiceberg_version()

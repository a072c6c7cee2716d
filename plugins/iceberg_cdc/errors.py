"""Exceptions that name the thing that went wrong and how to fix it.

Every error raised by the engine derives from :class:`CdcError`, so callers
(Airflow tasks, Spark jobs) can tell a data or configuration problem from a
bug and report it as such.

**Final errors.** A class whose ``final`` is true names a problem no retry of
the same task can fix (bad config or history, a damaged or missing file, a lost
lease, rows that do not add up): the task fails at once instead of retrying
for minutes. It is the one classification every place uses -- the Airflow
tasks (:func:`is_final`) and the Spark operators, which only have the error's
line (:func:`iceberg_cdc.error_lines.is_final_line`).
"""

from __future__ import annotations

from typing import ClassVar


class CdcError(Exception):
    """Base class of every error the engine raises on purpose."""

    final: ClassVar[bool] = False  # True: no retry of the same task can fix it; fail at once


class StorageError(CdcError):
    """An object store request failed after retries (network, permissions, missing bucket)."""


class ObjectNotFoundError(StorageError):
    """A shuffle object that must exist does not."""


class MissingBucketError(StorageError):
    """The bucket a storage URI names does not exist: no retry creates it (create it, or fix the URI)."""

    final = True


class ShortObjectError(StorageError):
    """An object is shorter than a requested byte range (short body, or HTTP 416)."""


SHUFFLE_RETRY_HINT = (
    "Nothing was committed and the sink's watermark did not move, so retrying the DAG run (or letting "
    "the next run start) is safe: it rewrites the snapshot's map outputs."
)


class CorruptShuffleError(CdcError):
    """A shuffle object is truncated or does not decode.

    The message names the object, the partition and what was wrong; the fix is to
    rerun the snapshot from the write phase (its map outputs are rewritten). The
    error is raised before anything is committed, so every message ends by saying
    that a retry is safe and what it does (:data:`SHUFFLE_RETRY_HINT`).
    """

    final = True

    def __str__(self) -> str:
        message = super().__str__()
        return message if SHUFFLE_RETRY_HINT in message else f"{message} {SHUFFLE_RETRY_HINT}"


class AmbiguousUpdateError(CdcError):
    """Update pairing is ambiguous: one key has several DELETEs or several INSERTs left."""

    final = True


class ConfigError(CdcError):
    """A configuration value is missing or invalid."""

    final = True


class SourceHistoryError(CdcError):
    """The source table's history does not continue from the watermark.

    The snapshot after the watermark expired, the watermark's snapshot left the
    current ancestry (rollback), or the table was dropped and recreated.
    """

    final = True


class UnsupportedSnapshotError(CdcError):
    """A snapshot uses a table feature the pipeline does not handle.

    Position and equality delete files in Parquet and deletion vectors are
    handled; delete files in ORC or Avro, a data file with two live deletion
    vectors, and an equality delete on a column the schema has dropped are
    not. The message names the snapshot or file and the ways out (compact the
    table, roll the snapshot back, or restart the sink from a compacted state).
    """

    final = True


class CorruptDeleteFileError(CdcError):
    """A source table's delete file (a deletion vector's blob) does not decode.

    The message names the file, the blob's offset and what was wrong. Nothing
    is committed; the table itself is damaged (a truncated or overwritten
    object), so the fix is on the table: restore the file, or roll back the
    snapshot that added it.
    """

    final = True


class UnsupportedDependencyError(CdcError):
    """An installed library is outside the version range the pipeline is built and tested for.

    The message names the library, the installed and the supported versions,
    and how to install a supported one. Final: the same install fails every retry.
    """

    final = True


class SinkSchemaError(CdcError):
    """The sink table's schema conflicts with the source's."""

    final = True


class LeaseHeldError(CdcError):
    """Another run holds the table's lease; two runs of one table never overlap."""


class LeaseLostError(LeaseHeldError):
    """This run no longer holds the table's lease (of its epoch): another run took the table over.

    The run must stop without committing or deleting anything shared; the
    holder, or the next run, processes the snapshot.
    """

    final = True


class ConservationError(CdcError):
    """Rows do not add up between the snapshot's files, the shuffle and the staged changes.

    Raised before anything is committed; the message names the stage, the
    object or task and both counts.
    """

    final = True


class TransientStorageError(StorageError):
    """A storage request kept failing with transient errors (5xx, throttling, dropped or cut
    connections, timeouts) until its retries ran out.

    The message names the object, the operation and the attempts. ``retry_safe``
    says whether re-running the DAG run is safe: true for reads (nothing was
    written) and for writes the pipeline repeats identically or only uses once
    a commit references them; false only where an unknown outcome needs a look
    first. Defaults keep the exception picklable (Spark ships it to the driver).
    """

    def __init__(
        self,
        message: str,
        *,
        retry_safe: bool = True,
        location: str = "",
        operation: str = "",
        attempts: int = 0,
    ) -> None:
        super().__init__(message)
        self.retry_safe = retry_safe
        self.location = location
        self.operation = operation
        self.attempts = attempts


class MirrorError(CdcError):
    """Base of the errors about a mirror (a copy of the source's current rows kept by its own DAG)."""


class MirrorConfigError(MirrorError, ConfigError):
    """A mirror cannot be kept as configured: no key (whole-row mode), a key nested in a struct, ..."""


class MirrorSchemaError(MirrorError):
    """The mirror's target cannot hold the changelog's columns: an unmappable type, a conflicting column."""

    final = True


class MirrorKeyError(MirrorError):
    """The changelog does not give one row per key (a key twice in one snapshot, a null key)."""

    final = True


class MirrorHistoryError(MirrorError):
    """The changelog snapshot a mirror last applied is no longer in the changelog's history.

    The changelog table was rolled back, dropped and recreated, or its snapshots
    expired past a reprocess the mirror must compare; the fix is a rebuild.
    """

    final = True


class MirrorDriftError(MirrorError):
    """A verification found the mirror differs from its source, and the drift was not repaired.

    Final: a retry would find the same drift. ``make verify`` (or ``repair: true``) repairs it.
    """

    final = True


class MirrorStateError(MirrorError, LeaseLostError):
    """The mirror moved under this run: nothing was applied.

    Another run applied first (the watermark moved), or an Iceberg mirror got a
    commit after the one its apply was planned on, or holds files its applies
    never write (equality deletes): the delete positions found may be stale.

    A subclass of :class:`LeaseLostError`: the run stops, and the next run plans afresh.
    """


class SourceFileMissingError(CdcError):
    """A file of the source table that a snapshot needs (a data or delete file) is gone from storage.

    A retry reads the same missing object again, so the task fails at once.
    The message names the file, the table and the snapshot, and the fixes:
    restore the file, or roll the source back past the snapshot.
    """

    final = True

    @classmethod
    def for_file(
        cls, path: str, table: str, snapshot_id: int | str, detail: str = ""
    ) -> SourceFileMissingError:
        return cls(
            f"file {path} of source table {table}, needed to process snapshot {snapshot_id}, does not exist"
            f"{f' ({detail})' if detail else ''}: it was deleted or moved outside Iceberg (an orphan-file "
            "cleanup with too short an age, a lifecycle rule, a manual delete). Retrying cannot help. "
            f"Restore the file, or roll the source back past snapshot {snapshot_id} (the sink's watermark "
            "stays where it is, so nothing is lost or duplicated)."
        )


class UnitFailed(Exception):
    """Raised on the Spark Connect server's Python worker: a unit failed; the message carries the marker line.

    Not a :class:`CdcError`: it only carries the unit's own error (as a marker
    line) to the client, which raises that error again
    (:mod:`iceberg_cdc.pipeline.connect_errors`).
    """


class ConnectJobError(RuntimeError):
    """The Spark Connect job failed outside the units' code (server unreachable, worker crashed ...)."""


class IncompleteBodyError(OSError):
    """S3 sent fewer bytes than asked for inside the object: the body was cut.

    An ``OSError`` so the storage retries treat it as transient
    (:func:`iceberg_cdc.storage.retrying_streams.is_transient`).
    """


class StaleDeltaError(ValueError):
    """The table is not in the state a row delta was planned on (a file to remove is not live).

    Raised by :class:`iceberg_cdc.pyiceberg_internals.row_delta.RowDelta`; the
    Iceberg mirror plans again (:mod:`iceberg_cdc.mirror.iceberg.commit`).
    """


def is_final(error: BaseException | type[BaseException]) -> bool:
    """Whether no retry of the same task can fix ``error`` (its class's ``final`` flag)."""
    cls = error if isinstance(error, type) else type(error)
    return bool(getattr(cls, "final", False)) and issubclass(cls, CdcError)


def error_class(name: str) -> type[CdcError] | None:
    """The pipeline's error class called ``name``, if there is one."""
    found = globals().get(name)
    return found if isinstance(found, type) and issubclass(found, CdcError) else None

"""The ``mirror_join`` phase's unit: what one Spark task does for an apply to an Iceberg mirror.

A **join** unit takes a bin-pack of the mirror's data files that pruning left
(:mod:`.pruning`) and, per file:

1. reads only the key columns (projected by field id onto the mirror's
   schema, so widened key types still match) and finds the positions whose
   key is among the changed keys -- one ``is_in`` for a single key column,
   one dense-id pass for several, null equal to null;
2. drops the positions already deleted (the file's position deletes or DV),
   so a row is never deleted twice;
3. merge-on-read: writes one delete description holding the old and the new
   positions (a position delete file on v2, a DV on v3; every DV of the unit
   in one Puffin file), or, when no row of the file stays live, removes the
   file whole; copy-on-write: rewrites the file's remaining live rows as new
   data files and removes the file.

A **rows** unit writes one staged part of the upserts as data files.

Each unit checks its own rows -- rows read per file = the manifest's record
count; rows a rewrite keeps + rows deleted = the file's rows -- and leaves a
JSON record of what it wrote (full manifest descriptions,
:mod:`.datafile_json`) under the apply's ``staged/`` prefix. A retried unit
writes new files under new names and overwrites its record, so only the
last attempt's files are ever committed; cleanup deletes the rest.
"""

from __future__ import annotations

import io
import json
import threading
import time
import uuid
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.typedef import Record

from iceberg_cdc import canonical
from iceberg_cdc.changelog.merge import group_ids
from iceberg_cdc.errors import ConservationError, MirrorStateError
from iceberg_cdc.mirror.iceberg.datafile_json import data_file_to_json
from iceberg_cdc.mirror.iceberg.delete_files import FileDeletes, deletion_vector_file, position_delete_file
from iceberg_cdc.mirror.iceberg.plan import ApplyPlan, CandidateFile, Unit
from iceberg_cdc.pipeline.runtime import Runtime
from iceberg_cdc.pyiceberg_internals.arrow_schema import select_columns
from iceberg_cdc.pyiceberg_internals.data_writer import parse_metadata, write_data_files
from iceberg_cdc.source.delete_filter import DeleteLoader
from iceberg_cdc.source.deletes import DeleteFileRef
from iceberg_cdc.source.reading import partition_value_from_json, read_data_file

_cache_lock = threading.Lock()
# per process: a worker runs many units of one plan. Keyed by the object's full URI and the attempt
# that wrote it, never by the key alone: a warm worker serves many tables, stores and runs, and the
# mirror DAG's keys live at a path (``<table>/mirror-<name>/epoch-<n>/join/``) another apply reuses
# once the lease's epochs start again.
_key_cache: dict[tuple[str, str, int, int, str], pa.Table] = {}
_KEYS_CACHED = 4


def changed_keys(plan: ApplyPlan, runtime: Runtime) -> pa.Table:
    """The apply's distinct changed keys (upserted or deleted), read once per process and attempt."""
    store = runtime.store()
    key = plan.paths.keys
    ident = (store.describe(key), plan.run_id, plan.epoch, plan.changelog_snapshot_id, plan.staging_dir)
    with _cache_lock:
        cached = _key_cache.get(ident)
    if cached is not None:
        return cached
    keys = pq.read_table(io.BytesIO(store.get(key)))
    if keys.num_rows != plan.key_count:
        raise ConservationError(
            f"mirror {plan.mirror}: {store.describe(key)} holds {keys.num_rows} changed keys, the apply "
            f"plan counted {plan.key_count}; another attempt overwrote it. Nothing was committed; the "
            "next run plans again."
        )
    with _cache_lock:
        if len(_key_cache) >= _KEYS_CACHED:
            _key_cache.pop(next(iter(_key_cache)))
        _key_cache[ident] = keys
    return keys


class KeyMatcher:
    """Which rows of a batch carry one of the changed keys (null equals null, floats by bits)."""

    def __init__(self, keys: pa.Table, names: list[str]) -> None:
        self.names = names
        self._raw = keys
        self._keys: list[pa.Array] = []
        self._types: list[pa.DataType] = []
        self._count = keys.num_rows

    def _keys_as(self, batch: pa.RecordBatch) -> list[pa.Array]:
        """The keys in the batch's column types (a widened column reads as the wider type)."""
        types = [batch.schema.field(name).type for name in self.names]
        if types != self._types:
            self._keys = [
                canonical.comparable(self._raw.column(name).cast(typ))
                for name, typ in zip(self.names, types, strict=True)
            ]
            self._types = types
        return self._keys

    def matches(self, batch: pa.RecordBatch) -> np.ndarray:
        if not self._count:
            return np.zeros(batch.num_rows, dtype=bool)
        keys = self._keys_as(batch)
        columns = [canonical.comparable(batch.column(name)) for name in self.names]
        if len(columns) == 1:
            found = pc.is_in(columns[0], value_set=keys[0], skip_nulls=False)
            return found.to_numpy(zero_copy_only=False).astype(bool, copy=False)
        gids, _ = group_ids([pa.concat_arrays([k, c]) for k, c in zip(keys, columns, strict=True)])
        return np.isin(gids[self._count :], gids[: self._count])


def _matched_positions(
    plan: ApplyPlan, runtime: Runtime, schema: Schema, file: CandidateFile, matcher: KeyMatcher
) -> np.ndarray:
    key_ids = {schema.find_field(name).field_id for name in matcher.names}
    key_schema = select_columns(schema, key_ids)
    found, offset = [], 0
    for batch in read_data_file(runtime.file_io(plan.location), file.path, key_schema):
        hits = np.flatnonzero(matcher.matches(batch))
        if len(hits):
            found.append(hits + offset)
        offset += batch.num_rows
    if offset != file.record_count:
        raise ConservationError(
            f"mirror {plan.mirror}: data file {file.path} has {offset} rows, its manifest entry says "
            f"{file.record_count}; the file was replaced or damaged. Nothing was committed."
        )
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


def _partition(metadata: TableMetadata, file: CandidateFile) -> Record:
    spec = metadata.specs()[file.spec_id]
    fields = spec.partition_type(metadata.schema()).fields
    return Record(
        *[partition_value_from_json(f.field_type, v) for f, v in zip(fields, file.partition, strict=True)]
    )


def _kept_rows(
    runtime: Runtime, plan: ApplyPlan, schema: Schema, file: CandidateFile, gone: np.ndarray
) -> pa.Table:
    """The file's rows not at ``gone`` (sorted positions), in the mirror's current schema."""
    parts, offset = [], 0
    for batch in read_data_file(runtime.file_io(plan.location), file.path, schema):
        positions = np.arange(offset, offset + batch.num_rows)
        keep = ~np.isin(positions, gone, assume_unique=True)
        parts.append(batch.filter(pa.array(keep)))
        offset += batch.num_rows
    arrow = schema.as_arrow()
    return pa.Table.from_batches(parts).cast(arrow) if parts else arrow.empty_table()


def _staged_name(plan: ApplyPlan, unit: Unit, suffix: str) -> str:
    """A name no write ever used: the attempt's directory, the unit and a random part per task attempt."""
    return f"{plan.staging_dir.rstrip('/')}/{unit.unit_id}-{uuid.uuid4().hex[:12]}-{suffix}"


def _join(plan: ApplyPlan, runtime: Runtime, unit: Unit, metadata: TableMetadata) -> dict[str, Any]:
    schema = metadata.schema()
    matcher = KeyMatcher(changed_keys(plan, runtime), list(plan.key_columns))
    refs = {key: DeleteFileRef.from_dict(ref) for key, ref in plan.delete_files.items()}
    file_io = runtime.file_io(plan.location)
    loader = DeleteLoader(file_io, schema, refs)
    outcomes, added, removed, vectors = [], [], [], []
    for file in unit.files:
        equality = [key for key in file.deletes if refs[key].kind == "equality"]
        if equality:
            raise MirrorStateError(
                f"mirror {plan.mirror}: data file {file.path} has equality deletes ({equality[0]}); the mirror "
                "only ever writes position deletes, so another writer changed it. Compact the mirror "
                "(rewrite_data_files) or drop it so the next run rebuilds it."
            )
        old = loader.positions(list(file.deletes), file.path)
        matched = _matched_positions(plan, runtime, schema, file, matcher)
        new = np.setdiff1d(matched, old, assume_unique=False)
        outcome: dict[str, Any] = {
            "path": file.path,
            "rows_scanned": file.record_count,
            "old_deleted": len(old),
            "new_deleted": len(new),
            "action": "none",
        }
        outcomes.append(outcome)
        if not len(new):
            continue
        every = np.union1d(old, new)
        if len(every) == file.record_count:
            outcome["action"] = "drop"
            removed.append(file.path)
        elif plan.mode == "copy-on-write":
            kept = _kept_rows(runtime, plan, schema, file, every)
            if kept.num_rows + len(every) != file.record_count:
                raise ConservationError(
                    f"mirror {plan.mirror}: rewriting {file.path} kept {kept.num_rows} rows and deletes "
                    f"{len(every)}, but the file has {file.record_count}"
                )
            written = write_data_files(file_io, metadata, kept, plan.staging_dir)
            outcome.update(action="rewrite", kept_rows=kept.num_rows)
            added.extend(data_file_to_json(f) for f in written)
            removed.append(file.path)
        else:
            deletes = FileDeletes(file.path, every, file.spec_id, _partition(metadata, file))
            outcome["action"] = "deletes"
            if plan.format_version >= 3:
                vectors.append(deletes)
            else:
                delete_file = position_delete_file(
                    file_io, _staged_name(plan, unit, "deletes.parquet"), deletes
                )
                added.append(data_file_to_json(delete_file))
    if vectors:
        puffin = _staged_name(plan, unit, "dv.puffin")
        added.extend(data_file_to_json(f) for f in deletion_vector_file(file_io, puffin, vectors))
    return {"files": outcomes, "added": added, "removed_data_files": removed}


def _aligned(rows: pa.Table, schema: Schema) -> pa.Table:
    """Upsert rows in the mirror's columns: a column the source no longer has is null."""
    arrow = schema.as_arrow()
    columns = []
    for target in arrow:
        if target.name in rows.column_names:
            columns.append(rows.column(target.name).cast(target.type))
        else:
            columns.append(pa.nulls(rows.num_rows, target.type))
    return pa.Table.from_arrays(columns, schema=arrow)


def _rows(plan: ApplyPlan, runtime: Runtime, unit: Unit, metadata: TableMetadata) -> dict[str, Any]:
    assert unit.part is not None
    rows = pq.read_table(io.BytesIO(runtime.store().get(unit.part["key"])))
    if rows.num_rows != int(unit.part["rows"]):
        raise ConservationError(
            f"mirror {plan.mirror}: staged upserts {unit.part['key']} hold {rows.num_rows} rows, the net "
            f"changes recorded {unit.part['rows']}"
        )
    written = write_data_files(
        runtime.file_io(plan.location), metadata, _aligned(rows, metadata.schema()), plan.staging_dir
    )
    return {
        "files": [],
        "added": [data_file_to_json(f) for f in written],
        "removed_data_files": [],
        "rows_written": sum(int(f.record_count) for f in written),
    }


def run_mirror_join_task(plan: ApplyPlan, runtime: Runtime, unit_id: str) -> dict[str, Any]:
    """One unit of the ``mirror_join`` phase; leaves its record under ``staged/`` and returns its figures."""
    started = time.perf_counter()
    unit = plan.unit(unit_id)
    metadata = parse_metadata(plan.metadata_json)
    result = (
        _join(plan, runtime, unit, metadata) if unit.kind == "join" else _rows(plan, runtime, unit, metadata)
    )
    figures = {
        "unit_id": unit_id,
        "kind": unit.kind,
        "files_scanned": len(unit.files),
        "rows_scanned": sum(f["rows_scanned"] for f in result["files"]),
        "rows_deleted": sum(f["new_deleted"] for f in result["files"]),
        "rows_written": int(result.get("rows_written", 0))
        + sum(int(f.get("kept_rows", 0)) for f in result["files"]),
        "files_written": len(result["added"]),
        "bytes_written": _distinct_bytes(result["added"]),
        "seconds": round(time.perf_counter() - started, 3),
    }
    record = {"unit_id": unit_id, "epoch": plan.epoch, "kind": unit.kind, **result, "stats": figures}
    runtime.store().put(plan.paths.staged(unit_id), json.dumps(record).encode())
    return figures


def _distinct_bytes(added: Iterable[dict[str, Any]]) -> int:
    """Bytes of the files a unit wrote (a Puffin file holding many DVs counts once)."""
    return sum({f["file_path"]: int(f["file_size_in_bytes"]) for f in added}.values())

"""Net changes per key: what a mirror must do to go from its watermark to a later changelog state.

A run of a mirror DAG applies every changelog snapshot after the mirror's
watermark at once. Per key only the last version matters:

* the rows are ordered by ``_change_ordinal`` (one value per source snapshot,
  increasing along the source's history) and, within one ordinal, before-images
  (``DELETE``, ``UPDATE_BEFORE``) before after-images (``INSERT``,
  ``UPDATE_AFTER``);
* a key whose last row is an after-image is an **upsert** of that row;
* a key whose last change has no after-image (a ``DELETE``, or an
  ``UPDATE_BEFORE`` alone) is a **delete**.

A key with two after-images (or two before-images) in one changelog snapshot
cannot be mirrored as one row: the source held the key twice
(``duplicate_keys: emit_unpaired``). That is a :class:`MirrorKeyError` naming
the key and the snapshot, never a silent pick.

Everything is vectorized: dense key ids from Arrow's hash kernel
(:func:`iceberg_cdc.changelog.merge.group_ids`: null equals null, floats by
their bits, as the changelog compares them), one ``lexsort`` and a boundary
mask; no Python per row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from iceberg_cdc.changelog.merge import group_ids
from iceberg_cdc.errors import MirrorKeyError
from iceberg_cdc.sink.schema import CHANGE_COLUMNS, CHANGE_ORDINAL, CHANGE_TYPE, COMMIT_SNAPSHOT_ID

AFTER_IMAGES = ("INSERT", "UPDATE_AFTER")
BEFORE_IMAGES = ("DELETE", "UPDATE_BEFORE")


@dataclass(frozen=True)
class ChangelogMark:
    """How far a mirror has applied the changelog.

    ``changelog_snapshot_id`` is the changelog (sink) table's snapshot the
    mirror's contents were computed from; ``source_snapshot_id`` and
    ``ordinal`` are the changelog's watermark in that same metadata: the
    source snapshot whose state the mirror holds. Snapshot ids are 63-bit:
    :meth:`to_dict` writes them as strings of digits for JSON readers.
    """

    changelog_snapshot_id: int
    source_snapshot_id: int
    ordinal: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "changelog_snapshot_id": str(self.changelog_snapshot_id),
            "source_snapshot_id": str(self.source_snapshot_id),
            "ordinal": self.ordinal,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> ChangelogMark | None:
        if data is None:
            return None
        return cls(int(data["changelog_snapshot_id"]), int(data["source_snapshot_id"]), int(data["ordinal"]))


@dataclass(frozen=True)
class NetChanges:
    """What one run applies to a mirror.

    ``upserts``: mirror columns, one row per key, the key's last version.
    ``deletes``: key columns only, keys to remove. No key is in both.
    ``through``: the changelog state the mirror holds once they are applied.
    """

    upserts: pa.Table
    deletes: pa.Table
    key_columns: tuple[str, ...]
    through: ChangelogMark

    @property
    def rows(self) -> int:
        return self.upserts.num_rows + self.deletes.num_rows


def _describe(changes: pa.Table, key_columns: Sequence[str], row: int) -> str:
    return ", ".join(f"{k}={changes.column(k)[row].as_py()!r}" for k in key_columns)


def _check_one_image_per_snapshot(
    changes: pa.Table, key_columns: Sequence[str], gid: np.ndarray, ordinal: np.ndarray, after: np.ndarray
) -> None:
    """Raise naming the first key that has two before- or two after-images in one changelog snapshot."""
    if len(gid) < 2:
        return
    order = np.lexsort((after, ordinal, gid))
    same = (
        (gid[order][1:] == gid[order][:-1])
        & (ordinal[order][1:] == ordinal[order][:-1])
        & (after[order][1:] == after[order][:-1])
    )
    if not same.any():
        return
    row = int(order[int(np.argmax(same))])
    snapshot = (
        changes.column(COMMIT_SNAPSHOT_ID)[row].as_py() if COMMIT_SNAPSHOT_ID in changes.column_names else "?"
    )
    kind = "after-images (INSERT/UPDATE_AFTER)" if after[row] else "before-images (DELETE/UPDATE_BEFORE)"
    raise MirrorKeyError(
        f"key {_describe(changes, key_columns, row)} has two {kind} in changelog snapshot of source snapshot "
        f"{snapshot} (ordinal {int(ordinal[row])}): the source held that key twice (duplicate_keys: "
        "emit_unpaired), and a mirror holds one row per key. Make the key unique in the source and rebuild the "
        "mirror, or choose identifier_columns that are unique."
    )


def net_changes(changes: pa.Table, key_columns: Sequence[str]) -> tuple[pa.Table, pa.Table]:
    """``(upserts, deletes)`` of changelog rows: the last version per key, or the keys to remove.

    ``changes`` holds changelog rows (data columns plus ``_change_type`` and
    ``_change_ordinal``; ``_commit_snapshot_id`` is used in messages when
    present). ``upserts`` has the data columns (change columns dropped),
    ``deletes`` only ``key_columns``. Raises :class:`MirrorKeyError` when a
    key has two images of one kind in one changelog snapshot.
    """
    keys = list(key_columns)
    missing = [k for k in (*keys, CHANGE_TYPE, CHANGE_ORDINAL) if k not in changes.column_names]
    if missing:
        raise ValueError(f"changelog rows lack column(s) {missing}")
    data_columns = [n for n in changes.column_names if n not in CHANGE_COLUMNS]
    if changes.num_rows == 0:
        return changes.select(data_columns), changes.select(keys)
    changes = changes.combine_chunks()
    gid, _ = group_ids([changes.column(k) for k in keys])
    ordinal = changes.column(CHANGE_ORDINAL).to_numpy().astype(np.int64)
    kind = changes.column(CHANGE_TYPE)
    after = pc.is_in(kind, value_set=pa.array(AFTER_IMAGES, kind.type)).to_numpy(zero_copy_only=False)
    known = pc.is_in(kind, value_set=pa.array(AFTER_IMAGES + BEFORE_IMAGES, kind.type))
    if not pc.all(pc.fill_null(known, False)).as_py():
        bad = pc.unique(pc.filter(kind, pc.invert(pc.fill_null(known, False)))).to_pylist()
        raise ValueError(f"unknown {CHANGE_TYPE} value(s) {bad[:5]!r} in the changelog")
    _check_one_image_per_snapshot(changes, keys, gid, ordinal, after)
    # Last row per key: sort by key, then ordinal, then before < after; take each key's final row.
    order = np.lexsort((after, ordinal, gid))
    sorted_gid = gid[order]
    last = order[np.append(sorted_gid[1:] != sorted_gid[:-1], True)]
    last_after = after[last]
    upsert_rows = pa.array(np.sort(last[last_after]))
    delete_rows = pa.array(np.sort(last[~last_after]))
    return changes.select(data_columns).take(upsert_rows), changes.select(keys).take(delete_rows)

"""Which keys differ, from the rows of the buckets whose digests differ.

Each side's rows of those buckets are grouped by canonical key (count, row
hash); a key is equal when each side holds it exactly once with the same row
hash. Otherwise it is **changed** (both sides hold it, with other values, or
more than once), **missing** (only the source holds it) or **foreign** (only
the mirror holds it). Vectorized: one Arrow group-by and one join per side.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from iceberg_cdc.mirror.verify.sides import Hashed


@dataclass
class Collected:
    """One side's rows of the differing buckets: canonical keys, row hashes and the kept columns."""

    key_arrays: list[list[pa.Array]] = field(default_factory=list)
    hashes: list[np.ndarray] = field(default_factory=list)
    rows: list[pa.RecordBatch] = field(default_factory=list)

    def add(self, hashed: Hashed, buckets: np.ndarray, keep: Sequence[str]) -> None:
        mask = np.isin(hashed.buckets, buckets)
        if not mask.any():
            return
        selector = pa.array(mask)
        self.key_arrays.append([k.filter(selector) for k in hashed.keys])
        self.hashes.append(hashed.row_hashes[mask])
        self.rows.append(hashed.batch.select(list(keep)).filter(selector))

    def table(self, key_count: int) -> pa.Table:
        """``k0..kN`` canonical keys, ``h`` the row hash (as int64 bits), ``i`` the row's index here."""
        keys = [
            pa.concat_arrays([part[n] for part in self.key_arrays])
            if self.key_arrays
            else pa.array([], pa.int64())
            for n in range(key_count)
        ]
        hashes = np.concatenate(self.hashes) if self.hashes else np.zeros(0, dtype=np.uint64)
        return pa.table(
            {
                **{f"k{n}": keys[n] for n in range(key_count)},
                "h": pa.array(hashes.view(np.int64)),
                "i": pa.array(np.arange(len(hashes), dtype=np.int64)),
            }
        )

    def kept(self, schema: pa.Schema | None = None) -> pa.Table:
        if not self.rows:
            return schema.empty_table() if schema is not None else pa.table({})
        return pa.Table.from_batches(self.rows)


@dataclass(frozen=True)
class Drift:
    """Drifted keys, as row indices into each side's :meth:`Collected.kept` rows."""

    changed_source: np.ndarray  # the source's rows of changed keys
    changed_mirror: np.ndarray  # one mirror row of each changed key
    missing: np.ndarray  # source rows whose key the mirror lacks
    foreign: np.ndarray  # mirror rows whose key the source lacks

    @property
    def keys(self) -> int:
        return len(self.changed_source) + len(self.missing) + len(self.foreign)

    @property
    def counts(self) -> dict[str, int]:
        return {
            "changed": len(self.changed_source),
            "missing": len(self.missing),
            "foreign": len(self.foreign),
        }


def _grouped(table: pa.Table, key_names: list[str], prefix: str) -> pa.Table:
    grouped = table.group_by(key_names, use_threads=False).aggregate(
        [("h", "count"), ("h", "min"), ("h", "max"), ("i", "min")]
    )
    return grouped.rename_columns(
        [n if n in key_names else f"{prefix}{n.replace('_', '')}" for n in grouped.column_names]
    )


def find_drift(source: pa.Table, mirror: pa.Table, key_count: int) -> Drift:
    """Compare per key (see the module doc); ``source`` and ``mirror`` are :meth:`Collected.table`."""
    key_names = [f"k{n}" for n in range(key_count)]
    left = _grouped(source, key_names, "s")
    right = _grouped(mirror, key_names, "m")
    joined = left.join(right, keys=key_names, join_type="full outer", use_threads=False)
    s_count = pc.fill_null(joined["shcount"], 0)
    m_count = pc.fill_null(joined["mhcount"], 0)
    in_source = pc.greater(s_count, 0)
    in_mirror = pc.greater(m_count, 0)
    same = pc.and_kleene(
        pc.and_(pc.equal(s_count, 1), pc.equal(m_count, 1)),
        pc.equal(joined["shmin"], joined["mhmin"]),
    )
    same = pc.fill_null(same, False)
    changed = pc.and_(pc.and_(in_source, in_mirror), pc.invert(same))
    missing = pc.and_(in_source, pc.invert(in_mirror))
    foreign = pc.and_(in_mirror, pc.invert(in_source))

    def rows(mask: pa.ChunkedArray, column: str) -> np.ndarray:
        picked = joined[column].filter(mask)
        return np.sort(picked.to_numpy().astype(np.int64)) if len(picked) else np.zeros(0, dtype=np.int64)

    return Drift(
        changed_source=rows(changed, "simin"),
        changed_mirror=rows(changed, "mimin"),
        missing=rows(missing, "simin"),
        foreign=rows(foreign, "mimin"),
    )


def describe_keys(rows: pa.Table, key: Sequence[str], indices: Iterable[int], limit: int) -> list[str]:
    """``id=5`` / ``(region='eu', id=5)`` for up to ``limit`` of the rows at ``indices``."""
    picked = rows.select(list(key)).take(pa.array(list(indices)[:limit], pa.int64())).to_pylist()
    if len(key) == 1:
        return [f"{key[0]}={row[key[0]]!r}" for row in picked]
    return ["(" + ", ".join(f"{k}={row[k]!r}" for k in key) + ")" for row in picked]

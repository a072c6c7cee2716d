"""The state a changelog describes, from its own rows: the base of a bridge whose snapshot is gone.

A bridge over a gap in the source's history diffs the state the changelog
already describes against the oldest state still available. That base is
normally the watermark's snapshot, held on the source by the base tag
(``protect_base``). A sink configured before that tag existed may find even
that snapshot expired; its rows then come from the changelog itself: every
after-image (``INSERT``, ``UPDATE_AFTER``) counts +1 for its whole row, every
before-image (``DELETE``, ``UPDATE_BEFORE``) -1, and a row whose sum is ``n``
is in the state ``n`` times. That is the replay invariant read backwards, so
it needs no identifier columns and holds for any ``duplicate_keys`` mode.

Cost: one scan of the changelog's data columns (every row it ever held),
grouped by whole row in memory -- the reason ``bridge_max_rows`` counts it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from iceberg_cdc.changelog.merge import group_ids
from iceberg_cdc.errors import SourceHistoryError
from iceberg_cdc.sink.columns import CHANGE_TYPE

AFTER_IMAGES = ("INSERT", "UPDATE_AFTER")


def changelog_rows(changelog: Table) -> int:
    """How many rows the changelog holds now (its current snapshot's ``total-records``; 0 when empty)."""
    snapshot = changelog.current_snapshot()
    if snapshot is None or snapshot.summary is None:
        return 0
    return int(snapshot.summary.get("total-records") or 0)


def replayed_state(changelog: Table, schema: Schema, names: Mapping[int, str] | None = None) -> pa.Table:
    """The rows the changelog describes, in ``schema`` (the source's), with its field ids.

    ``names``: source field id -> the changelog column holding it (the source's
    current names, which the changelog follows); a field not named there is
    looked up by its own name, and a field the changelog lacks comes back null.
    A row removed more often than it was added means the changelog does not
    start from an empty table or lost rows: that is an error, never a guess.
    """
    names = dict(names or {})
    present = set(changelog.schema().column_names)
    columns = {f.field_id: names.get(f.field_id, f.name) for f in schema.fields}
    read = [c for c in columns.values() if c in present]
    rows = changelog.scan(selected_fields=(*read, CHANGE_TYPE)).to_arrow()
    target = schema.as_arrow()  # the source's field ids travel in the fields' metadata
    arrays = []
    for field, arrow_field in zip(schema.fields, target, strict=True):
        column = columns[field.field_id]
        if column in present:
            arrays.append(rows.column(column).cast(arrow_field.type))
        else:
            arrays.append(pa.nulls(rows.num_rows, arrow_field.type))
    data = pa.Table.from_arrays(arrays, schema=target)
    after = pc.is_in(rows.column(CHANGE_TYPE), pa.array(AFTER_IMAGES)).to_numpy(zero_copy_only=False)
    return _net_rows(data, after, ".".join(changelog.name()))


def _net_rows(data: pa.Table, after: np.ndarray, what: str) -> pa.Table:
    """Each distinct row ``added - removed`` times (``after``: True for an after-image)."""
    if data.num_rows == 0:
        return data
    gid, count = group_ids(data.columns)
    net = np.bincount(gid, weights=np.where(after, 1, -1), minlength=count).astype(np.int64)
    if (net < 0).any():
        bad = int(np.flatnonzero(net < 0)[0])
        row = data.take([int(np.flatnonzero(gid == bad)[0])]).to_pylist()[0]
        raise SourceHistoryError(
            f"the changelog {what} does not replay to a state: row {row} is removed {-int(net[bad])} "
            "more time(s) than it is added (rows deleted from the changelog, or a changelog that does "
            "not start from an empty table), so no bridge can start from its replay. Nothing was "
            "committed. Restart the sink from the source's current state: drop the sink table (or point "
            "tables[].sink at a new table) and set `start: latest`."
        )
    # One after-image row stands for each group still present, repeated ``net`` times.
    groups, first = np.unique(np.where(after, gid, -1), return_index=True)
    keep = groups >= 0
    groups, first = groups[keep], first[keep]
    times = net[groups]
    return data.take(pa.array(np.repeat(first, times), type=pa.int64()))

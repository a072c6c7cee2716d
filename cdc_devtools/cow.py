"""Copy-on-write changes to an Iceberg table, committed the way Spark's MERGE commits them.

pyiceberg's ``upsert`` / ``overwrite`` spread one change over several
snapshots. :func:`cow_merge` instead writes ONE ``overwrite`` snapshot that
removes every data file holding an affected row and adds its rewrite (the
untouched rows, now carryover, plus the new versions), with updates that
change a partition column landing in another partition's file. That is the
shape the pipeline exists for, used by the demo and the tests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import ArrowScan, _dataframe_to_data_files
from pyiceberg.table import Table


def rewrite_files(
    table: Table,
    remove: Sequence,
    add: pa.Table | None,
    *,
    producer: Callable | None = None,
) -> int | None:
    """One snapshot that removes the data files ``remove`` and adds ``add``'s rows in new files.

    This is the commit of a copy-on-write rewrite. ``producer(transaction)``
    builds the snapshot producer; the default is an ``overwrite``, as Spark's
    MERGE / UPDATE / DELETE commit. Returns the new snapshot id.
    """
    new_files = (
        list(_dataframe_to_data_files(table.metadata, add, table.io))
        if add is not None and add.num_rows
        else []
    )
    with table.transaction() as tx, producer(tx) if producer else tx.update_snapshot().overwrite() as rewrite:
        for data_file in remove:
            rewrite.delete_data_file(data_file)
        for data_file in new_files:
            rewrite.append_data_file(data_file)
    table.refresh()
    snapshot = table.current_snapshot()
    return snapshot.snapshot_id if snapshot else None


def read_task_rows(table: Table, task) -> pa.Table:
    """The rows of one scan task's data file, in the table's current schema."""
    return ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue()).to_table([task])


def cow_apply(
    table: Table,
    *,
    touched: Callable[[pa.Table], pa.Array],
    rewrite: Callable[[pa.Table], pa.Table] | None = None,
    inserts: pa.Table | None = None,
) -> int | None:
    """One copy-on-write snapshot, as an engine's row-level MERGE / UPDATE / DELETE commits it.

    ``touched(rows)`` marks the rows of a data file the statement matches.
    Every file with a touched row is removed and rewritten: its untouched rows
    are copied as they are (carryover), its touched rows are replaced by
    ``rewrite(touched rows)`` (updates; ``None`` deletes them), and ``inserts``
    join the same snapshot. Rows land in whatever partition their values say,
    so an update of a partition column moves the row to another file.
    Returns the new snapshot id, or None when nothing matched and nothing is inserted.
    """
    schema = table.schema().as_arrow()
    removed, written = [], []
    for task in table.scan().plan_files():
        rows = read_task_rows(table, task)
        hit = touched(rows)
        if pc.any(hit).as_py():
            removed.append(task.file)
            written.append(rows.filter(pc.invert(hit)))
            if rewrite is not None:
                written.append(rewrite(rows.filter(hit)).cast(schema))
    if inserts is not None and inserts.num_rows:
        written.append(inserts.cast(schema))
    if not removed and not written:
        return None
    return rewrite_files(table, removed, pa.concat_tables(written) if written else None)


def cow_merge(
    table: Table,
    *,
    upserts: pa.Table | None = None,
    delete_keys: Sequence | None = None,
    key: str = "id",
) -> int | None:
    """Apply upserts (update or insert by ``key``) and deletes as one copy-on-write snapshot.

    Returns the new snapshot id, or None when nothing changed.
    """
    schema = table.schema().as_arrow()
    upserts = upserts.cast(schema) if upserts is not None else schema.empty_table()
    affected = pa.concat_arrays(
        [upserts.column(key).combine_chunks(), pa.array(list(delete_keys or []), schema.field(key).type)]
    )
    if len(affected) == 0:
        return None
    return cow_apply(
        table, touched=lambda rows: pc.is_in(rows.column(key), value_set=affected), inserts=upserts
    )


def table_state(table: Table, snapshot_id: int) -> pa.Table:
    """The table's rows as of a snapshot (for replay checks), equality deletes and DVs applied too."""
    from cdc_devtools.mor_state import live_state, needs_reference_reader

    if needs_reference_reader(table, snapshot_id):
        return live_state(table, snapshot_id)
    return table.scan(snapshot_id=snapshot_id).to_arrow()

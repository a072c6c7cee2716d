"""A one-row merge-on-read update of a big data file: read the row groups that hold it, or the whole file.

The most common merge-on-read snapshot is small: Spark's ``UPDATE ... WHERE
id = 42`` on a format-v3 table writes a deletion vector naming one position
of one big file, plus the row's new version. The pipeline must emit the old
row's full image (UPDATE_BEFORE), so it reads the kept file; since only
position deletes name the change, it reads only the row groups that hold the
named positions (``reading.read_data_file(positions=...)``).

This measures that read against reading the whole file, in one process,
alternating, on one data file of the benchmark's shape written with
``ROW_GROUPS`` row groups (Spark writes a 512 MB file as four 128 MB row
groups); both must give the same single row.

    .venv/bin/python bench/point_update.py [--rows N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

import pyarrow as pa  # noqa: E402
import workload as wl  # noqa: E402
from pyiceberg.catalog import Catalog  # noqa: E402
from pyiceberg.table.snapshots import Operation  # noqa: E402

from cdc_devtools.format_v3 import deletion_vector_files, upgrade_to_v3  # noqa: E402
from cdc_devtools.mor import commit_row_delta  # noqa: E402
from iceberg_cdc.source.changes import snapshot_changes  # noqa: E402
from iceberg_cdc.source.delete_filter import DeleteLoader, LiveRows  # noqa: E402
from iceberg_cdc.source.reading import read_data_file  # noqa: E402

ROW_GROUPS = 8
RUNS = 3


def _time_read(table, changes, kept, selected: bool) -> tuple[float, list[int]]:
    schema = table.schemas()[changes.schema_id]
    started = time.perf_counter()
    live = LiveRows(
        DeleteLoader(table.io, schema, changes.delete_refs), kept.path, kept.deletes, kept.require
    )
    if selected:
        batches = live.filter_selected(
            read_data_file(table.io, kept.path, schema, positions=live.selected_positions())
        )
    else:
        batches = live.filter(read_data_file(table.io, kept.path, schema))
    ids = [i for batch in batches for i in batch.column("id").to_pylist()]
    return time.perf_counter() - started, ids


def run_point_update(catalog: Catalog, rows: int) -> dict[str, Any]:
    """Build the table, update one row by DV, time both reads (median of ``RUNS`` each, alternating)."""
    identifier = f"{wl.NAMESPACE}.point_update"
    if catalog.table_exists(identifier):
        catalog.drop_table(identifier)
    table = catalog.create_table(
        identifier,
        schema=wl.SCHEMA,
        properties={
            "format-version": "2",
            "write.parquet.row-group-limit": str(-(-rows // ROW_GROUPS)),
            "write.target-file-size-bytes": str(1 << 40),  # one data file
        },
    )
    table.append(wl._version(0, rows, 0))
    table = upgrade_to_v3(table)
    (task,) = list(table.scan().plan_files())
    position = rows // 2 + 7
    (dv,) = deletion_vector_files(table, {task.file.file_path: (task.file, [position])})
    snapshot_id = commit_row_delta(table, add=[dv], operation=Operation.DELETE)
    changes = snapshot_changes(table, snapshot_id)
    (kept,) = changes.deleted
    seconds: dict[str, list[float]] = {"selected": [], "whole": []}
    found = {}
    for _ in range(RUNS):
        for label in ("selected", "whole"):
            took, ids = _time_read(table, changes, kept, label == "selected")
            seconds[label].append(took)
            found[label] = ids
    expected = wl._version(0, rows, 0).column("id")[position].as_py()
    with table.io.new_input(kept.path).open() as stream:
        groups = pa.parquet.ParquetFile(stream).metadata.num_row_groups
    return {
        "rows": rows,
        "row_groups": groups,
        "file_bytes": kept.size,
        "selected_seconds": statistics.median(seconds["selected"]),
        "whole_seconds": statistics.median(seconds["whole"]),
        "equal": found["selected"] == found["whole"] == [expected],
    }


def point_update_line(result: dict[str, Any]) -> str:
    return (
        f"merge-on-read: one-row update by deletion vector of a {result['rows']:,}-row file "
        f"({result['row_groups']} row groups, {result['file_bytes'] / 2**20:.0f} MB): read "
        f"{result['selected_seconds']:.2f} s (the row group holding it), whole file "
        f"{result['whole_seconds']:.2f} s, ratio={result['selected_seconds'] / result['whole_seconds']:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=2_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cdc-point-update-") as work:
        result = run_point_update(wl.open_catalog(Path(work)), args.rows)
    print(point_update_line(result))
    if not result["equal"]:
        print("point update: CHECK FAILED: the two reads disagree")
        sys.exit(1)


if __name__ == "__main__":
    main()

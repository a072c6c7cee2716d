"""Apply net changes to an Iceberg mirror: the mirror target against pyiceberg's own ``Table.upsert``.

Workload: the benchmark's 5 M-row, 12-column table (``workload.py``'s rows,
partitioned by region, appended in 10 chunks), copied into two identical
tables. Net changes: 1% of keys updated (a fifth of them move region) and
0.1% deleted. Each side applies them to its copy:

* **mirror target**: ``steps.plan`` (changed keys, pruning, units),
  the ``mirror_join`` units in this process (the functions Spark tasks run),
  ``steps.commit`` -- one commit of new rows, position deletes (v2) and the
  watermark;
* **pyiceberg**: ``Table.upsert(rows, join_cols=["id"])`` then
  ``Table.delete(In("id", keys))`` -- what a user writes today.

Both tables must then hold the same rows (checked, sorted by key). Figures:
seconds (wall) and bytes of data and delete files written. The catch-up line
applies 30 snapshots of 0.1% updates to a mirror once folded together and
one by one.

    python bench/iceberg_mirror_bench.py            # 5 M rows, about 5 minutes
    python bench/iceberg_mirror_bench.py --rows 200000
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "plugins"))
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
from pyiceberg.expressions import In  # noqa: E402
from pyiceberg.partitioning import PartitionField, PartitionSpec  # noqa: E402
from pyiceberg.transforms import IdentityTransform  # noqa: E402
from workload import SCHEMA, _chunks, _version, catalog_properties, open_catalog  # noqa: E402

from cdc_devtools.staged_inputs import default_lease_name, stage_net_changes  # noqa: E402
from iceberg_cdc.config import parse_config  # noqa: E402
from iceberg_cdc.coordination.lease import TableLease  # noqa: E402
from iceberg_cdc.mirror.iceberg import steps  # noqa: E402
from iceberg_cdc.mirror.iceberg.inputs import Through  # noqa: E402
from iceberg_cdc.run.context import Context  # noqa: E402

RESULTS = ROOT / "bench" / "results"
SOURCE = "bench.orders_src"


class Net:
    """A NetChanges-shaped value (the mirror core's type, built here from generated rows)."""

    def __init__(self, upserts: pa.Table, deletes: pa.Table, through: Through) -> None:
        self.upserts, self.deletes, self.key_columns, self.through = upserts, deletes, ("id",), through


def log(message: str) -> None:
    print(f"[mirror-bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def _table(catalog, name: str, rows: int, appends: int):
    spec = PartitionSpec(PartitionField(3, 1000, IdentityTransform(), "region"))
    table = catalog.create_table(f"bench.{name}", schema=SCHEMA, partition_spec=spec)
    for first, n in _chunks(rows, appends):
        table.append(_version(first, n, 0))
    return table


def changes(rows: int, seed: int, update: float, delete: float) -> tuple[pa.Table, pa.Table]:
    """Upserts (new versions of ``update`` of the keys, a fifth moving region) and deleted keys."""
    rng = np.random.default_rng(seed)
    picked = rng.choice(rows, size=int(rows * (update + delete)), replace=False)
    updated, deleted = np.sort(picked[: int(rows * update)]), np.sort(picked[int(rows * update) :])
    base = _version(0, 0, 0)
    parts = []
    for first, n in _chunks(rows, 10):
        chunk = _version(first, n, 0)
        mask = np.isin(chunk.column("id").to_numpy(), updated)
        if mask.any():
            parts.append(chunk.filter(pa.array(mask)))
    upserts = pa.concat_tables(parts) if parts else base
    amount = pc.add(upserts.column("amount"), pa.scalar(1, upserts.schema.field("amount").type))
    upserts = upserts.set_column(upserts.schema.get_field_index("amount"), "amount", amount)
    status = pa.array(np.where(np.arange(upserts.num_rows) % 2 == 0, "closed", "paid"), pa.large_string())
    upserts = upserts.set_column(
        upserts.schema.get_field_index("status"), "status", status.cast(upserts.schema.field("status").type)
    )
    moved = np.arange(upserts.num_rows) % 5 == 0
    regions = np.array(upserts.column("region").to_pylist(), dtype=object)
    regions[moved] = np.where(regions[moved] == "us", "eu", "us")
    upserts = upserts.set_column(
        upserts.schema.get_field_index("region"),
        "region",
        pa.array(regions, upserts.schema.field("region").type),
    )
    deletes = pa.table({"id": pa.array(deleted, pa.int64())})
    return upserts.cast(SCHEMA.as_arrow()), deletes


def _written_bytes(table, since: int | None) -> dict[str, int]:
    """Bytes of data and delete files the snapshots after ``since`` added (their summaries)."""
    out = {"files_bytes": 0, "data_files": 0, "delete_files": 0}
    for snapshot in table.snapshots():
        if since is not None and snapshot.snapshot_id == since:
            out = {"files_bytes": 0, "data_files": 0, "delete_files": 0}
            continue
        summary = snapshot.summary
        out["files_bytes"] += int(summary.get("added-files-size") or 0)
        out["data_files"] += int(summary.get("added-data-files") or 0)
        out["delete_files"] += int(summary.get("added-delete-files") or 0)
    return out


class MirrorRunner:
    def __init__(self, work: Path, mirror: str) -> None:
        raw = {
            "catalog": catalog_properties(work),
            "shuffle": {"uri": (work / "shuffle").as_uri(), "write_task_size": "256MB"},
            "spark": {"parallel_jobs": 2},
            "tables": [{"source": SOURCE, "sink": "bench.orders_changes", "identifier_columns": ["id"]}],
        }
        self.ctx = Context.of(parse_config(raw), SOURCE)
        self.target = {"type": "iceberg", "table": mirror, "mode": "merge-on-read"}
        self.ordinal = 0

    def apply(self, net: Net) -> dict[str, Any]:
        lease = TableLease(self.ctx.runtime.store(), default_lease_name(self.target["table"]))
        run_id = f"bench-{self.ordinal}-{time.time_ns()}"
        held = lease.acquire(run_id, 600.0)
        store = self.ctx.runtime.store()
        key = stage_net_changes(store, f"_inputs/{run_id}", net, source=SOURCE)
        staged = {
            "net_changes": key,
            "run_id": run_id,
            "epoch": held.epoch,
            "lease_ttl": 600.0,
            "lease": default_lease_name(self.target["table"]),
        }
        clock = {"start": time.perf_counter()}
        planned = steps.plan(self.ctx, self.target, staged)
        clock["plan"] = time.perf_counter()
        steps.run_units_inline(self.ctx.runtime, planned)
        clock["join"] = time.perf_counter()
        committed = steps.commit(self.ctx, self.target, planned)
        clock["commit"] = time.perf_counter()
        steps.cleanup(self.ctx, self.target, planned)
        lease.release(run_id, held.epoch)
        return {
            "seconds": round(clock["commit"] - clock["start"], 2),
            "plan": round(clock["plan"] - clock["start"], 2),
            "join": round(clock["join"] - clock["plan"], 2),
            "commit": round(clock["commit"] - clock["join"], 2),
            "committed": committed,
            "candidate_files": planned.get("candidate_files"),
            "data_files": planned.get("data_files"),
        }

    def net(self, upserts: pa.Table, deletes: pa.Table) -> Net:
        self.ordinal += 1
        return Net(upserts, deletes, Through(self.ordinal, self.ordinal, self.ordinal))


def _sorted(table) -> pa.Table:
    rows = table.scan().to_arrow()
    return rows.sort_by("id").cast(SCHEMA.as_arrow())


def run(rows: int, work: Path, catch_up: int = 30) -> dict[str, Any]:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    catalog = open_catalog(work)
    log(f"building the source and two copies of {rows:,} rows")
    _table(catalog, "orders_src", 1000, 1)  # only its schema and spec are read by the mirror's plan
    ours = _table(catalog, "mirror_ours", rows, 10)
    theirs = _table(catalog, "mirror_pyiceberg", rows, 10)
    upserts, deletes = changes(rows, 1, 0.01, 0.001)
    log(f"net changes: {upserts.num_rows:,} upserts, {deletes.num_rows:,} deletes")
    runner = MirrorRunner(work, "bench.mirror_ours")
    before = ours.current_snapshot().snapshot_id
    ours_result = runner.apply(runner.net(upserts, deletes))
    ours.refresh()
    ours_bytes = _written_bytes(ours, before)
    log(f"mirror target: {ours_result['seconds']} s ({ours_bytes['files_bytes']:,} bytes)")
    before = theirs.current_snapshot().snapshot_id
    started = time.perf_counter()
    theirs.upsert(upserts, join_cols=["id"])
    theirs.delete(In("id", deletes.column("id").to_pylist()))
    theirs_seconds = round(time.perf_counter() - started, 2)
    theirs.refresh()
    theirs_bytes = _written_bytes(theirs, before)
    log(f"pyiceberg upsert + delete: {theirs_seconds} s ({theirs_bytes['files_bytes']:,} bytes)")
    equal = _sorted(ours).equals(_sorted(theirs))
    result: dict[str, Any] = {
        "rows": rows,
        "upserts": upserts.num_rows,
        "deletes": deletes.num_rows,
        "mirror": {**ours_result, **ours_bytes},
        "pyiceberg": {"seconds": theirs_seconds, **theirs_bytes},
        "speedup": round(theirs_seconds / max(ours_result["seconds"], 1e-9), 1),
        "equal": bool(equal),
    }
    if catch_up:
        result["catch_up"] = run_catch_up(catalog, work, rows, catch_up)
    return result


def run_catch_up(catalog, work: Path, rows: int, snapshots: int) -> dict[str, Any]:
    """``snapshots`` changes of 0.1% each: folded into one apply, against one apply per snapshot."""
    log(f"catch-up: {snapshots} snapshots of 0.1% updates, folded and one by one")
    batches = [changes(rows, 100 + i, 0.001, 0.0)[0] for i in range(snapshots)]
    folded = pa.concat_tables(batches)
    order = np.arange(folded.num_rows)
    last = pa.table({"id": folded.column("id"), "at": order}).group_by("id").aggregate([("at", "max")])
    folded = folded.take(last.column("at_max"))  # each key's last version
    results = {}
    for name, applies in (("one_apply", [folded]), ("one_by_one", batches)):
        _table(catalog, f"mirror_catchup_{name}", rows, 10)
        runner = MirrorRunner(work, f"bench.mirror_catchup_{name}")
        started = time.perf_counter()
        for upserts in applies:
            runner.apply(runner.net(upserts, pa.table({"id": pa.array([], pa.int64())})))
        results[name] = round(time.perf_counter() - started, 2)
    results["snapshots"] = snapshots
    results["per_snapshot_one_apply"] = round(results["one_apply"] / snapshots, 2)
    results["per_snapshot_one_by_one"] = round(results["one_by_one"] / snapshots, 2)
    return results


def iceberg_mirror_lines(result: dict[str, Any]) -> list[str]:
    m, p = result["mirror"], result["pyiceberg"]
    lines = [
        f"mirror: apply {result['upserts']:,} upserts + {result['deletes']:,} deletes to a {result['rows']:,}-row "
        f"Iceberg mirror in {m['seconds']} s ({m['files_bytes'] / 1e6:.1f} MB written), pyiceberg upsert + delete "
        f"{p['seconds']} s ({p['files_bytes'] / 1e6:.1f} MB), speedup={result['speedup']}x, equal={result['equal']}"
    ]
    if "catch_up" in result:
        c = result["catch_up"]
        lines.append(
            f"mirror catch-up: {c['snapshots']} snapshots in one apply {c['one_apply']} s "
            f"({c['per_snapshot_one_apply']} s per snapshot), one by one {c['one_by_one']} s "
            f"({c['per_snapshot_one_by_one']} s per snapshot)"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--catch-up", type=int, default=30, help="snapshots in the catch-up line (0: none)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    result = run(args.rows, ROOT / ".cdc" / "iceberg-mirror-bench", args.catch_up)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "iceberg_mirror.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    lines = iceberg_mirror_lines(result)
    (args.out / "iceberg_mirror.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""Rebuild a mirror: replace all its rows, from the changelog or from the source's state.

    iceberg-cdc rebuild --config cdc.yaml --table shop.orders --mirror public__orders
    iceberg-cdc rebuild ... --from source

(``python -m iceberg_cdc.mirror.rebuild`` is the same command.)

* ``--from changelog`` (default): the net changes of the whole changelog up to
  its current watermark -- every key's last version.
* ``--from source``: the source table's rows at the changelog's watermark
  snapshot, read with pyiceberg (a merge-on-read source with equality deletes
  cannot be read that way: rebuild from the changelog then).

Either way the mirror ends holding exactly the source's rows at the
changelog's watermark, with its own watermark there, in one transaction (the
target's ``apply`` with ``replace_all``). The rebuild holds the mirror's
lease, so no mirror run overlaps it. For when a mirror was damaged by hand,
its changelog was rolled back or recreated, or a reprocess cannot be compared
(:class:`~iceberg_cdc.errors.MirrorHistoryError` names this command).
"""

from __future__ import annotations

import argparse
import logging
import time
from typing import Any

import pyarrow as pa

from iceberg_cdc.command_exit import DONE, command_main
from iceberg_cdc.config import MirrorConfig, load_config
from iceberg_cdc.errors import CdcError, MirrorKeyError
from iceberg_cdc.mirror.changelog import Pending, changelog_mark, read_net_changes
from iceberg_cdc.mirror.columns import mirror_fields, mirror_key
from iceberg_cdc.mirror.net_changes import ChangelogMark, NetChanges
from iceberg_cdc.mirror.postgres.target import ApplyResult
from iceberg_cdc.mirror.steps import mirror_lease
from iceberg_cdc.mirror.targets import iceberg_steps, postgres_target
from iceberg_cdc.pyiceberg_internals.arrow_schema import to_arrow_type
from iceberg_cdc.run.context import Context
from iceberg_cdc.run.lease import lease_ttl_seconds
from iceberg_cdc.source.tables import load_source_table

log = logging.getLogger("iceberg_cdc")


def _from_source(source_table, through: ChangelogMark, fields, key: tuple[str, ...]) -> NetChanges:
    """The source's rows at the watermark's snapshot, in the mirror's columns (one row per key)."""
    state = source_table.scan(snapshot_id=through.source_snapshot_id).to_arrow()
    upserts = state.select([f.name for f in fields if f.name in state.column_names])
    for field in fields:
        if field.name not in upserts.column_names:
            # A column the source dropped: the changelog keeps it, null in rows written since.
            upserts = upserts.append_column(
                field.name, pa.nulls(upserts.num_rows, to_arrow_type(field.field_type))
            )
    upserts = upserts.select([f.name for f in fields])
    distinct = upserts.select(list(key)).group_by(list(key)).aggregate([]).num_rows
    if distinct != upserts.num_rows:
        raise MirrorKeyError(
            f"source snapshot {through.source_snapshot_id} holds {upserts.num_rows - distinct} row(s) whose key "
            f"{list(key)} another row also has: a mirror holds one row per key; make the key unique in the source"
        )
    return NetChanges(upserts, upserts.select(list(key)).slice(0, 0), key, through)


def rebuild(
    ctx: Context, mirror: MirrorConfig, *, origin: str = "changelog", run_id: str | None = None
) -> dict[str, Any]:
    """Replace the mirror's rows with the source's state at the changelog's watermark; returns figures."""
    if origin not in ("changelog", "source"):
        raise ValueError(f"origin must be 'changelog' or 'source', not {origin!r}")
    if mirror.type == "iceberg":
        steps = iceberg_steps(mirror)
        if not hasattr(steps, "rebuild"):
            raise CdcError(f"{mirror.describe()}: the Iceberg mirror target has no rebuild")
        return steps.rebuild(ctx, mirror, origin=origin)
    run_id = run_id or f"rebuild__{time.strftime('%Y%m%dT%H%M%S')}"
    lease = mirror_lease(ctx, mirror)
    with lease.hold(run_id, lease_ttl_seconds(ctx.table)) as held:
        started = time.perf_counter()
        catalog = ctx.catalog()
        changelog = catalog.load_table(ctx.table.sink)
        through = changelog_mark(changelog, ctx.table.source)
        if through is None:
            raise CdcError(
                f"the changelog {ctx.table.sink} has no watermark yet: run the table's DAG first (make sync)"
            )
        source_table = load_source_table(catalog, ctx.table)
        key = mirror_key(ctx.table, mirror, source_table.schema())
        fields = mirror_fields(changelog.schema(), mirror, key)
        if origin == "changelog":
            net = read_net_changes(
                changelog,
                ctx.table.source,
                Pending(None, through, through.ordinal),
                key,
                [f.name for f in fields],
            )
        else:
            net = _from_source(source_table, through, fields, key)
        result: ApplyResult = postgres_target(ctx, mirror).apply(
            net, base=None, fields=fields, epoch=held.epoch, run_id=run_id, replace_all=True
        )
    figures = {
        **result.to_dict(),
        "from": origin,
        "rows": net.upserts.num_rows,
        "through": through.to_dict(),
        "seconds_total": round(time.perf_counter() - started, 3),
    }
    log.info(
        "%s rebuilt from the %s: %d rows, at source snapshot %s",
        mirror.describe(),
        origin,
        net.upserts.num_rows,
        through.source_snapshot_id,
    )
    return figures


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``rebuild``'s options (here and under ``iceberg-cdc rebuild``)."""
    parser.add_argument("--config", help="the CDC config (default: $CDC_CONFIG)")
    parser.add_argument("--table", required=True, help="the source table, e.g. shop.orders")
    parser.add_argument(
        "--mirror",
        required=True,
        help="the mirror's name (tables[].mirrors[].name, or its table with . as __)",
    )
    parser.add_argument("--from", dest="origin", choices=("changelog", "source"), default="changelog")


def run(args: argparse.Namespace) -> int:
    """Rebuild the mirror; raises on an error (:func:`~iceberg_cdc.command_exit.run_command`: exit 2)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    config = load_config(args.config)
    ctx = Context.of(config, args.table)
    figures = rebuild(ctx, ctx.table.mirror(args.mirror), origin=args.origin)
    print(
        f"{args.table} -> {args.mirror}: rebuilt from the {args.origin}, {figures['rows']:,} rows, at source "
        f"snapshot {figures['through']['source_snapshot_id']}"
    )
    return DONE


def main(argv: list[str] | None = None) -> int:
    return command_main(__doc__, add_arguments, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())

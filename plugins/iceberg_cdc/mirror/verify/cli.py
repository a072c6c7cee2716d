"""``iceberg-cdc verify`` (``make verify``): verify every mirror of the config (or one), repairing drift.

    iceberg-cdc verify --config cdc.yaml [--table shop.orders] [--mirror public__orders]
        [--no-repair] [--limit 20]

(``python -m iceberg_cdc.mirror.verify`` is the same command.) Each mirror is
verified under its own lease (no mirror run overlaps). One line per mirror;
exit 0 when every mirror equals its source (after repair), 1 when drift is
left (always with ``--no-repair`` and drift, which changes nothing), 2 on an
error -- a bad config, an unreachable catalog or target
(:mod:`iceberg_cdc.command_exit`).

With an OpenLineage transport configured (``OPENLINEAGE_URL``,
``OPENLINEAGE_CONFIG``, ...: :mod:`iceberg_cdc.lineage_events`), each
verification is sent as a run of the job ``<mirror DAG id>.verify`` -- the
mirror DAG's ``verify`` task's job -- with the mirror as input and its
``equal_to_source`` assertion; without one nothing is sent.
"""

from __future__ import annotations

import argparse
import logging
import time
from datetime import UTC, datetime

from iceberg_cdc.command_exit import DONE, LEFT, command_main
from iceberg_cdc.config import MirrorConfig, load_config
from iceberg_cdc.errors import CdcError
from iceberg_cdc.lineage import verify_datasets
from iceberg_cdc.lineage_events import configured_client, emit_complete
from iceberg_cdc.mirror.steps import mirror_lease
from iceberg_cdc.mirror.verify.check import KEY_LIMIT, Verification, verify_mirror
from iceberg_cdc.mirror.verify.record import save_verification
from iceberg_cdc.run.context import Context
from iceberg_cdc.run.lease import lease_ttl_seconds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``verify``'s options (here and under ``iceberg-cdc verify``)."""
    parser.add_argument("--config", help="the CDC config (default: $CDC_CONFIG)")
    parser.add_argument("--table", help="only this source table")
    parser.add_argument("--mirror", help="only this mirror (its name, or its table with . as __)")
    parser.add_argument("--no-repair", action="store_true", help="only report drift; change nothing")
    parser.add_argument("--limit", type=int, default=KEY_LIMIT, help="drifted keys named per mirror")


def run(args: argparse.Namespace) -> int:
    """Verify the mirrors ``args`` select: :data:`DONE` when all are equal, :data:`LEFT` when drift is left.

    Raises on an error (:func:`~iceberg_cdc.command_exit.run_command` makes it exit 2).
    """
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    config = load_config(args.config)
    tables = [t for t in config.tables if args.table in (None, t.source)]
    if args.table and not tables:
        raise CdcError(
            f"--table {args.table}: no such table in the config ({[t.source for t in config.tables]})"
        )
    checked = left = 0
    for table in tables:
        ctx = Context.of(config, table.source)
        mirrors = table.mirrors if args.mirror is None else [table.mirror(args.mirror)]
        for mirror in mirrors:
            result = _verify(ctx, mirror, repair=not args.no_repair, limit=args.limit)
            checked += 1
            print(f"{table.source} -> {result.line()} ({result.seconds.get('total', 0):.1f} s)", flush=True)
            if not result.equal:
                left += 1
    if not checked:
        print("no mirrors are configured: nothing to verify")
    return LEFT if left else DONE


def main(argv: list[str] | None = None) -> int:
    return command_main(__doc__, add_arguments, run, argv)


def _verify(ctx: Context, mirror, *, repair: bool, limit: int) -> Verification:
    run_id = f"verify__{time.strftime('%Y%m%dT%H%M%S')}"
    started = datetime.now(UTC)
    with mirror_lease(ctx, mirror).hold(run_id, lease_ttl_seconds(ctx.table)) as held:
        result = verify_mirror(ctx, mirror, repair=repair, run_id=run_id, epoch=held.epoch, key_limit=limit)
    save_verification(ctx.runtime.store(), ctx.table.source, mirror.mirror_name, result.to_dict())
    report_lineage(ctx, mirror, result, started)
    return result


def report_lineage(ctx: Context, mirror: MirrorConfig, result: Verification, started: datetime) -> None:
    """Send the verification to OpenLineage when the user configured a transport (else nothing)."""
    client = configured_client()
    if client is None:
        return
    inputs, outputs = verify_datasets(
        {"source": ctx.table.source, "mirror": mirror.mirror_name},
        {**result.to_dict(), "verified": True},
        ctx.config,
    )
    emit_complete(client, f"{ctx.table.mirror_dag_id(mirror)}.verify", inputs, outputs, started)


if __name__ == "__main__":
    raise SystemExit(main())

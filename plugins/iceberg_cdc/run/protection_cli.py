"""``iceberg-cdc protection release`` (``python -m iceberg_cdc.run.protection_cli release``): remove one table's ``protect_pending`` tags by hand.

For a table that left the config when no other table of the config runs any
more (its detect would otherwise sweep the tags): removes every tag the
pipeline keeps for ``--sink`` on ``--source`` (one metadata commit) and the
table's record in the shuffle store (:mod:`iceberg_cdc.source.protection`).
"""

from __future__ import annotations

import argparse

from iceberg_cdc.command_exit import DONE, run_command
from iceberg_cdc.config import load_config
from iceberg_cdc.pipeline.runtime import load_catalog_from_config, runtime_from_config
from iceberg_cdc.source.protection import forget, release_tags


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``protection``'s actions (here and under ``iceberg-cdc protection``)."""
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    release = sub.add_parser("release", help="remove the protect_pending tags of one source/sink pair")
    release.add_argument("--config", help="the pipeline's YAML config (default: $CDC_CONFIG)")
    release.add_argument("--source", required=True, help="the source table (namespace.table)")
    release.add_argument("--sink", required=True, help="the sink table whose tags go (namespace.table)")


def run(args: argparse.Namespace) -> int:
    """Release the tags; raises on an error (:func:`~iceberg_cdc.command_exit.run_command`: exit 2)."""
    config = load_config(args.config)
    table = load_catalog_from_config(config).load_table(args.source)
    change = release_tags(table, args.sink)
    forget(runtime_from_config(config).store(), args.source, args.sink)
    print(f"removed {len(change.removed)} tag(s) of {args.sink} from {args.source}")
    return DONE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m iceberg_cdc.run.protection_cli")
    add_arguments(parser)
    args = parser.parse_args(argv)
    return run_command(lambda: run(args))


if __name__ == "__main__":
    raise SystemExit(main())

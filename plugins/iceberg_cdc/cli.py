"""``iceberg-cdc``: the operator's commands where the provider wheel is installed (no checkout, no Makefile).

    iceberg-cdc status  [--config cdc.yaml] [--table ns.t] [--json]
    iceberg-cdc verify  [--config cdc.yaml] [--table ns.t] [--mirror name] [--no-repair]
    iceberg-cdc rebuild [--config cdc.yaml] --table ns.t --mirror name [--from source]
    iceberg-cdc protection release [--config cdc.yaml] --source ns.t --sink ns.t_changes

``--config`` defaults to ``$CDC_CONFIG``, as in Airflow. Each subcommand is
the module that owns it (``iceberg-cdc <command> --help``); ``make verify``
and ``make status`` run these too.

Exit codes (:mod:`iceberg_cdc.command_exit`): 0 done (every mirror equal or
repaired, every table caught up), 1 something left (drift not repaired,
snapshots pending), 2 an error (bad arguments or config, an unreachable
catalog, storage or mirror target).
"""

from __future__ import annotations

import argparse
from types import ModuleType

from iceberg_cdc.command_exit import run_command
from iceberg_cdc.mirror import rebuild
from iceberg_cdc.mirror.verify import cli as verify
from iceberg_cdc.run import protection_cli as protection
from iceberg_cdc.ui import status_cli as status

# name -> (one-line help, the module: add_arguments(parser) and run(args) -> exit code)
COMMANDS: dict[str, tuple[str, ModuleType]] = {
    "status": ("each table's sink watermark against its source's current snapshot, and its mirrors'", status),
    "verify": ("prove every mirror equals its source; repair drift unless --no-repair", verify),
    "rebuild": ("replace all of a mirror's rows from the changelog or the source", rebuild),
    "protection": ("release the protect_pending tags of a table that left the config", protection),
}


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="iceberg-cdc", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (summary, module) in COMMANDS.items():
        sub = commands.add_parser(
            name,
            help=summary,
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return run_command(lambda: args.run(args))


if __name__ == "__main__":
    raise SystemExit(main())

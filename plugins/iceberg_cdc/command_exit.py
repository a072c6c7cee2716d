"""The exit codes of the operator's commands (``iceberg-cdc ...``, ``python -m iceberg_cdc....``), in one place.

* ``0`` (:data:`DONE`): done -- every mirror equal (or repaired), every table caught up;
* ``1`` (:data:`LEFT`): the command ran, and something is left for the operator --
  drift not repaired, snapshots still pending;
* ``2`` (:data:`ERROR`): the command could not do its work -- a bad config, an
  unreachable catalog or target, bad arguments (argparse's own code is 2 too).

A monitor or a script tells "not there yet" (1) from "broken" (2) by the code
alone. An exception of any kind is an error, never a 1: an unreachable
PostgreSQL raises psycopg's error, not a :class:`~iceberg_cdc.errors.CdcError`,
and Python's own exit code for an uncaught exception (1) would read as drift.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from iceberg_cdc.error_lines import line_of
from iceberg_cdc.errors import CdcError
from iceberg_cdc.redaction import redact

DONE = 0
LEFT = 1
ERROR = 2


def run_command(body: Callable[[], int]) -> int:
    """``body()``'s code (:data:`DONE` or :data:`LEFT`); :data:`ERROR` with one line on stderr when it raises."""
    try:
        return body()
    except CdcError as exc:  # the project's own errors name the thing and the fix: the message is enough
        print(f"error: {redact(str(exc))}", file=sys.stderr)
    except Exception as exc:
        print(f"error: {line_of(exc)}", file=sys.stderr)
    return ERROR


def command_main(
    description: str | None,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    run: Callable[[argparse.Namespace], int],
    argv: list[str] | None = None,
) -> int:
    """A command module's ``main`` (its ``python -m`` path): its options, then :func:`run_command`."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    return run_command(lambda: run(args))


__all__ = ["DONE", "ERROR", "LEFT", "command_main", "run_command"]

"""``iceberg-cdc status``: where each configured table stands, on a terminal or in a monitor's check.

    iceberg-cdc status --config cdc.yaml [--table shop.orders] [--json]

The CDC view's own status (:func:`iceberg_cdc.ui.status.collect_status`, read
from Iceberg alone, no Airflow), one line per table -- its state, the sink's
watermark beside the source's current snapshot, the snapshots pending -- and
one per mirror, then the table's errors, warnings and notes. ``--json``: the
view's JSON (``/cdc/api/tables``'s ``tables``), without Airflow's part
(blocked runs).

Exit 0 when every table and mirror has caught up, 1 when snapshots are
pending somewhere, 2 when a table or mirror could not be read
(:mod:`iceberg_cdc.command_exit`).
"""

from __future__ import annotations

import argparse
import json

from iceberg_cdc.command_exit import DONE, ERROR, LEFT
from iceberg_cdc.config import load_config
from iceberg_cdc.errors import ConfigError
from iceberg_cdc.ui.status import DEFAULT_TIMEOUT_SECONDS, collect_status
from iceberg_cdc.ui.table_status import TableStatus
from iceberg_cdc.units import format_duration

_UNREADABLE = {"error", "unknown"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="the CDC config (default: $CDC_CONFIG)")
    parser.add_argument(
        "--table", action="append", help="only this source table (repeat for more; default: all)"
    )
    parser.add_argument("--json", action="store_true", help="the CDC view's JSON instead of lines")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_SECONDS,
        help="seconds to wait for the catalog and storage (a table not read by then is an error)",
    )


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    if args.table:
        unknown = sorted(set(args.table) - {t.source for t in config.tables})
        if unknown:
            raise ConfigError(
                f"--table {', '.join(unknown)}: no such table in the config "
                f"({[t.source for t in config.tables]})"
            )
    statuses = collect_status(config, tables=args.table, timeout_seconds=args.timeout)
    if args.json:
        print(json.dumps([s.to_dict() for s in statuses], indent=2))
    else:
        for status in statuses:
            print("\n".join(status_lines(status)))
        if not statuses:
            print("no tables are configured")
    return exit_code(statuses)


def exit_code(statuses: list[TableStatus]) -> int:
    """:data:`ERROR` if a table or mirror could not be read, else :data:`LEFT` while anything is pending."""
    states = [s.state for s in statuses] + [m.state for s in statuses for m in s.mirrors]
    if _UNREADABLE & set(states):
        return ERROR
    return LEFT if any(state != "caught-up" for state in states) else DONE


def status_lines(status: TableStatus) -> list[str]:
    """A table's lines: its state and watermark against the source, its mirrors', then what to look at."""
    pending = "?" if status.pending is None else str(status.pending)
    waiting = status.oldest_pending_age_seconds
    lines = [
        f"{status.source} -> {status.sink}: {status.state}; watermark {_id(status.watermark_snapshot_id)}, "
        f"source at {_id(status.source_snapshot_id)}, {pending} snapshot(s) pending"
        + (f" (oldest waiting {format_duration(waiting)})" if status.pending and waiting is not None else "")
    ]
    for mirror in status.mirrors:
        behind = "?" if mirror.behind_source is None else str(mirror.behind_source)
        lines.append(
            f"  mirror {mirror.name} ({mirror.type} {mirror.table}): {mirror.state}; at "
            f"{_id(mirror.snapshot_id)}, {behind} snapshot(s) behind the source"
            + (f"; {mirror.error}" if mirror.error else "")
        )
    lines += [f"  error: {e}" for e in status.errors]
    lines += [f"  warning: {w}" for w in status.warnings]
    if status.retention_warning:
        lines.append(f"  warning: {status.retention_warning}")
    lines += [f"  note: {n}" for n in status.notes]
    return lines


def _id(snapshot_id: int | None) -> str:
    return "none" if snapshot_id is None else str(snapshot_id)

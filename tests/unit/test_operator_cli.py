"""``iceberg-cdc``'s wiring: the declared entry point, each subcommand to its module, the exit-code rules.

The commands themselves run for real in tests/integration/test_operator_cli.py;
here only what maps a result or an exception to 0, 1 or 2.
"""

from __future__ import annotations

import importlib
import tomllib
from datetime import UTC, datetime
from pathlib import Path

import pytest

from iceberg_cdc import cli
from iceberg_cdc.command_exit import DONE, ERROR, LEFT, run_command
from iceberg_cdc.errors import ConfigError
from iceberg_cdc.ui.mirrors import MirrorStatus
from iceberg_cdc.ui.status_cli import exit_code, status_lines
from iceberg_cdc.ui.table_status import TableStatus

REPO = Path(__file__).resolve().parents[2]


def test_the_wheel_declares_the_command_and_it_leads_to_main():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, attr = scripts["iceberg-cdc"].partition(":")
    assert getattr(importlib.import_module(module), attr) is cli.main


@pytest.mark.parametrize(
    ("argv", "owner"),
    [
        (["status"], "iceberg_cdc.ui.status_cli"),
        (["verify", "--no-repair", "--mirror", "pg"], "iceberg_cdc.mirror.verify.cli"),
        (["rebuild", "--table", "a.b", "--mirror", "pg"], "iceberg_cdc.mirror.rebuild"),
        (["protection", "release", "--source", "a.b", "--sink", "a.c"], "iceberg_cdc.run.protection_cli"),
    ],
)
def test_each_subcommand_runs_the_module_that_owns_it(argv, owner):
    args = cli.parser().parse_args(argv)
    assert args.run.__module__ == owner


def test_bad_arguments_exit_2():
    with pytest.raises(SystemExit) as exited:
        cli.main(["verify", "--limit", "many"])
    assert exited.value.code == ERROR


def test_a_result_passes_through_and_any_exception_is_an_error_line(capsys):
    assert run_command(lambda: LEFT) == LEFT
    assert run_command(lambda: DONE) == DONE

    def config_error() -> int:
        raise ConfigError("tables[0].sink: missing; name the changelog table")

    def connection_refused() -> int:  # not a CdcError: Python alone would exit 1, which reads as drift
        raise ConnectionRefusedError("postgresql://cdc:s3cretpass@db:5432/x refused")

    assert run_command(config_error) == ERROR
    assert capsys.readouterr().err == "error: tables[0].sink: missing; name the changelog table\n"
    assert run_command(connection_refused) == ERROR
    err = capsys.readouterr().err
    assert err.startswith("error: ConnectionRefusedError: postgresql://cdc:") and "s3cretpass" not in err


def _table(**fields) -> TableStatus:
    return TableStatus(
        "shop.orders", "shop.orders_changes", "cdc__shop__orders", "latest", datetime.now(UTC), **fields
    )


def _mirror(**fields) -> MirrorStatus:
    return MirrorStatus("pg", "postgres", "public.orders", "cdc_mirror__pg", **fields)


def test_status_exit_code_0_caught_up_1_pending_2_unreadable():
    caught_up = _table(pending=0, mirrors=[_mirror(behind_source=0)])
    assert exit_code([caught_up]) == DONE
    assert exit_code([]) == DONE
    assert exit_code([caught_up, _table(pending=3)]) == LEFT
    assert exit_code([_table(pending=0, mirrors=[_mirror(behind_source=2)])]) == LEFT
    assert exit_code([_table(pending=3), _table(errors=["source table shop.orders does not exist"])]) == ERROR
    assert exit_code([_table(pending=0, mirrors=[_mirror(error="connection refused")])]) == ERROR
    assert exit_code([_table()]) == ERROR  # nothing known about its lag: not "caught up"


def test_status_lines_name_the_watermark_beside_the_source_and_what_to_look_at():
    status = _table(
        watermark_snapshot_id=11,
        source_snapshot_id=13,
        pending=2,
        mirrors=[_mirror(snapshot_id=11, behind_source=2)],
        notes=["lease not readable"],
    )
    assert status_lines(status) == [
        "shop.orders -> shop.orders_changes: behind; watermark 11, source at 13, 2 snapshot(s) pending",
        "  mirror pg (postgres public.orders): behind; at 11, 2 snapshot(s) behind the source",
        "  note: lease not readable",
    ]

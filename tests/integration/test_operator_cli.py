"""``iceberg-cdc``'s exit codes through the real commands: 0 done, 1 something left, 2 an error.

A real changelog pipeline in process (SQLite catalog, file warehouse) with an
Iceberg mirror; drift is made through pyiceberg, behind the product's back.
The tables' state, the mirrors' rows and the errors are real: only the
command line is this test's.
"""

from __future__ import annotations

import socket

import yaml
from pyiceberg.expressions import EqualTo

from cdc_devtools.inline_mirror import run_mirror
from cdc_devtools.inline_pipeline import SOURCE, InlinePipeline
from cdc_devtools.orders import SCHEMA, rows
from iceberg_cdc.cli import main

MIRROR_TABLE = "mirrors.orders"


def _pipeline(tmp_path, mirrors: list[dict]) -> tuple[InlinePipeline, str]:
    pipeline = InlinePipeline(tmp_path, table={"mirrors": mirrors})
    pipeline.catalog.create_namespace_if_not_exists("mirrors")
    path = tmp_path / "cdc.yaml"
    path.write_text(yaml.safe_dump(pipeline.raw))
    pipeline.create_source(SCHEMA)
    pipeline.source.append(rows(range(50)))
    return pipeline, str(path)


def test_status_exits_1_while_snapshots_are_pending_and_0_once_caught_up(tmp_path, capsys):
    pipeline, config = _pipeline(tmp_path, [])
    assert main(["status", "--config", config]) == 1
    out = capsys.readouterr().out
    current = pipeline.source.current_snapshot().snapshot_id
    assert (
        f"{SOURCE} -> shop.orders_changes: behind; watermark none, source at {current}, 1 snapshot(s)" in out
    )

    pipeline.catch_up()
    assert main(["status", "--config", config]) == 0
    out = capsys.readouterr().out
    assert f"caught-up; watermark {current}, source at {current}, 0 snapshot(s) pending" in out


def test_status_exits_2_when_a_table_cannot_be_read(tmp_path, capsys):
    pipeline, config = _pipeline(tmp_path, [])
    pipeline.catalog.drop_table(SOURCE)
    assert main(["status", "--config", config]) == 2
    assert f"error: source table {SOURCE} does not exist in the catalog" in capsys.readouterr().out


def test_verify_exits_1_while_drift_is_left_and_0_once_repaired(tmp_path, capsys):
    pipeline, config = _pipeline(tmp_path, [{"type": "iceberg", "table": MIRROR_TABLE, "name": "ice"}])
    pipeline.catch_up()
    run_mirror(pipeline.config, SOURCE, "ice")
    assert main(["verify", "--config", config]) == 0, capsys.readouterr()
    capsys.readouterr()

    pipeline.catalog.load_table(MIRROR_TABLE).delete(EqualTo("id", 7))  # behind the product's back
    assert main(["verify", "--config", config, "--no-repair"]) == 1
    assert "missing id=7" in capsys.readouterr().out
    assert main(["verify", "--config", config]) == 0
    assert "repaired" in capsys.readouterr().out
    assert main(["verify", "--config", config, "--no-repair"]) == 0


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # nothing listens there once the probe is closed


def _unreachable_catalog(tmp_path) -> str:
    """A config whose REST catalog does not answer (requests' ConnectionError, no CdcError)."""
    raw = {
        "catalog": {"name": "gone", "type": "rest", "uri": f"http://127.0.0.1:{_closed_port()}/"},
        "shuffle": {"uri": f"file://{tmp_path / 'shuffle'}"},
        "tables": [
            {
                "source": SOURCE,
                "sink": "shop.orders_changes",
                "mirrors": [{"type": "iceberg", "table": MIRROR_TABLE}],
            }
        ],
    }
    path = tmp_path / "unreachable.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def test_an_unreachable_catalog_exits_2_not_1(tmp_path, capsys):
    config = _unreachable_catalog(tmp_path)
    assert main(["verify", "--config", config]) == 2  # Python's own code for the exception would be 1
    err = capsys.readouterr().err
    assert err.startswith("error: ConnectionError: ") and "Traceback" not in err, err
    assert main(["status", "--config", config, "--timeout", "30"]) == 2
    assert "error: catalog 'gone' unreachable" in capsys.readouterr().out


def test_verify_exits_2_for_an_unreachable_target_or_a_bad_config(tmp_path, capsys):
    dsn = f"postgresql://cdc:hunter2secret@127.0.0.1:{_closed_port()}/cdc?connect_timeout=5"
    pipeline, config = _pipeline(tmp_path, [{"type": "postgres", "dsn": dsn, "table": "public.orders"}])
    pipeline.catch_up()
    assert main(["verify", "--config", config]) == 2  # not 1: nothing was compared
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "hunter2secret" not in err, err

    assert main(["verify", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml does not exist" in capsys.readouterr().err
    assert main(["verify", "--config", config, "--table", "shop.nothing"]) == 2

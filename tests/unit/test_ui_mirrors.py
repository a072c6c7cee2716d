"""The CDC view's mirror lines: watermark and lag per mirror, errors on the mirror's own line."""

from __future__ import annotations

from datetime import UTC, datetime

from iceberg_cdc.config import parse_config
from iceberg_cdc.mirror.net_changes import ChangelogMark
from iceberg_cdc.ui.mirrors import mirror_statuses
from iceberg_cdc.ui.page import _mirror_fact

CONFIG = parse_config(
    {
        "catalog": {"name": "t", "type": "sql", "uri": "sqlite:////tmp/never.db"},
        "shuffle": {"uri": "s3://shuffle/cdc"},
        "tables": [
            {
                "source": "shop.orders",
                "sink": "shop.orders_changes",
                "mirrors": [
                    {
                        "type": "postgres",
                        "dsn": "postgresql://u:pw@h/db",
                        "table": "public.orders",
                        "name": "pg",
                    },
                    {
                        "type": "postgres",
                        "dsn": "postgresql://u:pw@h/db",
                        "table": "public.orders2",
                        "name": "down",
                    },
                    {"type": "iceberg", "table": "shop.orders_mirror"},
                ],
            }
        ],
    }
)


def reader(table, mirror):
    if mirror.name == "down":
        raise ConnectionError("server at postgresql://u:pw@h/db is down")
    return ChangelogMark(1, 42, 7) if mirror.name == "pg" else None


def test_each_mirror_has_its_watermark_and_lag():
    table = CONFIG.tables[0]
    statuses = mirror_statuses(
        table,
        reader=reader,
        changelog_ordinal=9,
        source_pending=3,
        source_table=None,
        redact=lambda s: s.replace("pw", "***"),
    )
    pg, down, iceberg = statuses
    assert (pg.snapshot_id, pg.ordinal, pg.behind_changelog, pg.behind_source, pg.state) == (
        42,
        7,
        2,
        5,
        "behind",
    )
    assert down.state == "error" and "pw" not in down.error and "down" in down.error
    assert (
        iceberg.ordinal is None
        and iceberg.behind_changelog == 9
        and iceberg.dag_id == "cdc_mirror__shop__orders__shop__orders_mirror"
    )
    assert pg.to_dict()["watermark"]["snapshot_id"] == "42"
    html = _mirror_fact(pg, datetime.now(UTC))
    assert "2 changelog snapshot(s) behind" in html and "cdc_mirror__shop__orders__pg" in html
    caught_up = mirror_statuses(
        table, reader=reader, changelog_ordinal=7, source_pending=0, source_table=None
    )[0]
    assert caught_up.state == "caught-up" and "caught up" in _mirror_fact(caught_up, datetime.now(UTC))


def test_each_mirror_shows_its_last_verification():
    table = CONFIG.tables[0]
    now = datetime.now(UTC)
    found = {
        "pg": {
            "status": "repaired",
            "verified_at": now.timestamp() - 120,
            "at": {"source_snapshot_id": "42"},
            "repaired_keys": 3,
        },
        "down": {"status": "drift", "verified_at": now.timestamp() - 60, "left_keys": 2},
    }
    statuses = mirror_statuses(
        table,
        reader=reader,
        changelog_ordinal=7,
        source_pending=0,
        source_table=None,
        verifications=lambda t, m: found.get(m.name),
    )
    pg, down, iceberg = statuses
    assert pg.to_dict()["verification"]["repaired_keys"] == 3
    html = _mirror_fact(pg, now)
    assert "verified" in html and "3 keys repaired" in html and "42" in html
    assert down.verification["left_keys"] == 2  # kept even when the watermark cannot be read
    assert "never verified" in _mirror_fact(iceberg, now)
    drifted = mirror_statuses(
        table,
        reader=lambda t, m: ChangelogMark(1, 42, 7),
        changelog_ordinal=7,
        source_pending=0,
        source_table=None,
        verifications=lambda t, m: found["down"],
    )[0]
    assert "2 keys differ" in _mirror_fact(drifted, now)

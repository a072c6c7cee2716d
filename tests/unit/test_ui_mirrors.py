"""The CDC view's mirror lines: watermark and lag per mirror, errors on the mirror's own line."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from iceberg_cdc.airflow.views.airflow_side import DagRuns, RunInfo
from iceberg_cdc.config import parse_config
from iceberg_cdc.error_lines import FailedTask
from iceberg_cdc.mirror.iceberg.inputs import Through
from iceberg_cdc.mirror.iceberg.summary import REPAIR_KEY, apply_summary, marker_summary
from iceberg_cdc.mirror.iceberg.table import last_apply as iceberg_last_apply
from iceberg_cdc.mirror.net_changes import ChangelogMark
from iceberg_cdc.mirror.targets import LastApply
from iceberg_cdc.ui.mirrors import mirror_statuses
from iceberg_cdc.ui.page_mirrors import mirror_section

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
    html = mirror_section([pg], {}, datetime.now(UTC))
    assert "2 changelog snapshot(s) behind" in html and "cdc_mirror__shop__orders__pg" in html
    caught_up = mirror_statuses(
        table, reader=reader, changelog_ordinal=7, source_pending=0, source_table=None
    )[0]
    assert caught_up.state == "caught-up" and "caught up" in mirror_section(
        [caught_up], {}, datetime.now(UTC)
    )


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
    html = mirror_section([pg], {}, now)
    assert "verified" in html and "3 keys repaired" in html and "42" in html
    assert down.verification["left_keys"] == 2  # kept even when the watermark cannot be read
    assert "never verified" in mirror_section([iceberg], {}, now)
    drifted = mirror_statuses(
        table,
        reader=lambda t, m: ChangelogMark(1, 42, 7),
        changelog_ordinal=7,
        source_pending=0,
        source_table=None,
        verifications=lambda t, m: found["down"],
    )[0]
    assert "2 keys differ" in mirror_section([drifted], {}, now)


# ---------------------------------------------------------------- lag in time, last apply, last failure


@pytest.fixture
def source(tmp_path):
    """A real source table (SQLite catalog, file warehouse) with three snapshots."""
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path / 'c.db'}", warehouse=f"file://{tmp_path}")
    catalog.create_namespace("shop")
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    table = catalog.create_table("shop.orders", schema=schema)
    for i in range(3):
        table.append(pa.table({"id": [i]}, schema=schema))
    return table


def snapshots(table):
    return [s for s in table.metadata.snapshots]


def at(snapshot) -> datetime:
    return datetime.fromtimestamp(snapshot.timestamp_ms / 1000, tz=UTC)


def test_the_lag_in_time_is_the_age_of_the_oldest_source_change_the_mirror_does_not_hold(source):
    s1, s2, s3 = snapshots(source)
    now = at(s3) + timedelta(seconds=90)
    table = CONFIG.tables[0]

    def statuses(mark, changelog_ordinal, pending):
        return mirror_statuses(
            table,
            reader=lambda t, m: mark,
            changelog_ordinal=changelog_ordinal,
            source_pending=pending,
            source_table=source,
            now=now,
        )[0]

    # At s1; the changelog at s2, the source at s3: the oldest change the mirror lacks is s2's.
    behind = statuses(ChangelogMark(11, s1.snapshot_id, 1), 2, 1)
    assert (behind.behind_changelog, behind.behind_source) == (1, 2)
    assert behind.oldest_unapplied_snapshot_id == s2.snapshot_id
    assert behind.lag_seconds == pytest.approx((now - at(s2)).total_seconds())
    lag = behind.to_dict()["lag"]
    assert lag["oldest_unapplied_snapshot_id"] == str(s2.snapshot_id)
    assert lag["age_seconds"] == pytest.approx((now - at(s2)).total_seconds())
    assert "oldest change waiting" in mirror_section([behind], {}, now)
    # Nothing applied: every snapshot is waiting, the first the longest.
    empty = statuses(None, 2, 1)
    assert empty.oldest_unapplied_snapshot_id == s1.snapshot_id
    assert empty.lag_seconds == pytest.approx((now - at(s1)).total_seconds())
    # Caught up with the source: no change waits.
    caught_up = statuses(ChangelogMark(13, s3.snapshot_id, 3), 3, 0)
    assert caught_up.oldest_unapplied_snapshot_id is None and caught_up.lag_seconds == 0.0
    assert caught_up.to_dict()["watermark"]["changelog_snapshot_id"] == "13"


def test_each_mirror_shows_its_last_apply_and_an_unreadable_one_on_its_own_line():
    table = CONFIG.tables[0]
    now = datetime.now(UTC)
    applied = LastApply(
        at=now - timedelta(seconds=30), rows={"upserted": 1234, "deleted": 5}, seconds=0.75, phases={}
    )

    def applies(t, m):
        if m.name == "down":
            raise ConnectionError("server at postgresql://u:pw@h/db is down")
        if m.type == "iceberg":  # as the Iceberg mirror's JSON property keeps them: keys sorted
            return LastApply(at=now, rows={"replaced": 0, "upserted": 62}, seconds=0.5, phases={})
        return applied if m.name == "pg" else None

    pg, down, iceberg = mirror_statuses(
        table,
        reader=reader,
        changelog_ordinal=7,
        source_pending=0,
        source_table=None,
        redact=lambda s: s.replace("pw", "***"),
        applies=applies,
        now=now,
    )
    assert pg.to_dict()["last_apply"] == {
        "at": (now - timedelta(seconds=30)).isoformat().replace("+00:00", "Z"),
        "rows": {"upserted": 1234, "deleted": 5},
        "seconds": 0.75,
        "phases": {},
    }
    html = mirror_section([pg, down, iceberg], {}, now)
    assert "1,234 upserted, 5 deleted" in html and "0.75 s" in html
    assert down.last_apply_error and "pw" not in down.last_apply_error
    assert "62 upserted, 0 replaced" in mirror_section([iceberg], {}, now), "upserts first, on every target"


def test_the_mirror_dags_last_failure_is_shown_with_its_error_line():
    table = CONFIG.tables[0]
    now = datetime.now(UTC)
    [pg] = mirror_statuses(
        CONFIG.tables[0].model_copy(update={"mirrors": table.mirrors[:1]}),
        reader=reader,
        changelog_ordinal=7,
        source_pending=0,
        source_table=None,
    )
    error = "MirrorSchemaError: column 'note' holds a NUL character; exclude_columns: [note]"
    failed = RunInfo(
        run_id="asset_triggered__1",
        state="failed",
        run_type="asset_triggered",
        run_after=now,
        started_at=now,
        ended_at=now,
        snapshot_id=None,
        url="/dags/x/runs/asset_triggered__1",
        failed_tasks=[
            FailedTask(task_id="apply", map_index=-1, try_number=1, ended_at=now, error=error, url="")
        ],
    )
    runs = DagRuns(pg.dag_id, f"/dags/{pg.dag_id}", True, False, failed, [failed], [failed])
    html = mirror_section([pg], {pg.dag_id: runs}, now)
    assert "asset_triggered__1" in html and f"apply: {error}".replace("'", "&#x27;") in html
    assert "none" in mirror_section([pg], {pg.dag_id: DagRuns(pg.dag_id, "", True, False)}, now)


def test_the_iceberg_mirrors_last_apply_is_its_newest_apply_snapshot_not_a_repair_or_maintenance(tmp_path):
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path / 'c.db'}", warehouse=f"file://{tmp_path}")
    catalog.create_namespace("shop")
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    mirror = catalog.create_table("shop.orders_mirror", schema=schema)
    assert iceberg_last_apply(mirror) is None
    through = Through(5, 50, 2)
    summary = {
        **marker_summary(through, "shop.orders"),
        **apply_summary(
            {"rows.upserted": 40, "rows.replaced": 3, "rows.live-change": 37},
            {"mirror_join": 1.5, "commit": 0.25},
            keys=43,
            files_scanned=1,
            mode="merge-on-read",
        ),
    }
    mirror.append(pa.table({"id": [1]}, schema=schema), snapshot_properties=summary)
    applied_ms = mirror.current_snapshot().timestamp_ms
    mirror.append(pa.table({"id": [2]}, schema=schema))  # maintenance: no marker
    mirror.append(  # a verification's repair: marker kept, not an apply
        pa.table({"id": [3]}, schema=schema),
        snapshot_properties={**summary, REPAIR_KEY: "true", "cdc.mirror.rows.upserted": "1"},
    )
    found = iceberg_last_apply(mirror)
    assert found == {
        "at_ms": applied_ms,
        "rows": {"upserted": 40, "replaced": 3},
        "seconds": {"mirror_join": 1.5, "commit": 0.25},
    }


def test_the_iceberg_mirrors_last_apply_is_its_latest_apply_run_a_no_op_too(tmp_path):
    """As the PostgreSQL target's state row: an apply that changed no row (no snapshot) is the last apply."""
    from iceberg_cdc.mirror.iceberg.commit import Delta, commit_delta
    from iceberg_cdc.mirror.iceberg.plan import ApplyPlan
    from iceberg_cdc.mirror.iceberg.summary import watermark_properties
    from iceberg_cdc.mirror.targets import read_last_apply

    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path / 'c.db'}", warehouse=f"file://{tmp_path}")
    catalog.create_namespace("shop")
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    mirror = catalog.create_table("shop.orders_mirror", schema=schema)

    def summary(upserted: int, seconds: float) -> dict[str, str]:
        figures = {"rows.upserted": upserted, "rows.replaced": 0, "rows.live-change": upserted}
        return apply_summary(figures, {"plan": seconds}, keys=upserted, files_scanned=0, mode="merge-on-read")

    # An apply with rows, as an older writer left it: its snapshot's summary and the watermark only.
    earlier = Through(5, 50, 2)
    rows = {**marker_summary(earlier, "shop.orders"), **summary(40, 1.5)}
    mirror.append(pa.table({"id": [1]}, schema=schema), snapshot_properties=rows)
    with mirror.transaction() as tx:
        tx.set_properties(watermark_properties(earlier, "shop.orders"))
    applied_ms = mirror.current_snapshot().timestamp_ms
    assert iceberg_last_apply(mirror)["rows"] == {"upserted": 40, "replaced": 0}

    latest = Through(6, 51, 3)  # the next changelog snapshot's net changes cancel out: no row changes
    plan = ApplyPlan(
        mirror="shop.orders_mirror", source="shop.orders", lease_name="l", run_id="r", epoch=1,
        lease_ttl_seconds=60.0, through=latest.to_dict(), key_columns=["id"], mode="merge-on-read",
        format_version=2, base_snapshot_id=mirror.current_snapshot().snapshot_id, metadata_json="{}",
        location=mirror.location(), staging_dir=str(tmp_path), key_count=0, upsert_rows=0, delete_rows=0,
        units=[], groups=[],
    )  # fmt: skip
    result = commit_delta(mirror, plan, Delta(add=[], remove={}), summary(0, 0.25))
    assert not result.committed and "only the watermark moved" in result.reason
    mirror.refresh()
    assert mirror.current_snapshot().timestamp_ms == applied_ms  # no snapshot: no summary to read
    found = iceberg_last_apply(mirror)
    assert found is not None and found["at_ms"] >= applied_ms
    assert (found["rows"], found["seconds"]) == ({"upserted": 0, "replaced": 0}, {"plan": 0.25})

    class Ctx:
        @staticmethod
        def catalog():
            return catalog

    last = read_last_apply(Ctx, CONFIG.tables[0].mirrors[2])
    assert last is not None and last.rows == {"upserted": 0, "replaced": 0} and last.seconds == 0.25


def test_a_mirror_caught_up_with_a_blocked_changelog_says_it_waits_on_the_table():
    """Not "0 changelog snapshot(s) behind" in amber: the lag is the changelog's own, and why."""
    mirror = mirror_statuses(
        CONFIG.tables[0], reader=reader, changelog_ordinal=7, source_pending=1, source_table=None
    )[0]
    assert (mirror.behind_changelog, mirror.behind_source) == (0, 1)
    blocked = mirror_section([mirror], {}, datetime.now(UTC), table_blocked=True)
    assert "0 changelog snapshot(s) behind" not in blocked
    assert "caught up with the changelog" in blocked and "waits on the blocked table" in blocked
    assert "1 source snapshot(s) not in the changelog yet" in blocked
    running = mirror_section([mirror], {}, datetime.now(UTC))
    assert "waits for the changelog's next commit" in running and "blocked" not in running


def test_a_verification_older_than_the_mirrors_position_says_so():
    now = datetime.now(UTC)
    older = {
        "status": "equal",
        "verified_at": now.timestamp() - 60,
        "at": {"source_snapshot_id": "40", "ordinal": 1},
    }
    current = {**older, "at": {"source_snapshot_id": "42", "ordinal": 7}}
    for found, marked in ((older, True), (current, False)):
        [pg] = mirror_statuses(
            CONFIG.tables[0], reader=reader, changelog_ordinal=7, source_pending=0, source_table=None,
            verifications=lambda t, m, found=found: found if m.name == "pg" else None,
        )[:1]  # fmt: skip
        html = mirror_section([pg], {}, now)
        assert ('data-field="mirror-verified-older"' in html) is marked, html
        if marked:
            assert "#1: older than the mirror's #7" in html

"""A mirror apply's OpenLineage datasets: the changelog at the snapshot it reached in, the mirror out.

Built from the apply's XComs and the config file only (the provider asks in a
short-lived process after the task). The PostgreSQL case runs end to end in
``tests/integration/test_mirror_airflow.py``; here both targets, and the runs
that report nothing.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
import yaml

from iceberg_cdc.airflow.operators.lineage import ChangelogLineageOperator, mirror_datasets
from iceberg_cdc.verify_status import VerifyStatus, is_equal

CHANGELOG_AT = "5200992516889735211"
DETECTED = {
    "action": "apply",
    "source": "shop.orders",
    "changelog": "shop.orders_changes",
    "changelog_location": "s3://wh/shop/orders_changes",
    "through": {"changelog_snapshot_id": CHANGELOG_AT, "source_snapshot_id": "7", "ordinal": 3},
}


@pytest.fixture(autouse=True)
def config(tmp_path, monkeypatch):
    raw = {
        "catalog": {"name": "t", "type": "sql", "uri": f"sqlite:///{tmp_path}/c.db"},
        "shuffle": {"uri": f"file://{tmp_path}/shuffle"},
        "tables": [
            {
                "source": "shop.orders",
                "sink": "shop.orders_changes",
                "mirrors": [
                    {"type": "iceberg", "table": "mirror.orders", "name": "ice"},
                    {
                        "type": "postgres",
                        "dsn": "postgresql://u:secret@db.internal:6543/shop",
                        "table": "public.orders",
                        "name": "pg",
                    },
                ],
            }
        ],
    }
    path = tmp_path / "cdc.yaml"
    path.write_text(yaml.safe_dump(raw))
    monkeypatch.setenv("CDC_CONFIG", str(path))


def test_an_iceberg_mirror_is_named_by_its_location_at_the_snapshot_the_apply_made():
    applied = {
        "committed": True,
        "mirror_snapshot_id": "99",
        "mirror_location": "s3://wh/mirror/orders",
        "rows.upserted": 12,
    }
    inputs, outputs = mirror_datasets({**DETECTED, "mirror": "ice"}, applied)
    (read,) = inputs
    assert (read.namespace, read.name, read.version) == ("s3://wh", "shop/orders_changes", CHANGELOG_AT)
    (written,) = outputs
    assert (written.namespace, written.name, written.version, written.rows) == (
        "s3://wh",
        "mirror/orders",
        "99",
        12,
    )


def test_a_postgres_mirror_is_named_as_openlineage_names_postgres_without_the_password():
    inputs, outputs = mirror_datasets(
        {**DETECTED, "mirror": "pg"}, {"applied": True, "upserted": 5, "deleted": 2}
    )
    (written,) = outputs
    assert (written.namespace, written.name, written.rows) == (
        "postgres://db.internal:6543",
        "shop.public.orders",
        5,
    )
    assert written.version is None
    assert "secret" not in repr((inputs, outputs))


def test_an_apply_that_committed_nothing_wrote_no_rows():
    _, outputs = mirror_datasets(
        {**DETECTED, "mirror": "pg"}, {"applied": False, "reason": "already applied", "upserted": 5}
    )
    assert outputs[0].rows == 0


def test_a_caught_up_mirror_run_reports_no_datasets():
    ran = SimpleNamespace(  # what the operator keeps when its task ran
        lineage="mirror",
        _lineage_detected={"action": "caught_up", "source": "shop.orders", "mirror": "pg"},
        _lineage_committed={"applied": False, "reason": "caught up"},
    )
    assert ChangelogLineageOperator.lineage_datasets(ran, None) == ([], [])


def test_a_verification_reports_the_mirror_with_a_data_quality_assertion():
    from iceberg_cdc.airflow.operators.lineage import operator_lineage, verify_datasets

    detected = {**DETECTED, "mirror": "ice"}
    verified = {
        "verified": True,
        "status": "repaired",
        "drifted_keys": 3,
        "left_keys": 0,
        "mirror_location": "s3://wh/mirror/orders",
    }
    inputs, outputs = verify_datasets(detected, verified)
    assert outputs == []
    (mirror,) = inputs
    assert (mirror.namespace, mirror.name) == ("s3://wh", "mirror/orders")
    assert mirror.assertions == (("equal_to_source", True, "3 keys differed, 0 left (repaired)"),)
    event = operator_lineage(inputs, outputs)
    facet = event.inputs[0].inputFacets["dataQualityAssertions"]
    assert [(a.assertion, a.success) for a in facet.assertions] == [("equal_to_source", True)]

    (left,), _ = verify_datasets(detected, {**verified, "status": "drift", "left_keys": 3})
    assert left.assertions[0][1] is False
    assert verify_datasets(detected, {"verified": False, "reason": "not due"}) == ([], [])


def test_a_verification_metric_says_equal_or_not():
    from iceberg_cdc.run.metrics import emit_verification

    sent: list[tuple] = []

    class Recorder:
        def gauge(self, stat, value, rate=None, delta=None, *, tags=None):
            sent.append((stat, value))

        def timing(self, stat, dt, *, tags=None):
            sent.append((stat, dt.total_seconds()))

        def incr(self, stat, count=None, rate=None, *, tags=None):
            sent.append((stat, count))

    emit_verification(
        Recorder(),
        "shop.orders",
        "pg",
        {
            "status": "drift",
            "drifted_keys": 2,
            "left_keys": 2,
            "seconds": {"digest_source": 1.2, "total": 1.5, "digest_mb_per_s": 9.0},
        },
    )
    assert sent == [
        ("cdc.shop__orders.mirror.pg.verify.equal", 0.0),
        ("cdc.shop__orders.mirror.pg.verify.drifted_keys", 2.0),
        ("cdc.shop__orders.mirror.pg.verify.left_keys", 2.0),
        ("cdc.shop__orders.mirror.pg.verify.seconds", 1.5),
    ]


@pytest.mark.parametrize("status", [*VerifyStatus, "unknown"])
def test_every_consumer_of_a_verification_agrees_on_equal(status):
    """The step (MirrorDriftError), the metric and the lineage assertion ask one rule.

    Lineage used to fail ``equal_to_source`` for a mirror not applied yet, which
    the check and the metric count as equal.
    """
    from iceberg_cdc.lineage import verify_datasets
    from iceberg_cdc.mirror.verify.check import Verification
    from iceberg_cdc.run.metrics import emit_verification

    expected = {"equal": True, "repaired": True, "not_applied": True}.get(str(status), False)
    assert is_equal(status) is expected
    answer = {"verified": True, "status": str(status), "drifted_keys": 0, "left_keys": 0}
    ((_, asserted, _),) = verify_datasets({**DETECTED, "mirror": "pg"}, answer)[0][0].assertions
    gauges: dict[str, float] = {}

    class Recorder:
        def gauge(self, stat, value, rate=None, delta=None, *, tags=None):
            gauges[stat.rsplit(".", 1)[-1]] = value

        def timing(self, stat, dt, *, tags=None):
            pass

    emit_verification(Recorder(), "shop.orders", "ice", answer)
    assert (asserted, gauges["equal"]) == (expected, float(expected))
    if isinstance(status, VerifyStatus):
        found = Verification("ice", "mirror.orders", status)
        assert found.equal is expected
        # XCom and the stored record carry the plain string, as before the type.
        assert json.loads(json.dumps(found.to_dict()))["status"] == status.value
        assert type(found.to_dict()["status"]) is str


VERIFIED = {
    "verified": True,
    "status": "equal",
    "drifted_keys": 0,
    "left_keys": 0,
    "mirror_location": "s3://wh/mirror/orders",
}


def test_the_verify_task_of_a_mirror_dag_reports_the_mirror_with_its_assertion():
    """Through the operator, as the provider asks: a mirror's detect has no ``snapshot_id``."""
    ran = SimpleNamespace(  # what the operator keeps when the verify task ran
        lineage="verify",
        _lineage_detected={**DETECTED, "mirror": "ice", "epoch": 3},
        _lineage_committed=VERIFIED,
    )
    (mirror,), outputs = ChangelogLineageOperator.lineage_datasets(ran, None)
    assert outputs == [] and (mirror.namespace, mirror.name) == ("s3://wh", "mirror/orders")
    assert mirror.assertions == (("equal_to_source", True, "0 keys differed, 0 left (equal)"),)


def _events(directory) -> list[dict]:
    import json

    return [json.loads(path.read_text()) for path in sorted(directory.glob("event*"))]


def test_make_verify_sends_the_verification_to_a_configured_transport_and_nothing_without_one(
    tmp_path, monkeypatch
):
    from datetime import UTC, datetime

    from iceberg_cdc.config import load_config
    from iceberg_cdc.lineage_events import configured_client
    from iceberg_cdc.mirror.verify.check import Verification
    from iceberg_cdc.mirror.verify.cli import report_lineage
    from iceberg_cdc.run.context import Context

    for key in [k for k in os.environ if k.startswith("OPENLINEAGE")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    ctx = Context.of(load_config(), "shop.orders")
    mirror = ctx.table.mirror("ice")
    found = Verification("ice", "mirror.orders", "drift", drifted_keys=2, left_keys=2)
    found.mirror_location = "s3://wh/mirror/orders"
    out = tmp_path / "lineage"
    out.mkdir()

    assert configured_client() is None  # no transport configured: no client (its fallback prints)
    report_lineage(ctx, mirror, found, datetime.now(UTC))
    assert list(out.iterdir()) == []

    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__TYPE", "file")
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__LOG_FILE_PATH", str(out / "event"))
    monkeypatch.setenv("OPENLINEAGE_NAMESPACE", "cdc-tests")
    report_lineage(ctx, mirror, found, datetime.now(UTC))
    events = _events(out)
    assert [e["eventType"] for e in events] == ["START", "COMPLETE"]
    complete = events[-1]
    job = complete["job"]
    assert (job["namespace"], job["name"]) == ("cdc-tests", "cdc_mirror__shop__orders__ice.verify")
    (read,) = complete["inputs"]
    assert (read["namespace"], read["name"]) == ("s3://wh", "mirror/orders")
    [assertion] = read["inputFacets"]["dataQualityAssertions"]["assertions"]
    assert (assertion["assertion"], assertion["success"]) == ("equal_to_source", False)
    assert complete["outputs"] == []


def test_an_apply_over_several_changelog_snapshots_names_the_range_it_read():
    """Base (the mirror's mark before, exclusive) and end: the end alone hides what was applied."""
    from openlineage.client.serde import Serde

    from iceberg_cdc.airflow.operators.lineage import operator_lineage

    base = {"changelog_snapshot_id": "111", "source_snapshot_id": "4", "ordinal": 0}
    detected = {**DETECTED, "mirror": "pg", "base": base, "snapshots": 3}
    (read,), _ = mirror_datasets(detected, None)
    assert (read.version, read.snapshot_range) == (CHANGELOG_AT, ("111", CHANGELOG_AT))
    event = Serde.to_dict(operator_lineage([read], []).inputs[0])
    facet = event["inputFacets"]["icebergCdc_snapshotRange"]
    assert (facet["fromSnapshotId"], facet["toSnapshotId"]) == ("111", CHANGELOG_AT)
    assert facet["_schemaURL"].endswith(
        "SnapshotRangeInputDatasetFacet.json#/$defs/SnapshotRangeInputDatasetFacet"
    )
    assert event["facets"]["version"]["datasetVersion"] == CHANGELOG_AT

    (first,), _ = mirror_datasets({**detected, "base": None}, None)  # never applied: from the first snapshot
    assert first.snapshot_range == (None, CHANGELOG_AT)
    facet = Serde.to_dict(operator_lineage([first], []).inputs[0])["inputFacets"]["icebergCdc_snapshotRange"]
    assert "fromSnapshotId" not in facet and facet["toSnapshotId"] == CHANGELOG_AT


def test_a_changelog_commit_names_the_source_snapshot_range_and_its_output_no_range():
    from iceberg_cdc.airflow.operators.lineage import changelog_datasets

    detected = {
        "source": "shop.orders",
        "sink": "shop.orders_changes",
        "source_location": "s3://wh/shop/orders",
        "sink_location": "s3://wh/shop/orders_changes",
        "snapshot_id": "20",
        "base_snapshot_id": "10",
    }
    (read,), (written,) = changelog_datasets(detected, {"committed": True, "sink_snapshot_id": "7"})
    assert (read.version, read.snapshot_range) == ("20", ("10", "20"))
    assert written.snapshot_range is None
    (initial,), _ = changelog_datasets({**detected, "base_snapshot_id": None}, None)
    assert initial.snapshot_range == (None, "20")

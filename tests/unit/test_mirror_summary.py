"""The Iceberg mirror's ``cdc.mirror.*`` keys: spelled once, read back the way they were written."""

from __future__ import annotations

from iceberg_cdc.mirror.iceberg.inputs import Through
from iceberg_cdc.mirror.iceberg.summary import (
    MARKER_PREFIX,
    WATERMARK_PREFIX,
    apply_summary,
    marker_summary,
    parse_mark,
    watermark_properties,
)

THROUGH = Through(changelog_snapshot_id=5200992516889735211, source_snapshot_id=7, ordinal=3)


def test_the_marker_and_the_watermark_read_back_exactly():
    assert parse_mark(marker_summary(THROUGH, "shop.orders"), MARKER_PREFIX) == THROUGH
    assert parse_mark(watermark_properties(THROUGH, "shop.orders"), WATERMARK_PREFIX) == THROUGH
    assert marker_summary(THROUGH, "shop.orders") == {
        "cdc.mirror.changelog-snapshot-id": "5200992516889735211",
        "cdc.mirror.source-snapshot-id": "7",
        "cdc.mirror.ordinal": "3",
        "cdc.mirror.source-table": "shop.orders",
    }


def test_a_mark_with_a_missing_or_unreadable_field_is_no_mark():
    marker = marker_summary(THROUGH, "shop.orders")
    assert parse_mark({k: v for k, v in marker.items() if not k.endswith("ordinal")}, MARKER_PREFIX) is None
    assert parse_mark({**marker, "cdc.mirror.ordinal": "three"}, MARKER_PREFIX) is None
    assert parse_mark(marker, WATERMARK_PREFIX) is None  # a summary is not the table's watermark


def test_the_apply_summary_names_every_figure_under_the_prefix():
    summary = apply_summary(
        {"rows.upserted": 10, "rows.replaced": 13},
        {"plan": 0.5},
        keys=20,
        files_scanned=4,
        mode="merge-on-read",
    )
    assert summary == {
        "cdc.mirror.rows.upserted": "10",
        "cdc.mirror.rows.replaced": "13",
        "cdc.mirror.seconds.plan": "0.5",
        "cdc.mirror.keys": "20",
        "cdc.mirror.files.scanned": "4",
        "cdc.mirror.mode": "merge-on-read",
    }
    assert parse_mark(summary, MARKER_PREFIX) is None  # figures alone are no marker


def test_the_last_apply_property_reads_back_and_a_repair_records_none():
    from iceberg_cdc.mirror.iceberg.summary import (
        LAST_APPLY_PROPERTY,
        REPAIR_KEY,
        last_apply_property,
        parse_last_apply,
    )

    marker = {**marker_summary(THROUGH, "shop.orders"), **apply_summary({"rows.upserted": 0}, {"plan": 0.5},
              keys=0, files_scanned=0, mode="merge-on-read")}  # fmt: skip
    recorded = last_apply_property(marker, 1_700_000_000_123)
    assert parse_last_apply(recorded) == {
        "at_ms": 1_700_000_000_123,
        "ordinal": 3,
        "rows": {"upserted": 0},
        "seconds": {"plan": 0.5},
    }
    assert last_apply_property({**marker, REPAIR_KEY: "r1"}, 1) == {}  # a repair is no apply
    assert parse_last_apply({}) is None and parse_last_apply({LAST_APPLY_PROPERTY: "{not json"}) is None

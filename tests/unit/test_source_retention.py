"""The retention guard's arithmetic against Iceberg's expiry rules, stated plainly as an oracle.

The oracle (:func:`java_retains`) is Java ``RemoveSnapshots``' retention,
written apart from the module: refs past their ``max-ref-age-ms`` are dropped
(never ``main``); each remaining branch keeps its ancestors, head first, while
fewer than ``min-snapshots-to-keep`` are kept or the ancestor is within
``max-snapshot-age-ms``, stopping at the first it does not keep; tags keep
their head. For random histories, properties and refs, every needed snapshot
must survive an expiry at ``kept_until_ms`` and one must not survive a
millisecond later (or all survive forever when the outlook says so).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata, new_table_metadata
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRef, SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.types import LongType, NestedField

from iceberg_cdc.source.retention import (
    DEFAULT_MAX_SNAPSHOT_AGE_MS,
    MAX_REF_AGE_PROPERTY,
    MAX_SNAPSHOT_AGE_PROPERTY,
    MIN_SNAPSHOTS_PROPERTY,
    NeededSnapshots,
    outlook,
)

HOUR = 3600 * 1000
T0 = 1_700_000_000_000


def metadata(
    timestamps: list[int],
    properties: dict[str, str] | None = None,
    refs: dict[str, SnapshotRef] | None = None,
    main: SnapshotRef | None = None,
) -> TableMetadata:
    """A table whose main line is snapshots 1..n (committed at ``timestamps``), with extra refs."""
    base = new_table_metadata(
        Schema(NestedField(1, "id", LongType())),
        UNPARTITIONED_PARTITION_SPEC,
        UNSORTED_SORT_ORDER,
        "file:///tmp/t",
        properties or {},
    )
    snapshots = [
        Snapshot(
            snapshot_id=i + 1,
            parent_snapshot_id=i or None,
            sequence_number=i + 1,
            timestamp_ms=ts,
            manifest_list=f"file:///tmp/t/m{i}.avro",
            summary=Summary(Operation.APPEND),
            schema_id=0,
        )
        for i, ts in enumerate(timestamps)
    ]
    head = len(timestamps)
    all_refs = {MAIN_BRANCH: main or SnapshotRef(snapshot_id=head, snapshot_ref_type=SnapshotRefType.BRANCH)}
    all_refs.update(refs or {})
    return base.model_copy(update={"snapshots": snapshots, "current_snapshot_id": head, "refs": all_refs})


def java_retains(meta: TableMetadata, now: int) -> set[int]:
    """Snapshot ids an Iceberg (Java) expire_snapshots run at ``now`` keeps, from the table's own settings."""
    props = meta.properties
    table_age = int(props.get(MAX_SNAPSHOT_AGE_PROPERTY, DEFAULT_MAX_SNAPSHOT_AGE_MS))
    table_min = int(props.get(MIN_SNAPSHOTS_PROPERTY, 1))
    table_ref_age = int(props[MAX_REF_AGE_PROPERTY]) if MAX_REF_AGE_PROPERTY in props else None
    kept: set[int] = set()
    for name, ref in meta.refs.items():
        head = meta.snapshot_by_id(ref.snapshot_id)
        ref_age = ref.max_ref_age_ms or table_ref_age
        if name != MAIN_BRANCH and ref_age is not None and now - head.timestamp_ms > ref_age:
            continue  # the ref itself expires
        if ref.snapshot_ref_type == SnapshotRefType.TAG:
            kept.add(head.snapshot_id)
            continue
        older_than = now - (ref.max_snapshot_age_ms or table_age)
        keep = ref.min_snapshots_to_keep or table_min
        retained: list[int] = []
        snapshot = head
        while snapshot is not None:
            if len(retained) < keep or snapshot.timestamp_ms >= older_than:
                retained.append(snapshot.snapshot_id)
            else:
                break
            parent = snapshot.parent_snapshot_id
            snapshot = meta.snapshot_by_id(parent) if parent is not None else None
        kept.update(retained)
    return kept


def test_a_watermark_only_main_keeps_goes_after_the_tables_max_snapshot_age():
    meta = metadata([T0, T0 + HOUR, T0 + 2 * HOUR], {MAX_SNAPSHOT_AGE_PROPERTY: str(6 * HOUR)})
    result = outlook(meta, NeededSnapshots(1, (2, 3)))
    assert result.first is not None
    assert (result.first.snapshot_id, result.first.role) == (1, "watermark")
    assert result.first.kept_until_ms == T0 + 6 * HOUR
    assert result.seconds_left(T0 + 5 * HOUR) == 3600.0
    assert result.needed == 3 and not result.protected
    assert "max-snapshot-age 6 h" in result.first.kept_by


def test_mains_own_max_snapshot_age_wins_over_the_table_property():
    main = SnapshotRef(snapshot_id=3, snapshot_ref_type=SnapshotRefType.BRANCH, max_snapshot_age_ms=HOUR)
    meta = metadata([T0, T0 + HOUR, T0 + 2 * HOUR], {MAX_SNAPSHOT_AGE_PROPERTY: str(100 * HOUR)}, main=main)
    result = outlook(meta, NeededSnapshots(1, (2, 3)))
    assert result.first.kept_until_ms == T0 + HOUR
    assert result.max_snapshot_age_ms == HOUR


def test_min_snapshots_to_keep_holds_without_a_time_limit():
    meta = metadata([T0, T0 + 1, T0 + 2], {MIN_SNAPSHOTS_PROPERTY: "5", MAX_SNAPSHOT_AGE_PROPERTY: "1"})
    result = outlook(meta, NeededSnapshots(1, (2, 3)))
    assert result.seconds_left(T0 + 10**9) is None
    assert result.first.snapshot_id == 1 and result.first.newer_needed == 3  # 3 more snapshots, then age


def test_a_tag_on_the_watermark_leaves_the_next_pending_snapshot_first():
    tag = SnapshotRef(snapshot_id=1, snapshot_ref_type=SnapshotRefType.TAG)
    meta = metadata([T0, T0 + HOUR, T0 + 2 * HOUR], refs={"keep": tag})
    result = outlook(meta, NeededSnapshots(1, (2, 3)))
    assert (result.first.snapshot_id, result.first.role) == (2, "pending")
    assert result.first.kept_until_ms == T0 + HOUR + DEFAULT_MAX_SNAPSHOT_AGE_MS


def test_a_tag_with_a_max_ref_age_protects_until_then():
    tag = SnapshotRef(snapshot_id=1, snapshot_ref_type=SnapshotRefType.TAG, max_ref_age_ms=200 * HOUR)
    meta = metadata([T0, T0 + HOUR], {MAX_SNAPSHOT_AGE_PROPERTY: str(HOUR)}, refs={"t": tag})
    result = outlook(meta, NeededSnapshots(1, (2,)))
    assert result.first.kept_until_ms == T0 + 200 * HOUR
    assert result.first.kept_by == "tag t points at it"


def test_caught_up_needs_only_the_head_which_nothing_expires():
    meta = metadata([T0, T0 + HOUR])
    result = outlook(meta, NeededSnapshots(2, ()))
    assert result.first is None and result.seconds_left(T0 + 10**12) is None


def test_own_tags_on_every_needed_snapshot_count_as_protected():
    tags = {
        f"cdc-pending-s-{i}": SnapshotRef(snapshot_id=i, snapshot_ref_type=SnapshotRefType.TAG)
        for i in (1, 2)
    }
    meta = metadata([T0, T0 + 1, T0 + 2], refs=tags)
    assert outlook(meta, NeededSnapshots(1, (2, 3)), protection_prefix="cdc-pending-s-").protected is False
    tags["cdc-pending-s-3"] = SnapshotRef(snapshot_id=3, snapshot_ref_type=SnapshotRefType.TAG)
    meta = metadata([T0, T0 + 1, T0 + 2], refs=tags)
    assert outlook(meta, NeededSnapshots(1, (2, 3)), protection_prefix="cdc-pending-s-").protected is True
    assert (
        outlook(meta, NeededSnapshots(1, (2, 3)), protection_prefix="cdc-pending-other-").protected is False
    )


def test_the_warning_names_the_snapshot_and_the_fixes_only_below_the_threshold():
    meta = metadata([T0, T0 + HOUR], {MAX_SNAPSHOT_AGE_PROPERTY: str(10 * HOUR)})
    result = outlook(meta, NeededSnapshots(1, (2,)))
    assert result.warning(T0 + 5 * HOUR, threshold_seconds=3 * 3600) is None
    text = result.warning(T0 + 8 * HOUR, threshold_seconds=3 * 3600)
    assert text is not None
    assert "the watermark's snapshot 1 may be expired in 2 h" in text and "protect_pending: true" in text
    assert "may be expired now" in result.warning(T0 + 11 * HOUR, threshold_seconds=60)


def test_without_expiry_settings_the_warning_follows_the_evidence_and_says_the_limit_is_unknown():
    """pyiceberg's older_than ignores the table's properties: with none set, the 5-day default says little."""
    unset = metadata([T0, T0 + HOUR])  # no history.expire.* on the table
    result = outlook(unset, NeededSnapshots(1, (2,)))
    assert result.settings_known is False
    assert result.warning(T0 + 20 * HOUR, threshold_seconds=24 * 3600) is None  # younger than the threshold
    text = result.warning(T0 + 26 * HOUR, threshold_seconds=24 * 3600)
    assert text is not None and "snapshot 1, needed by the sink, is 1 d 2 h old and no tag holds it" in text
    assert "cannot be known" in text and "older_than" in text and "bridge commit" in text
    # The same age with the table's own setting far away: the setting is known, no warning.
    known = outlook(
        metadata([T0, T0 + HOUR], {MAX_SNAPSHOT_AGE_PROPERTY: str(100 * HOUR)}), NeededSnapshots(1, (2,))
    )
    assert known.settings_known and known.warning(T0 + 26 * HOUR, threshold_seconds=24 * 3600) is None
    # Held by the pipeline's tags: nothing unheld to warn about.
    tags = {
        f"cdc-pending-s-{i}": SnapshotRef(snapshot_id=i, snapshot_ref_type=SnapshotRefType.TAG)
        for i in (1, 2)
    }
    held = outlook(
        metadata([T0, T0 + HOUR], refs=tags), NeededSnapshots(1, (2,)), protection_prefix="cdc-pending-s-"
    )
    assert held.warning(T0 + 26 * HOUR, threshold_seconds=24 * 3600) is None


@st.composite
def histories(draw):
    count = draw(st.integers(2, 8))
    gaps = draw(st.lists(st.integers(0, 50), min_size=count, max_size=count))
    timestamps = [T0 + sum(gaps[: i + 1]) * HOUR for i in range(count)]
    properties = {}
    if draw(st.booleans()):
        properties[MAX_SNAPSHOT_AGE_PROPERTY] = str(draw(st.integers(1, 200)) * HOUR)
    if draw(st.booleans()):
        properties[MIN_SNAPSHOTS_PROPERTY] = str(draw(st.integers(1, 6)))
    if draw(st.booleans()):
        properties[MAX_REF_AGE_PROPERTY] = str(draw(st.integers(1, 300)) * HOUR)
    main = SnapshotRef(
        snapshot_id=count,
        snapshot_ref_type=SnapshotRefType.BRANCH,
        max_snapshot_age_ms=draw(st.none() | st.integers(1, 200).map(lambda h: h * HOUR)),
        min_snapshots_to_keep=draw(st.none() | st.integers(1, 6)),
    )
    refs = {}
    for index in range(draw(st.integers(0, 3))):
        target = draw(st.integers(1, count))
        age = draw(st.none() | st.integers(1, 300).map(lambda h: h * HOUR))
        if draw(st.booleans()):
            refs[f"tag{index}"] = SnapshotRef(
                snapshot_id=target, snapshot_ref_type=SnapshotRefType.TAG, max_ref_age_ms=age
            )
        else:
            refs[f"branch{index}"] = SnapshotRef(
                snapshot_id=target,
                snapshot_ref_type=SnapshotRefType.BRANCH,
                max_ref_age_ms=age,
                max_snapshot_age_ms=draw(st.none() | st.integers(1, 200).map(lambda h: h * HOUR)),
                min_snapshots_to_keep=draw(st.none() | st.integers(1, 4)),
            )
    watermark = draw(st.integers(1, count))
    return metadata(timestamps, properties, refs, main), watermark, count


@settings(max_examples=300, deadline=None)
@given(histories())
def test_kept_until_is_exactly_when_icebergs_expiry_may_first_take_a_needed_snapshot(history):
    meta, watermark, count = history
    needed = NeededSnapshots(watermark, tuple(range(watermark + 1, count + 1)))
    result = outlook(meta, needed)
    ids = set(needed.ids)
    if result.first is None or result.first.kept_until_ms is None:
        far = T0 + 10**6 * HOUR
        assert ids <= java_retains(meta, far), "the outlook says no time limit, but an expiry removes one"
        return
    until = result.first.kept_until_ms
    assert ids <= java_retains(meta, until), "a needed snapshot is gone before kept_until_ms"
    assert result.first.snapshot_id not in java_retains(meta, until + 1), "kept_until_ms is too early"

"""Pruning data manifests by the partitions of changed delete files (``source/delete_scope.py``).

A real table with one manifest per append (one region each, and one of rows
without a region) gives real partition summaries. The filter must keep every
manifest that holds a file of a changed delete's partition (pruning must never
change the result) and skip the others, and fall back to reading manifests
whenever it cannot decide: a global equality delete, an unknown spec, a
partition value the expression cannot bind, summaries it cannot compare.
"""

from __future__ import annotations

import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestFile,
    PartitionFieldSummary,
)
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionSpec
from pyiceberg.typedef import Record

from cdc_devtools.orders import BY_REGION, SCHEMA, rows
from iceberg_cdc.source.delete_scope import manifest_filter

REGIONS = ("us", "eu", "ap", None)


@pytest.fixture
def table(tmp_path):
    catalog = SqlCatalog("s", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("shop")
    table = catalog.create_table("shop.orders", SCHEMA, partition_spec=BY_REGION)
    for i, region in enumerate(REGIONS):
        table.append(rows(range(i * 10, i * 10 + 5), [region] * 5))
    return table


def _manifests(table) -> dict[str | None, ManifestFile]:
    """Each data manifest of the table, by the one region its files hold."""
    out = {}
    for manifest in table.current_snapshot().manifests(table.io):
        (region,) = {e.data_file.partition[0] for e in manifest.fetch_manifest_entry(table.io)}
        out[region] = manifest
    assert set(out) == set(REGIONS)
    return out


def _delete(partition: tuple, spec_id: int = 0, content=DataFileContent.POSITION_DELETES) -> DataFile:
    delete_file = DataFile.from_args(
        content=content,
        file_path=f"s3://wh/deletes-{partition}.parquet",
        file_format=FileFormat.PARQUET,
        partition=Record(*partition),
        record_count=1,
        file_size_in_bytes=1,
    )
    delete_file.spec_id = spec_id
    return delete_file


def _kept(table, deletes, specs=None) -> set:
    may_hold = manifest_filter(deletes, specs or table.specs(), table.schema())
    return {region for region, manifest in _manifests(table).items() if may_hold(manifest)}


def test_only_manifests_that_can_hold_the_deletes_partition_are_read(table):
    assert _kept(table, [_delete(("eu",))]) == {"eu"}
    assert _kept(table, [_delete(("eu",)), _delete(("ap",))]) == {"eu", "ap"}
    assert _kept(table, [_delete(("mars",))]) == set()


def test_a_delete_in_the_null_partition_reads_the_manifests_with_nulls(table):
    assert _kept(table, [_delete((None,))]) == {None}


def test_no_changed_delete_reads_no_manifest(table):
    assert _kept(table, []) == set()


def test_a_global_equality_delete_reads_every_manifest(table):
    """An unpartitioned spec's equality delete reaches every data file, whatever its partition."""
    specs = {**table.specs(), 1: PartitionSpec(spec_id=1)}
    equality = _delete((), spec_id=1, content=DataFileContent.EQUALITY_DELETES)
    assert _kept(table, [_delete(("eu",)), equality], specs) == set(REGIONS)


def test_a_delete_of_an_unknown_spec_reads_every_manifest(table):
    assert _kept(table, [_delete(("eu",), spec_id=7)]) == set(REGIONS)


def test_manifests_of_a_spec_no_changed_delete_has_are_not_read(table):
    """Deletes of spec 0 only: a manifest written under another spec holds no file they apply to."""
    manifest = _manifests(table)["eu"]
    other = ManifestFile.from_args(
        manifest_path=manifest.manifest_path,
        manifest_length=manifest.manifest_length,
        partition_spec_id=5,
        content=ManifestContent.DATA,
        sequence_number=manifest.sequence_number,
        min_sequence_number=manifest.min_sequence_number,
        added_snapshot_id=manifest.added_snapshot_id,
        partitions=manifest.partitions,
    )
    specs = {**table.specs(), 5: UNPARTITIONED_PARTITION_SPEC}
    assert manifest_filter([_delete(("eu",))], specs, table.schema())(other) is False


def test_a_partition_value_the_expression_cannot_bind_reads_every_manifest_of_its_spec(table):
    """A struct where the spec has a string: binding fails, and the filter reads rather than guesses."""
    assert _kept(table, [_delete(({"not": "a string"},))]) == set(REGIONS)


def test_summaries_the_filter_cannot_compare_read_the_manifest(table):
    manifest = _manifests(table)["us"]
    broken = ManifestFile.from_args(
        manifest_path=manifest.manifest_path,
        manifest_length=manifest.manifest_length,
        partition_spec_id=0,
        content=ManifestContent.DATA,
        sequence_number=manifest.sequence_number,
        min_sequence_number=manifest.min_sequence_number,
        added_snapshot_id=manifest.added_snapshot_id,
        # not UTF-8: the string bound cannot be decoded
        partitions=[PartitionFieldSummary(False, None, b"\xff\xfe", b"\xff\xff")],
    )
    may_hold = manifest_filter([_delete(("eu",))], table.specs(), table.schema())
    assert may_hold(manifest) is False
    assert may_hold(broken) is True

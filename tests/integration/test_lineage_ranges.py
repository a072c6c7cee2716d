"""The range a changelog run read, as lineage names it: after the processed snapshot's parent, through it.

In process (SQLite catalog, file system store), the same steps as a DAG run:
detect must record the snapshot the run's changes are relative to, which the
commit's lineage names as the input's range (``icebergCdc_snapshotRange``).
The full DAG with the provider's file transport is ``test_lineage_e2e.py``.
"""

from __future__ import annotations

import yaml

from cdc_devtools.inline_pipeline import InlinePipeline
from cdc_devtools.orders import SCHEMA, rows
from iceberg_cdc.airflow.operators.lineage import changelog_datasets


def test_each_run_names_the_source_range_it_read(tmp_path, monkeypatch):
    pipeline = InlinePipeline(tmp_path)
    source = pipeline.create_source(SCHEMA)
    source.append(rows(range(10)))
    first = pipeline.source.current_snapshot().snapshot_id
    pipeline.source.append(rows(range(10, 15), "eu"))
    second = pipeline.source.current_snapshot().snapshot_id
    config = tmp_path / "cdc.yaml"
    config.write_text(yaml.safe_dump(pipeline.raw))
    monkeypatch.setenv("CDC_CONFIG", str(config))

    runs = [run for run in pipeline.catch_up() if run.snapshot_id is not None]
    assert [run.snapshot_id for run in runs] == [first, second]
    ranges = []
    for run in runs:
        (read,), (written,) = changelog_datasets(run.detected.to_xcom(), run.committed)
        ranges.append(read.snapshot_range)
        assert written.snapshot_range is None
    assert ranges == [(None, str(first)), (str(first), str(second))]


def test_a_bridge_names_the_watermarks_snapshot_as_its_start_and_says_it_is_a_bridge(tmp_path, monkeypatch):
    from datetime import UTC, datetime, timedelta

    from openlineage.client.serde import Serde

    from cdc_devtools.cow import cow_merge
    from iceberg_cdc.airflow.operators.lineage import operator_lineage

    pipeline = InlinePipeline(tmp_path)
    pipeline.create_source(SCHEMA).append(rows(range(10)))
    config = tmp_path / "cdc.yaml"
    config.write_text(yaml.safe_dump(pipeline.raw))
    monkeypatch.setenv("CDC_CONFIG", str(config))
    pipeline.catch_up()
    base = pipeline.watermark().snapshot_id
    cow_merge(pipeline.source, upserts=rows([1], "us", "x"))
    last = cow_merge(pipeline.source, upserts=rows([2], "us", "y"))
    pipeline.source.maintenance.expire_snapshots().older_than(
        datetime.now(UTC) + timedelta(seconds=1)
    ).commit()
    [run] = [r for r in pipeline.catch_up() if r.snapshot_id is not None]
    (read,), _ = changelog_datasets(run.detected.to_xcom(), run.committed)
    assert (read.snapshot_range, read.bridge) == ((str(base), str(last)), "expired")
    facet = Serde.to_dict(operator_lineage([read], []).inputs[0])["inputFacets"]["icebergCdc_snapshotRange"]
    assert facet["bridge"] == "expired" and facet["fromSnapshotId"] == str(base)

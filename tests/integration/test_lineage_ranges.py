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

"""An Iceberg mirror on S3 is read exactly by pyiceberg and by DuckDB 1.4.4's iceberg extension.

Real components: the moto S3 server over HTTP, a SQLite catalog, the
mirror's own steps (plan, join units, commit). Each history mixes value
updates, partition moves, deletes and re-inserts of deleted keys over several
applies, so deletes stack on the same data files (a v2 file's position delete
file is replaced by a merged one, a v3 file's DV by a merged DV, a file whose
rows are all gone is dropped). After every apply both readers must return
exactly the source's rows.
"""

from __future__ import annotations

import random
import uuid

import pytest

from cdc_devtools.inline_pipeline import SOURCE, InlinePipeline
from cdc_devtools.replay import multiset
from tests.support.duckdb_reader import read_iceberg
from tests.support.history import HistoryShape, HistoryTable
from tests.support.mirror_harness import MirrorHarness, MirrorTarget

SHAPE = HistoryShape(columns=("string", "decimal", "date", "list"), identifier=("id",), partitioning="region")


def _on_s3(tmp_path, s3_client, s3_properties) -> InlinePipeline:
    bucket = f"mirror-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=bucket)
    return InlinePipeline(
        tmp_path,
        catalog={"warehouse": f"s3://{bucket}/wh", **s3_properties},
        shuffle={"uri": f"s3://{bucket}/shuffle", **s3_properties},
    )


@pytest.mark.parametrize(
    ("format_version", "mode"),
    [(2, "merge-on-read"), (3, "merge-on-read"), (2, "copy-on-write")],
)
def test_duckdb_and_pyiceberg_read_the_mirror_exactly(
    tmp_path, s3_client, s3_properties, format_version, mode
):
    pipeline = _on_s3(tmp_path, s3_client, s3_properties)
    source = pipeline.create_source(SHAPE.schema(), partition_spec=SHAPE.spec())
    history = HistoryTable(source, SHAPE)
    harness = MirrorHarness(
        pipeline.config,
        SOURCE,
        MirrorTarget("mirror.orders", mode=mode, format_version=format_version),
        ("id",),
    )
    rng = random.Random(format_version * 7 + len(mode))
    history.append(rng, 60)
    for step in range(5):
        state = history.state()
        net = harness.net_changes(rng, state, history.table.current_snapshot().snapshot_id)
        harness.apply(net, state)
        mirror = harness.mirror()
        assert mirror.metadata.format_version == format_version
        names = state.column_names
        assert multiset(mirror.scan().to_arrow(), names) == multiset(state, names), f"pyiceberg, apply {step}"
        read = read_iceberg(mirror.metadata_location, s3_properties)
        assert multiset(read, names) == multiset(state, names), f"DuckDB, apply {step}"
        history.merge(rng, update=0.3, move=0.3, noop=0.1, delete=0.15, inserts=8, reinserts=3)

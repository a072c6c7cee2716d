"""The whole chain in process: random source histories -> the changelog -> net changes -> an Iceberg mirror.

The changelog's random-history machines with a mirror rule (their PostgreSQL
variant: :mod:`tests.property.test_mirror_histories`) run here with an
Iceberg mirror instead: each mirror run is the mirror DAG's steps in process
(:func:`cdc_devtools.inline_mirror.run_mirror`: detect, plan_apply with the
Iceberg target's plan, its ``mirror_join`` units, apply through its commit,
cleanup). The copy-on-write machine changes the source's schema too (columns
added, widened, dropped: the mirror keeps a dropped column), the
merge-on-read machine writes position deletes, equality deletes and DVs on
v2 and v3 sources. The mirror's mode and format come with the machine's
partition count (merge-on-read v2, copy-on-write v2, merge-on-read v3 or
the source's format). After every mirror run the mirror, read by pyiceberg,
holds exactly the source's rows at the mirror's watermark, and that
watermark is the changelog's.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

from cdc_devtools.cow import table_state
from cdc_devtools.inline_mirror import MirrorRun, run_mirror
from cdc_devtools.inline_pipeline import SOURCE, InlinePipeline
from cdc_devtools.mirror_check import _rows
from iceberg_cdc.mirror.iceberg import steps as iceberg_steps
from iceberg_cdc.run.context import Context
from tests.property.test_mirror_histories import MirroredCowHistory, MirroredMorHistory

MIRROR = "mirror.orders"
TARGETS = {1: ("merge-on-read", None), 3: ("copy-on-write", 2), 8: ("merge-on-read", 3)}


class IcebergMirrorPipeline(InlinePipeline):
    def __init__(self, tmp, *, mode: str, format_version: int | None, **kwargs) -> None:
        mirror = {"type": "iceberg", "table": MIRROR, "name": "ice", "mode": mode}
        if format_version is not None:
            mirror["format_version"] = format_version
        super().__init__(tmp, table={"mirrors": [mirror]}, **kwargs)

    def mirror(self) -> MirrorRun:
        return run_mirror(self.config, SOURCE, "ice")


def assert_iceberg_mirror_exact(pipeline: IcebergMirrorPipeline, source_table) -> None:
    ctx = Context.of(pipeline.config, SOURCE)
    mirror_config = ctx.table.mirror("ice")
    mark = iceberg_steps.watermark(ctx, mirror_config)
    changelog = pipeline.watermark()
    if mark is None:  # never applied: only when the changelog has nothing yet
        assert changelog is None, f"the changelog is at {changelog}, the mirror was never applied"
        return
    mirror = pipeline.catalog.load_table(MIRROR)
    rows = mirror.scan().to_arrow()
    state = table_state(source_table, mark.source_snapshot_id)
    names = [n for n in state.column_names if n in rows.column_names]
    expected, found = _rows(state, names, pg=False), _rows(rows, names, pg=False)
    assert expected == found, (
        f"Iceberg mirror differs from the source at {mark}: {sum((expected - found).values())} lost, "
        f"{sum((found - expected).values())} duplicated"
    )
    if changelog is not None:
        assert mark.source_snapshot_id == changelog.snapshot_id, (
            f"mirror at {mark}, the changelog at {changelog}"
        )


class _IcebergRules:
    def _new_pipeline(self, partitions: int) -> IcebergMirrorPipeline:
        mode, version = TARGETS[partitions]
        return IcebergMirrorPipeline(
            self.tmp,
            mode=mode,
            format_version=version,
            shuffle={"partitions": partitions, "target_partition_size": "2KB", "write_task_size": "4KB"},
        )

    def _mirror_and_check(self) -> None:
        self.pipeline.mirror()
        assert_iceberg_mirror_exact(self.pipeline, self.history.table)


class IcebergMirroredCowHistory(_IcebergRules, MirroredCowHistory):
    pass


class IcebergMirroredMorHistory(_IcebergRules, MirroredMorHistory):
    pass


_SETTINGS = dict(
    stateful_step_count=7,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
_SCALE = int(os.environ.get("CDC_HISTORIES", "200"))
IcebergMirroredCowHistory.TestCase.settings = settings(max_examples=max(1, _SCALE // 8), **_SETTINGS)
IcebergMirroredMorHistory.TestCase.settings = settings(max_examples=max(1, _SCALE // 10), **_SETTINGS)
TestIcebergMirroredCowHistories = IcebergMirroredCowHistory.TestCase
TestIcebergMirroredMorHistories = IcebergMirroredMorHistory.TestCase

"""Apache Iceberg's table-level changelog tests, as histories of real tables run through the pipeline.

The cases are data (``tests/cases/iceberg_table_cases.yaml``; its header explains the step ops).
Each case builds a real table with pyiceberg in a SQLite catalog, applies its steps, and processes
the snapshots with :class:`~cdc_devtools.inline_pipeline.InlinePipeline` (the DAG's steps and the
Spark tasks' functions in this process). For every processed snapshot the sink's change rows must be
the step's expected rows, the DAG run must take the expected path (insert / shuffle / skip), the
ordinals must increase, and the replay invariant must hold; rolled-back snapshots must never reach
a sink.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.manifest import ManifestContent, ManifestEntry, ManifestEntryStatus, ManifestFile
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation, Summary
from pyiceberg.table.update.snapshot import _FastAppendFiles
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import EMPTY_DICT

from cdc_devtools.cow import cow_merge
from cdc_devtools.inline_pipeline import SINK, SOURCE, InlinePipeline
from cdc_devtools.inline_run import InlineRun
from cdc_devtools.oracle import row_key
from cdc_devtools.replay import assert_replay, changes_of
from iceberg_cdc import errors
from iceberg_cdc.sink.table import read_watermark
from tests.cases import TABLE_CASES, arrow_rows, iceberg_schema, load, split_change
from tests.support.iceberg_tables import cow_rewrite, live_files, replace_files, write_data_files

SNAPSHOT_OPS = ("append", "fast_append", "overwrite", "merge", "delete", "replace", "rewrite_manifests")


# -- the snapshots pyiceberg cannot make by itself ---------------------------------------------------


class _RewriteManifests(_FastAppendFiles):
    """Java's ``RewriteManifests``: every live data file re-listed, as EXISTING, in one new manifest per spec.

    The snapshot adds and removes no file; its operation is ``replace``. pyiceberg's summary update
    rejects ``replace``, so the summary is built as for an append and relabelled.
    """

    def _existing_manifests(self) -> list[ManifestFile]:
        return []

    def _deleted_entries(self) -> list[ManifestEntry]:
        return []

    def _manifests(self) -> list[ManifestFile]:
        metadata = self._transaction.table_metadata
        parent = metadata.snapshot_by_id(self._parent_snapshot_id) if self._parent_snapshot_id else None
        assert parent is not None, "rewrite_manifests needs a snapshot to rewrite"
        entries: dict[int, list[ManifestEntry]] = defaultdict(list)
        kept: list[ManifestFile] = []
        for manifest in parent.manifests(self._io):
            if manifest.content != ManifestContent.DATA:
                kept.append(manifest)
                continue
            live = manifest.fetch_manifest_entry(self._io, discard_deleted=True)
            entries[manifest.partition_spec_id].extend(live)
        rewritten = []
        for spec_id, spec_entries in entries.items():
            with self.new_manifest_writer(self.spec(spec_id)) as writer:
                for entry in spec_entries:
                    writer.add_entry(
                        ManifestEntry.from_args(
                            status=ManifestEntryStatus.EXISTING,
                            snapshot_id=entry.snapshot_id,
                            sequence_number=entry.sequence_number,
                            file_sequence_number=entry.file_sequence_number,
                            data_file=entry.data_file,
                        )
                    )
            rewritten.append(writer.to_manifest_file())
        return rewritten + kept

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        self._operation = Operation.APPEND
        try:
            summary = super()._summary(snapshot_properties)
        finally:
            self._operation = Operation.REPLACE
        return Summary(Operation.REPLACE, **summary.additional_properties)


def rewrite_manifests(table: Table) -> None:
    with (
        table.transaction() as tx,
        _RewriteManifests(operation=Operation.REPLACE, transaction=tx, io=table.io),
    ):
        pass


def fast_append(table: Table, rows: pa.Table) -> None:
    """A fast append even where table.append would merge manifests."""
    files = write_data_files(table, rows)
    with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
        for data_file in files:
            append.append_data_file(data_file)


def insert_overwrite(table: Table, rows: pa.Table, partition_by: list[str]) -> None:
    """Spark's INSERT OVERWRITE in dynamic mode, as one copy-on-write snapshot.

    Every file of a partition that the new rows touch is removed (every file, when the table is
    unpartitioned); the new rows are added.
    """
    touched = set(zip(*(rows.column(name).to_pylist() for name in partition_by), strict=True))
    remove = [
        f
        for f in live_files(table)
        if not partition_by or tuple(f.partition[i] for i in range(len(partition_by))) in touched
    ]
    cow_rewrite(table, remove, rows)


# -- one case --------------------------------------------------------------------------------------


@dataclass
class Expectation:
    """What one snapshot must look like in one sink."""

    step: str
    rows: list[list[Any]] | None = None  # change rows; None (no rows) with skip / absent
    absent: bool = False
    action: str | None = None

    @classmethod
    def of(cls, step: str, value: Any, action: str | None = None) -> Expectation:
        if value == "skip":
            return cls(step, action=action or "skip")
        if value == "absent":
            return cls(step, absent=True)
        assert isinstance(value, list), f"step {step}: expect rows, 'skip' or 'absent', not {value!r}"
        return cls(step, rows=value, action=action)


@dataclass
class SinkState:
    """One sink of the source: its pipeline and what it has processed so far."""

    pipeline: InlinePipeline
    name: str
    ordinals: list[int] = field(default_factory=list)
    processed: set[int] = field(default_factory=set)

    @property
    def table(self) -> Table:
        return self.pipeline.catalog.load_table(self.name)


class CaseRunner:
    """Applies a case's steps to a real table and checks each processed snapshot against the case."""

    def __init__(self, case: dict[str, Any], tmp_path: Path) -> None:
        self.case = case
        self.tmp_path = tmp_path
        self.schema = iceberg_schema(case["columns"], case.get("identifier_fields"))
        self.arrow_schema = self.schema.as_arrow()
        self.partition_by: list[str] = list(case.get("partition_by") or [])
        self.snapshots: dict[str, int] = {}
        self.checked: set[str] = set()
        self.sinks: dict[str, SinkState] = {}
        main = self.sink(SINK, case.get("table_config"))
        spec = PartitionSpec(
            *(
                PartitionField(self.schema.find_field(name).field_id, 1000 + i, IdentityTransform(), name)
                for i, name in enumerate(self.partition_by)
            )
        )
        main.pipeline.create_source(self.schema, partition_spec=spec, properties=case.get("properties") or {})

    # -- sinks ---------------------------------------------------------------------------------

    def sink(self, name: str, table_config: dict[str, Any] | None) -> SinkState:
        if name not in self.sinks:
            pipeline = InlinePipeline(self.tmp_path, table={**(table_config or {}), "sink": name})
            self.sinks[name] = SinkState(pipeline, name)
        return self.sinks[name]

    @property
    def source(self) -> Table:
        return self.sinks[SINK].pipeline.source

    def identifier_columns(self, state: SinkState) -> list[str] | None:
        configured = state.pipeline.config.tables[0].identifier_columns
        return configured or sorted(self.schema.identifier_field_names()) or None

    # -- steps ---------------------------------------------------------------------------------

    def run(self) -> None:
        steps = self.case["steps"]
        each_step = self.case.get("process_each_step", False)
        for step in steps:
            if step["op"] == "process":
                self.process(step)
            elif step["op"] in SNAPSHOT_OPS:
                self.make_snapshot(step)
                if each_step:
                    self.process({"op": "process"})
            else:
                self.move_branch(step)
        if not any(step["op"] == "process" for step in steps) and not each_step:
            self.process({"op": "process"})  # one DAG run per snapshot, oldest first
        expected = {s["name"] for s in steps if "name" in s and "expect" in s}
        assert expected <= self.checked, f"expectations never checked: {sorted(expected - self.checked)}"

    def make_snapshot(self, step: dict[str, Any]) -> None:
        table = self.source
        before = {s.snapshot_id for s in table.snapshots()}
        self.apply(table, step)
        table = self.source
        new = [s for s in table.snapshots() if s.snapshot_id not in before]
        assert len(new) == 1, f"step {step['name']} ({step['op']}) made {len(new)} snapshots, not one"
        snapshot = new[0]
        current = table.current_snapshot()
        assert current is not None and current.snapshot_id == snapshot.snapshot_id
        self.snapshots[step["name"]] = snapshot.snapshot_id
        if "operation" in step:
            assert snapshot.summary is not None and snapshot.summary.operation.value == step["operation"]
        if "manifests" in step:
            self.check_manifests(table, snapshot.snapshot_id, step["manifests"])

    def rows(self, values: list[list[Any]]) -> pa.Table:
        return arrow_rows(self.arrow_schema, values)

    def apply(self, table: Table, step: dict[str, Any]) -> None:
        op = step["op"]
        if op == "append":
            table.append(self.rows(step["rows"]))
        elif op == "fast_append":
            fast_append(table, self.rows(step["rows"]))
        elif op == "overwrite":
            insert_overwrite(table, self.rows(step["rows"]), self.partition_by)
        elif op == "merge":
            upserts = self.rows(step["upserts"]) if "upserts" in step else None
            cow_merge(table, upserts=upserts, delete_keys=step.get("delete_keys"), key=step["key"])
        elif op == "delete":
            table.delete(step["where"])
        elif op == "replace":
            replace_files(table, live_files(table), table.scan().to_arrow())
        elif op == "rewrite_manifests":
            rewrite_manifests(table)
        else:
            raise AssertionError(f"unknown op {op!r}")

    def move_branch(self, step: dict[str, Any]) -> None:
        snapshot_id = self.snapshots[step["step"]]
        table = self.source
        if step["op"] == "rollback_to":
            table.manage_snapshots().rollback_to_snapshot(snapshot_id).commit()
        elif step["op"] == "set_current":
            table.manage_snapshots().set_current_snapshot(snapshot_id).commit()
        else:
            raise AssertionError(f"unknown op {step['op']!r}")
        current = self.source.current_snapshot()
        assert current is not None and current.snapshot_id == snapshot_id

    @staticmethod
    def check_manifests(table: Table, snapshot_id: int, facts: dict[str, int]) -> None:
        """Setup facts: how many data manifests the snapshot lists, how many EXISTING entries it wrote."""
        snapshot = table.snapshot_by_id(snapshot_id)
        assert snapshot is not None
        manifests = [m for m in snapshot.manifests(table.io) if m.content == ManifestContent.DATA]
        own = [m for m in manifests if m.added_snapshot_id == snapshot_id]
        existing = sum(
            e.status == ManifestEntryStatus.EXISTING
            for m in own
            for e in m.fetch_manifest_entry(table.io, discard_deleted=False)
        )
        assert {"data": len(manifests), "existing": existing} == facts, (
            "setup: the manifests are not as described"
        )

    # -- processing ----------------------------------------------------------------------------

    def process(self, step: dict[str, Any]) -> None:
        state = self.sink(step.get("sink", SINK), step.get("table_config"))
        runs: list[InlineRun] = []
        watermark_before = self.watermark(state)
        error = getattr(errors, step["error"]) if "error" in step else None
        if error is None:
            runs = self.catch_up(state)
        else:
            with pytest.raises(error):
                self.catch_up(state, runs)
        for run in runs:
            self.check_run(state, run)
        expectations = [Expectation.of(name, value) for name, value in (step.get("expect") or {}).items()]
        by_id = {self.snapshots[name]: name for name in self.snapshots}
        for run in runs:
            name = by_id.get(run.snapshot_id)
            assert name is not None, f"processed snapshot {run.snapshot_id} was made by no step"
            if "expect" not in step and (step_doc := self.step_doc(name)).get("expect") is not None:
                expectations.append(Expectation.of(name, step_doc["expect"], step_doc.get("action")))
        unchecked = {run.snapshot_id for run in runs} - {self.snapshots[e.step] for e in expectations}
        assert not unchecked, f"processed snapshots {unchecked} have no expected changes in the case"
        for expectation in expectations:
            self.check(state, expectation, runs)
        if error is None:
            current = self.source.current_snapshot()
            assert current is not None and self.watermark(state) == current.snapshot_id, "not caught up"
        else:  # the failed snapshot committed nothing: the watermark is where the last good run left it
            last_good = runs[-1].snapshot_id if runs else watermark_before
            assert self.watermark(state) == last_good, "a failed run moved the watermark"

    def catch_up(self, state: SinkState, runs: list[InlineRun] | None = None) -> list[InlineRun]:
        """Run snapshots one by one until caught up, keeping the runs done before any failure."""
        runs = [] if runs is None else runs
        for _ in range(100):
            run = state.pipeline.run()
            if run.action == "caught_up":
                return runs
            runs.append(run)
        raise AssertionError("still not caught up after 100 runs")

    @staticmethod
    def watermark(state: SinkState) -> int | None:
        if not state.pipeline.catalog.table_exists(state.name):
            return None
        mark = read_watermark(state.table, SOURCE)
        return mark.snapshot_id if mark else None

    def step_doc(self, name: str) -> dict[str, Any]:
        return next(s for s in self.case["steps"] if s.get("name") == name)

    def check_run(self, state: SinkState, run: InlineRun) -> None:
        """Every processed snapshot: ordinals increase, each snapshot once, the replay invariant holds."""
        snapshot_id = run.snapshot_id
        assert snapshot_id is not None
        assert snapshot_id not in state.processed, f"snapshot {snapshot_id} processed twice"
        state.processed.add(snapshot_id)
        ordinal = run.detected.ordinal
        assert not state.ordinals or ordinal > state.ordinals[-1], "ordinals must increase along the history"
        state.ordinals.append(ordinal)
        sink = state.table
        rows = changes_of(sink, snapshot_id)
        assert set(rows.column("_change_ordinal").to_pylist()) <= {ordinal}
        # emit_unpaired gives up the per-key rules on purpose (a duplicated key is DELETEd and INSERTed);
        # the row-level invariant still holds.
        unpaired = state.pipeline.config.tables[0].duplicate_keys == "emit_unpaired"
        bridge = (
            run.detected.bridge
        )  # a bridge over a gap starts from the watermark's state, not the parent's
        assert_replay(
            self.source,
            sink,
            snapshot_id,
            None if unpaired else self.identifier_columns(state),
            base_snapshot_id=int(bridge["from"]) if bridge else None,
        )
        if "sink_columns" in self.case:
            assert sink.schema().column_names == self.case["sink_columns"]

    def check(self, state: SinkState, expectation: Expectation, runs: list[InlineRun]) -> None:
        name = expectation.step
        snapshot_id = self.snapshots[name]
        run = next((r for r in runs if r.snapshot_id == snapshot_id), None)
        rows = (
            changes_of(state.table, snapshot_id) if state.pipeline.catalog.table_exists(state.name) else None
        )
        if expectation.absent:
            assert run is None and snapshot_id not in state.processed, f"{name} must never be processed"
            assert rows is None or rows.num_rows == 0, f"{name}: a snapshot off the history reached the sink"
            self.checked.add(name)
            return
        assert run is not None, f"{name} was not processed in this run of the pipeline"
        if expectation.action:
            assert run.action == expectation.action, f"{name}: DAG run took the {run.action} path"
        assert rows is not None
        assert self.changes(rows) == self.expected(expectation.rows or []), f"{name}: change rows differ"
        self.checked.add(name)

    def names(self) -> list[str]:
        return [c["name"] for c in self.case["columns"]]

    def changes(self, rows: pa.Table) -> Counter:
        names = self.names()
        return Counter((row_key(r, names), r["_change_type"]) for r in rows.to_pylist())

    def expected(self, rows: list[list[Any]]) -> Counter:
        split = [split_change(row) for row in rows]
        values = self.rows([v for v, _ in split]).to_pylist()
        return Counter((row_key(v, self.names()), kind) for v, (_, kind) in zip(values, split, strict=True))


CASES = load(TABLE_CASES)


def test_the_table_cases_cover_the_iceberg_tests():
    names = [case["name"] for case in CASES]
    assert len(names) == len(set(names))
    ported = {f"{s['class']}.{s['method']}" for case in CASES for s in case.get("iceberg") or []}
    for method in (
        "TestChangelogTable.testOverwrites",
        "TestChangelogTable.testMetadataDeletes",
        "TestChangelogTable.testDataFilters",
        "TestChangelogTable.testExistingEntriesInNewDataManifestsAreIgnored",
        "TestChangelogTable.testManifestRewritesAreIgnored",
        "TestChangelogTable.testQueryWithRollback",
        "TestCreateChangelogViewProcedure.testNoSnapshotIdInput",
        "TestCreateChangelogViewProcedure.testNonStandardColumnNames",
        "TestCreateChangelogViewProcedure.testUpdate",
        "TestCreateChangelogViewProcedure.testUpdateWithIdentifierField",
        "TestCreateChangelogViewProcedure.testUpdateWithMultipleIdentifierColumns",
        "TestCreateChangelogViewProcedure.testRemoveCarryOvers",
        "TestCreateChangelogViewProcedure.testRemoveCarryOversWithoutUpdatedRows",
    ):
        assert method in ported, f"{method} is not ported"
    for case in CASES:
        assert case.get("iceberg") or case.get("design"), f"{case['name']}: say where it comes from"


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_table_case(case: dict[str, Any], tmp_path: Path):
    CaseRunner(case, tmp_path).run()

"""Carryover cancelled in the write tasks: every way of cancelling gives the same, exact changes.

Copy-on-write histories with partition moves, updates that change nothing,
deletes and inserts, on identifier and whole-row tables with duplicate rows
(a dedup rewrite removes k copies of a row and adds one back: carryover by
multiplicity), run through the pipeline in process once per cancel mode
(:data:`~cdc_devtools.inline_pipeline.CANCEL_CONFIG`). Every snapshot must
satisfy the replay invariant, rows must add up (input = masked + cancelled +
shuffled), and every mode must commit the same changes.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from cdc_devtools.inline_pipeline import CANCEL_CONFIG, CANCEL_MODES, InlinePipeline
from cdc_devtools.oracle import row_key
from cdc_devtools.replay import assert_replay, changes_of
from iceberg_cdc.changelog import carryover
from iceberg_cdc.pipeline import map_cancel
from tests.support.history import HistoryShape, HistoryTable

SHAPES = {
    "with-ids": HistoryShape(
        columns=("string", "double", "struct"), identifier=("id",), partitioning="region"
    ),
    "whole-row": HistoryShape(columns=("string", "double"), identifier=(), partitioning="region"),
    "whole-row-unpartitioned": HistoryShape(columns=("long",), identifier=(), partitioning="none"),
    "bucketed-key-with-region": HistoryShape(
        columns=("list",), identifier=("id", "region"), partitioning="bucket"
    ),
}


def build_history(tmp_path: Path, shape: HistoryShape) -> tuple[InlinePipeline, HistoryTable]:
    """One source table and its history; every mode's pipeline reads this same table."""
    base = InlinePipeline(tmp_path / "source")
    table = base.create_source(shape.schema(), partition_spec=shape.spec())
    history = HistoryTable(table, shape)
    history.append(random.Random(1), 40)
    history.append(random.Random(2), 5, duplicates=6)
    history.append(random.Random(3), 5, duplicates=6)
    history.merge(random.Random(4), update=0.2, move=0.3, noop=0.3, delete=0.1, inserts=3, reinserts=0)
    history.dedupe(random.Random(5))
    history.noop_rewrite(random.Random(6))
    history.dedupe(random.Random(7))
    history.merge(random.Random(8), update=0.5, move=0.5, noop=0.5, delete=0.2, inserts=2, reinserts=2)
    return base, history


def run_mode(
    tmp_path: Path, base: InlinePipeline, history: HistoryTable, mode: str
) -> tuple[list[Counter], Counter]:
    """The whole history through a pipeline cancelling carryover as ``mode`` says, into its own sink."""
    catalog = {key: base.raw["catalog"][key] for key in ("uri", "warehouse")}
    sink = f"shop.changes_{CANCEL_MODES.index(mode)}"
    pipeline = InlinePipeline(
        tmp_path / mode.replace(" ", "-"),
        shuffle={"partitions": 3, "target_partition_size": "2KB", **CANCEL_CONFIG[mode]},
        table={"sink": sink},
        catalog=catalog,
    )
    table = history.table
    identifier = list(history.shape.identifier) or None
    figures: Counter = Counter()
    changes = []
    for run in pipeline.catch_up():
        if run.action == "skip":
            continue
        sink_table = pipeline.catalog.load_table(sink)
        assert_replay(table, sink_table, run.snapshot_id, identifier)
        rows = run.committed["conservation"]
        if run.action == "shuffle":
            assert rows["input_rows"] == rows["masked_rows"] + rows["cancelled_rows"] + rows["shuffled_rows"]
            assert rows["shuffled_rows"] == rows["read_rows"] == rows["carryover_rows"] + rows["change_rows"]
        figures["cancelled"] += rows["cancelled_rows"]
        figures["spilled"] += sum(u.get("cancel_spilled_groups", 0) for u in run.units.get("write", []))
        names = table.schema().as_arrow().names
        committed = changes_of(sink_table, run.snapshot_id).to_pylist()
        changes.append(Counter((row_key(r, names), r["_change_type"]) for r in committed))
    return changes, figures


@pytest.mark.parametrize("shape", list(SHAPES), ids=list(SHAPES))
def test_every_cancel_mode_gives_the_same_exact_changes(tmp_path: Path, shape: str):
    base, history = build_history(tmp_path, SHAPES[shape])
    results = {mode: run_mode(tmp_path, base, history, mode) for mode in CANCEL_MODES}
    reference, _ = results["off"]
    assert len(reference) == len(history.table.snapshots()), "every snapshot was processed"
    for mode, (changes, _) in results.items():
        assert changes == reference, f"{mode}: other changes than with every row shuffled"
    assert results["off"][1]["cancelled"] == 0
    assert results["in memory"][1]["cancelled"] > 0
    assert results["spilled"][1]["spilled"] > 0


def _one_pair_too_many(original):
    """A mutant of the cancellation: besides the true carryover, one more DELETE and one more INSERT go."""

    def mutant(data, inserts, identifier_columns=None, lineage=None):
        result = original(data, inserts, identifier_columns, lineage)
        kept = result.kept
        flags = np.asarray(inserts, dtype=bool)[kept]
        if flags.any() and not flags.all():
            gone = [np.flatnonzero(~flags)[0], np.flatnonzero(flags)[0]]
            kept = np.delete(kept, gone)
            return carryover.Cancellation(kept, result.by_lineage, result.by_value + 2)
        return result

    return mutant


@pytest.mark.parametrize("shape", ["with-ids", "whole-row"])
def test_cancelling_one_copy_too_many_is_caught(tmp_path: Path, shape: str, monkeypatch):
    """The checks above are not vacuous: a cancellation that drops one real change fails them."""
    base, history = build_history(tmp_path, SHAPES[shape])
    monkeypatch.setattr(map_cancel, "cancel_carryover", _one_pair_too_many(map_cancel.cancel_carryover))
    with pytest.raises(AssertionError, match=r"replay differs: missing \d+ rows"):
        run_mode(tmp_path, base, history, "in memory")

"""``make sync SNAPSHOTS=N``: at most N DAG runs per table, exit 0, and how many snapshots are left.

The sink's watermark and the pending count are real (an in-process pipeline,
SQLite catalog); only ``airflow dags test`` is replaced, by the same steps run
in process (:meth:`InlinePipeline.run`), so the sync's own loop decides when
to stop.
"""

from __future__ import annotations

import pytest

from cdc_devtools import sync as sync_module
from cdc_devtools.inline_pipeline import SOURCE, InlinePipeline
from cdc_devtools.orders import SCHEMA, rows


def test_sync_stops_each_table_after_n_runs_and_says_how_many_are_left(tmp_path, monkeypatch, capsys):
    pipeline = InlinePipeline(tmp_path)
    pipeline.create_source(SCHEMA)
    for start in range(0, 40, 10):  # four snapshots
        pipeline.source.append(rows(range(start, start + 10)))
    runs = []

    def dags_test(env, dag_id, conf, log_file) -> int:
        runs.append(dag_id)
        pipeline.run()
        return 0

    monkeypatch.setattr(sync_module, "dags_test", dags_test)
    table = pipeline.config.tables[0]
    assert sync_module.sync_table(pipeline.config, table, {}, tmp_path, limit=3)
    assert runs == [table.dag_id] * 3
    out = capsys.readouterr().out
    assert f"{SOURCE}: stopped after 3 run(s) as asked (--snapshots 3); 1 snapshot(s) still pending" in out

    assert sync_module.sync_table(pipeline.config, table, {}, tmp_path, limit=3)  # the rest, then caught up
    assert len(runs) == 4
    assert f"{SOURCE}: caught up" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_snapshots_must_be_a_whole_number_from_1(value, capsys):
    with pytest.raises(SystemExit) as exited:
        sync_module.main(["--config", "cdc.yaml", "--snapshots", value])
    assert exited.value.code == 2
    assert "give a whole number of snapshots, 1 or more" in capsys.readouterr().err

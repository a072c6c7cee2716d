"""OpenLineage end to end: ``airflow dags test`` with the provider's file transport, events read back.

A real DAG run (spark-submit, moto S3, a SQLite catalog) with the Airflow
OpenLineage provider configured to write every event to files. Its events
must say: ``detect`` read the source at the snapshot the run processed;
``commit`` read the same and wrote the changelog at the sink snapshot that
holds it, with the rows written. An idle run (nothing pending) reports no
datasets at all.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdc_devtools.orders import SCHEMA, rows
from iceberg_cdc.lineage import location_name
from iceberg_cdc.sink.table import find_commit
from tests.support.airflow_pipeline import DAG_ID, SINK, SOURCE, AirflowPipeline

pytestmark = [pytest.mark.s3, pytest.mark.e2e]


def events(directory: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(directory.glob("event-*.json"))]


def complete(found: list[dict], task_id: str) -> list[dict]:
    return [
        e
        for e in found
        if e.get("eventType") == "COMPLETE" and e.get("job", {}).get("name") == f"{DAG_ID}.{task_id}"
    ]


def test_detect_and_commit_report_source_and_changelog_with_versions(moto_server, tmp_path):
    pipeline = AirflowPipeline(tmp_path, moto_server, SCHEMA)
    out = tmp_path / "lineage"
    out.mkdir()
    env = {
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(out / "event")}),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "cdc-tests",
    }
    pipeline.source.append(rows(range(10)))
    snapshot_id = pipeline.source.current_snapshot().snapshot_id
    assert pipeline.run(env_overrides=env) == 0, pipeline.log_tail()

    found = events(out)
    sink = pipeline.sink()
    sink_snapshot = find_commit(sink, SOURCE, snapshot_id)
    assert sink_snapshot is not None
    source_ns, source_name = location_name(pipeline.source.location())
    sink_ns, sink_name = location_name(sink.location())

    (detect,) = complete(found, "detect")
    (read,) = detect["inputs"]
    assert (read["namespace"], read["name"]) == (source_ns, source_name)
    assert read["facets"]["version"]["datasetVersion"] == str(snapshot_id)
    assert detect["outputs"] == []

    (commit,) = complete(found, "commit")
    (read,) = commit["inputs"]
    assert (read["namespace"], read["name"]) == (source_ns, source_name)
    assert read["facets"]["version"]["datasetVersion"] == str(snapshot_id)
    assert read["facets"]["symlinks"]["identifiers"] == [
        {"namespace": pipeline.config["catalog"]["warehouse"].rstrip("/"), "name": SOURCE, "type": "TABLE"}
    ]
    (written,) = commit["outputs"]
    assert (written["namespace"], written["name"]) == (sink_ns, sink_name)
    assert written["facets"]["version"]["datasetVersion"] == str(sink_snapshot.snapshot_id)
    assert written["facets"]["symlinks"]["identifiers"][0]["name"] == SINK
    assert written["facets"]["catalog"]["framework"] == "iceberg"
    assert written["outputFacets"]["outputStatistics"]["rowCount"] == 10
    assert commit["run"]["facets"]["parent"]["job"]["name"] == DAG_ID

    # Nothing pending: the run reads and writes nothing, and says so.
    for stale in out.iterdir():
        stale.unlink()
    assert pipeline.run(env_overrides=env) == 0, pipeline.log_tail()
    (idle,) = complete(events(out), "commit")
    assert idle["inputs"] == [] and idle["outputs"] == []

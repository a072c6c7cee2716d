"""What a DAG file parse costs must not grow per table: Params checked once, no task-only imports, no N^2.

The DAG processor parses a DAG file in a new process each time, so the
check runs the DAG file's work in a fresh interpreter, as the processor does
it: build every DAG of a config (``dags_from_config``), then serialize each
(``DagSerialization.to_dict``), counting the JSON-schema checks of Params and
listing the modules it imported. ``bench/tables.py`` measures the seconds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from iceberg_cdc.airflow.dags import dags_from_config, part_of
from iceberg_cdc.config import ConfigError

REPO = Path(__file__).resolve().parents[2]

# Modules only a running task needs: the run's and the mirror's steps, the data libraries, object stores.
TASK_ONLY = (
    "pyarrow",
    "pyiceberg",
    "pandas",
    "boto3",
    "lz4",
    "psycopg",
    "iceberg_cdc.run.steps",
    "iceberg_cdc.run.lease",
    "iceberg_cdc.source",
    "iceberg_cdc.sink",
    "iceberg_cdc.shuffle",
    "iceberg_cdc.mirror",
    "iceberg_cdc.coordination",
    "iceberg_cdc.pipeline.runtime",
)

PARSE = """
import json, sys
import airflow.sdk  # what the DAG processor has imported before it forks a parse
import jsonschema
from airflow.serialization.serialized_objects import DagSerialization

checks = []
validate = jsonschema.validate
def counting(instance, schema, *args, **kwargs):
    checks.append(schema.get("title"))
    return validate(instance, schema, *args, **kwargs)
jsonschema.validate = counting  # what Param.resolve calls, once per check

import importlib
from airflow.utils.file import iter_airflow_imports
for module in iter_airflow_imports(sys.argv[1]):  # the processor pre-imports the DAG file's airflow.* imports
    importlib.import_module(module)

before = set(sys.modules)
from iceberg_cdc.airflow.dags import dags_from_config
out = {}
for path in sys.argv[2:]:  # one DAG file's parse after another's, in one process
    dags = dags_from_config(path)
    sizes = {dag_id: len(json.dumps(DagSerialization.to_dict(dag), default=str)) for dag_id, dag in dags.items()}
    out[path] = {"checks": list(checks), "sizes": sizes,
                 "task_params": {t.task_id: len(t.params) for t in dags["cdc__ns__t0"].tasks}}
out["imported"] = sorted(set(sys.modules) - before)
out["dag_params"] = {k: dags["cdc__ns__t0"].params[k] for k in dags["cdc__ns__t0"].params}
print(json.dumps(out))
"""


def _config(path: Path, tables: int, freshness_slo: float | None = None, **table: object) -> str:
    raw = {
        "catalog": {"name": "t", "type": "sql", "uri": f"sqlite:///{path / 'never-opened.db'}"},
        "shuffle": {"uri": "s3://shuffle/cdc"},
        "tables": [{"source": f"ns.t{i}", "sink": f"ns.t{i}_changes", **table} for i in range(tables)],
    }
    if freshness_slo is not None:
        raw["tables"][0]["freshness_slo"] = freshness_slo
    file = path / f"cdc-{tables:04d}.yaml"  # names of one length: sizes compare
    file.write_text(yaml.safe_dump(raw))
    return str(file)


def _parse(*config_paths: str) -> dict:
    env = {"PYTHONPATH": f"{REPO / 'plugins'}:{REPO}", "CDC_CONFIG": config_paths[0], "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", PARSE, str(REPO / "dags" / "cdc_dags.py"), *config_paths],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def parsed(tmp_path_factory) -> tuple[dict, dict, dict]:
    path = tmp_path_factory.mktemp("parse")
    few, many = _config(path, 2), _config(path, 30)
    out = _parse(few, many)
    return out[few], out[many], out


def test_params_are_checked_once_per_dag_file_not_per_table_or_task(parsed):
    few, many, out = parsed
    # Each of the three Params' schemas once per process (the check Airflow would make per DAG, made once
    # per DAG file parse), however many tables and tasks; Airflow made ~80 such checks per DAG when every
    # task copied them. 2 tables built and serialized, then 30 more: still the first three checks.
    assert sorted(few["checks"]) == ["snapshot_id", "through_snapshot_id", "trigger_next"]
    assert many["checks"] == few["checks"]
    # No task carries a copy: a task reads the DAG's Params at run time (dag, then task, then conf).
    assert set(many["task_params"].values()) == {0}
    assert out["dag_params"] == {"snapshot_id": None, "trigger_next": "auto", "through_snapshot_id": None}


def test_a_dag_file_parse_imports_no_task_only_module(parsed):
    loaded = [m for m in parsed[2]["imported"] if any(m == t or m.startswith(t + ".") for t in TASK_ONLY)]
    assert loaded == []


def test_the_dag_file_names_its_operators_modules_for_the_processor_to_pre_import(parsed):
    """dags/cdc_dags.py imports the operators' provider modules: imported once, not at every parse."""
    providers = ("airflow.providers.apache.spark", "airflow.providers.standard.operators.trigger_dagrun")
    assert [m for m in parsed[2]["imported"] if m.startswith(providers)] == []


def test_a_tables_dag_does_not_grow_with_the_number_of_tables(parsed):
    """The event trigger's kwargs hold a digest of the watched tables, not the list (N^2 for N tables)."""
    few, many, _ = parsed
    assert many["sizes"]["cdc__ns__t0"] == few["sizes"]["cdc__ns__t0"]


def test_parts_split_the_tables_over_dag_files(tmp_path):
    path = _config(tmp_path, 12, freshness_slo=600)
    everything = dags_from_config(path)
    parts = [dags_from_config(path, part=i, parts=3) for i in range(3)]
    ids = [set(p) for p in parts]
    assert set().union(*ids) == set(everything)  # the same DAG ids, each in exactly one file
    assert sum(len(i) for i in ids) == len(everything)
    assert all(part_of(dag_id, 3) == i for i, found in enumerate(ids) for dag_id in found)
    assert all(found for found in ids)  # 12 tables hash to every one of 3 parts
    assert "cdc_freshness" in ids[0]
    with pytest.raises(ConfigError, match="part must be 0 to parts - 1"):
        dags_from_config(path, part=3, parts=3)


def test_a_dags_assets_are_hashed_once_however_many_dependencies_it_sets(tmp_path, monkeypatch):
    """Airflow hashes the DAG (its schedule's asset with it) at every dependency set: the asset's hash is kept."""
    from airflow.sdk import Asset

    hashed: list[str] = []
    plain_hash = Asset.__hash__
    monkeypatch.setattr(Asset, "__hash__", lambda self: hashed.append(self.name) or plain_hash(self))
    # Commits only, no clock: the schedule is the source asset itself (with a clock, Airflow hashes its repr).
    dag = dags_from_config(_config(tmp_path, 1, schedule=None))["cdc__ns__t0"]
    assert [a.name for a in dag.schedule] == ["cdc-source:ns.t0"]  # events on: the source asset
    assert len(dag.task_dict) > 10
    assert "cdc-source:ns.t0" in hashed
    assert all(hashed.count(name) == 1 for name in hashed), hashed


def test_a_hash_once_asset_is_an_asset_to_airflow(tmp_path):
    """Equal to, hashed as and serialized as the plain Asset it stands for, copies included."""
    import copy

    from airflow.sdk import Asset, AssetWatcher
    from airflow.serialization.serialized_objects import BaseSerialization

    from iceberg_cdc.airflow.assets import HashOnceAsset
    from iceberg_cdc.airflow.events import watcher_trigger
    from iceberg_cdc.config import load_config

    path = _config(tmp_path, 1)
    config = load_config(path)
    fields = {"name": "cdc-source:ns.t0", "uri": "iceberg://t/ns/t0", "group": "cdc"}

    def watchers() -> list[AssetWatcher]:
        return [AssetWatcher(name="w", trigger=watcher_trigger(config, config.tables[0], path))]

    once, plain = HashOnceAsset(**fields, watchers=watchers()), Asset(**fields, watchers=watchers())
    assert once == plain and plain == once and hash(once) == hash(plain) == hash(once)
    assert BaseSerialization.serialize(once) == BaseSerialization.serialize(plain)
    for twin in (copy.copy(once), copy.deepcopy(once)):
        assert twin == plain and hash(twin) == hash(plain)
    assert HashOnceAsset(**{**fields, "name": "other"}, watchers=watchers()) != plain


@pytest.mark.parametrize(
    ("tables", "capacity", "enough", "triggerers"),
    [
        (899, 1000, None, None),
        (900, 1000, 1001, 2),
        (1000, 1000, 1112, 2),
        (1800, 1000, 2001, 3),
        (9, 10, 11, 2),
    ],
)
def test_a_config_that_fills_a_triggerer_says_what_to_set(tmp_path, tables, capacity, enough, triggerers):
    from iceberg_cdc.airflow.events import capacity_warning
    from iceberg_cdc.config import load_config

    said = capacity_warning(load_config(_config(tmp_path, tables)), capacity)
    if enough is None:
        assert said is None
    else:
        assert said is not None and f"{tables} triggers" in said and f"at most {capacity}" in said
        assert (
            f"AIRFLOW__TRIGGERER__CAPACITY to at least {enough}" in said
            and f"run {triggerers} triggerers" in said
        )


def test_the_dag_file_warns_when_the_watchers_fill_the_triggerer(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("AIRFLOW__TRIGGERER__CAPACITY", "4")
    path = _config(tmp_path, 4)
    with caplog.at_level("WARNING", logger="iceberg_cdc"):
        dags_from_config(path, part=1, parts=2)
    assert not [r for r in caplog.records if "triggerer" in r.getMessage()]  # said once, by part 0
    with caplog.at_level("WARNING", logger="iceberg_cdc"):
        dags_from_config(path)
    assert [r for r in caplog.records if "AIRFLOW__TRIGGERER__CAPACITY to at least 5" in r.getMessage()]
    off = tmp_path / "off.yaml"
    off.write_text(Path(path).read_text() + "events: {enabled: false}\n")
    caplog.clear()
    with caplog.at_level("WARNING", logger="iceberg_cdc"):
        dags_from_config(str(off))
    assert not [r for r in caplog.records if "triggerer" in r.getMessage()]  # no watchers, nothing to say

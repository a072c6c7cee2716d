"""The adapter's version rules (iceberg_cdc.airflow.compat) against the Airflow and pyspark installed.

``make test`` runs these on the newest tested set, ``make test-compat`` on the
oldest (Airflow 3.1, pyspark 3.5): each end checks the rules against the real
package, not against the version table the module keeps.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import warnings

import pytest
from airflow.jobs import triggerer_job_runner
from packaging.version import Version

from iceberg_cdc.airflow import compat
from iceberg_cdc.airflow.triggers.catalog_snapshots import CatalogSnapshotTrigger
from iceberg_cdc.errors import UnsupportedDependencyError
from iceberg_cdc.pipeline.connect_sessions import require_connect_client


def test_the_feature_checks_match_the_installed_triggerer():
    """The triggerer of this Airflow shares streams / hands out a state store exactly when compat says so."""
    source = inspect.getsource(triggerer_job_runner)
    assert compat.has_shared_trigger_streams() == ("shared_stream_key" in source)
    assert compat.has_asset_state_store() == ("asset_state_store" in source)


def test_the_task_exceptions_are_the_ones_airflow_acts_on():
    """Airflow's task runner skips/fails/reschedules on these classes: compat must hand out the same ones."""
    import airflow.exceptions

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # newer Airflow warns that these moved to airflow.sdk.exceptions
        for name in (
            "AirflowException",
            "AirflowFailException",
            "AirflowNotFoundException",
            "AirflowRescheduleException",
            "AirflowSensorTimeout",
            "AirflowSkipException",
            "ParamValidationError",
        ):
            assert getattr(compat, name) is getattr(airflow.exceptions, name), name


def test_the_installed_airflow_is_in_the_supported_range():
    assert compat.OLDEST_SUPPORTED <= compat.AIRFLOW_VERSION < Version("3.4")


def test_the_stats_client_has_what_the_run_metrics_call():
    client = compat.stats_client()
    for method in ("incr", "gauge", "timing"):
        assert callable(getattr(client, method)), method


@pytest.mark.parametrize(("version", "degraded"), [("3.1.8", True), ("3.3.2", False)])
def test_an_old_airflow_says_once_what_the_trigger_cannot_do(
    tmp_path, monkeypatch, caplog, version, degraded
):
    monkeypatch.setattr(compat, "AIRFLOW_VERSION", Version(version))
    monkeypatch.setattr(compat, "_noted", set())
    trigger = CatalogSnapshotTrigger(
        config_path=str(tmp_path / "cdc.yaml"), table="shop.orders", catalog_key="k", watched=["shop.orders"]
    )
    caplog.set_level(logging.WARNING, logger="iceberg_cdc")
    assert asyncio.run(trigger._state_store()) is None
    assert asyncio.run(trigger._state_store()) is None
    lines = [r.getMessage() for r in caplog.records if "asset state store" in r.getMessage()]
    if degraded:
        assert len(lines) == 1, lines  # once per process, not per poll
        assert "Airflow 3.1.8 has no asset state store" in lines[0] and ">= 3.3.0" in lines[0]
    else:
        assert lines == []


def test_spark_connect_needs_pyspark_4():
    with pytest.raises(UnsupportedDependencyError, match=r"pyspark 3\.5\.2 .*use spark\.mode: submit"):
        require_connect_client("3.5.2")
    require_connect_client("4.0.0")
    require_connect_client("4.2.0")

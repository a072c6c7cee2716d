"""SIGKILL of a real spark-submit phase: the table is blocked for one lease TTL, then repaired exactly.

detect runs in process; the write phase runs as the DAG runs it, through
``spark-submit`` (local[1], the package shipped with ``--py-files``). While it
works, its heartbeat renews the run's lease -- the test waits until it sees a
renewal, so the kill lands inside the Spark application -- then the whole
process group is killed with SIGKILL: no teardown, no cleanup, as when a
worker node dies. The next run is refused while the lease lives, takes over
when it expires, sweeps the dead run's objects and processes the snapshot
exactly once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from cdc_devtools.inline_pipeline import SOURCE, InlinePipeline
from cdc_devtools.orders import BY_REGION, SCHEMA, rows
from cdc_devtools.spark_cluster import SPARK_HOME
from iceberg_cdc.airflow.operators.spark import spark_application
from iceberg_cdc.errors import LeaseHeldError
from iceberg_cdc.pipeline.pyfiles import package_zip
from iceberg_cdc.pipeline.submit_conf import submit_conf
from iceberg_cdc.run import steps
from tests.integration.test_exactly_once import leftovers, merge
from tests.support.fault_runs import verdict

pytestmark = [pytest.mark.e2e]

TTL = 8.0


def _spark_submit(config_path: Path, detected: dict, log: Path) -> subprocess.Popen:
    args = detected.write_args[0]
    command = [str(SPARK_HOME / "bin" / "spark-submit"), "--master", "local[1]"]
    for key, value in submit_conf().items():
        command += ["--conf", f"{key}={value}"]
    command += ["--py-files", package_zip(), spark_application(), *args]
    env = {**os.environ, "CDC_CONFIG": str(config_path), "SPARK_HOME": str(SPARK_HOME)}
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(Path(__file__).parents[2] / "plugins"), env.get("PYTHONPATH")])
    )
    with log.open("w") as out:
        return subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def test_sigkill_of_a_spark_phase_blocks_one_ttl_then_repairs(tmp_path, monkeypatch):
    monkeypatch.setenv("CDC_LEASE_TTL_SECONDS", str(TTL))
    p = InlinePipeline(tmp_path)
    config_path = tmp_path / "cdc.yaml"
    config_path.write_text(yaml.safe_dump(p.raw))
    source = p.create_source(SCHEMA, partition_spec=BY_REGION)
    source.append(rows(range(60), region=["us", "eu", "apac"] * 20))
    p.catch_up()
    merge(p, 1)

    ctx = steps.Context.of(p.config, SOURCE)
    detected = steps.detect(ctx, "doomed-run")
    assert detected.action == "shuffle"
    lease = ctx.lease()
    first = lease.current()
    process = _spark_submit(config_path, detected, tmp_path / "spark.log")
    try:
        deadline = time.monotonic() + 120
        while lease.current().renewed_at == first.renewed_at:  # the driver's heartbeat is alive
            assert process.poll() is None, (tmp_path / "spark.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the Spark driver never renewed the lease"
            time.sleep(0.2)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    killed = time.monotonic()

    with pytest.raises(LeaseHeldError, match="doomed-run"):
        p.run()
    while True:
        try:
            p.catch_up()
            break
        except LeaseHeldError:
            assert time.monotonic() - killed < TTL + 10
            time.sleep(0.2)
    blocked = time.monotonic() - killed
    assert blocked <= TTL + 2
    result = verdict(p)
    assert result.exact, result
    assert leftovers(p) == ([], 0)

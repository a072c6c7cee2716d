"""make airflow: Airflow's UI on the demo table, to watch and trigger runs.

Starts a local S3 server, builds the demo table's history (as make demo does),
then runs ``airflow standalone`` (scheduler, API server, DAG processor and
triggerer in one process) on that config. Open http://localhost:8080 -- login
is disabled for this local instance (every user is admin). The DAG
``cdc__shop__orders`` starts paused: unpause it, or trigger it, and each run
processes the next snapshot; a run that leaves more pending starts the next
one at once. Ctrl-C stops Airflow and the S3 server (its data is in memory).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins"))

from demo import start_demo

from iceberg_cdc.devtools.airflow_env import VENV_BIN, airflow_env, ensure_airflow_db
from iceberg_cdc.local_s3 import LocalS3Server

WORK = Path(__file__).resolve().parents[1] / ".cdc" / "airflow-ui"


def main() -> int:
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    with LocalS3Server(log_path=WORK / "s3.log") as s3:
        config_path, _, _ = start_demo(s3, WORK)
        env = airflow_env(WORK / "airflow", config_path)
        env["CDC_SENSOR_MODE"] = "reschedule"
        env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"] = "True"
        port = env.setdefault("AIRFLOW__API__PORT", "8080")
        # Tasks reach Airflow through the execution API; it must follow the port.
        env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] = f"http://localhost:{port}/execution/"
        ensure_airflow_db(env)
        print(
            f"\nAirflow UI: http://localhost:{env['AIRFLOW__API__PORT']} (no login); Ctrl-C to stop\n",
            flush=True,
        )
        try:
            return subprocess.call([str(VENV_BIN / "airflow"), "standalone"], env=env)
        except KeyboardInterrupt:
            return 0


if __name__ == "__main__":
    sys.exit(main())

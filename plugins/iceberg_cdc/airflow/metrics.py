"""The pipeline's figures through Airflow's configured metrics backend (StatsD or OpenTelemetry).

What is emitted is :mod:`iceberg_cdc.run.metrics`; this module only hands it
Airflow's stats module, and keeps a broken backend from failing a run.
"""

from __future__ import annotations

import logging
from typing import Any

from iceberg_cdc.run.metrics import StatsBackend

log = logging.getLogger("iceberg_cdc")


def airflow_stats() -> StatsBackend:
    """Airflow's stats module (initialised by the task runner from ``[metrics]``)."""
    from iceberg_cdc.airflow.compat import stats_client

    return stats_client()  # type: ignore[no-any-return]


def emit_safely(function: Any, *args: Any) -> None:
    """Emit, but never fail a run over metrics: a broken backend is logged and ignored."""
    try:
        function(airflow_stats(), *args)
    except Exception as exc:
        log.warning("metrics not sent (%s: %s); the run is not affected", type(exc).__name__, exc)

"""Which Airflow this is, and what the adapter does on the old end of the supported range (3.1 .. 3.3).

The one module that knows Airflow versions: the rest of the adapter imports
Airflow names that moved from here, and asks here whether a feature exists,
so a version rule lives in one place (docs/operating.md, "Supported versions").

On Airflow 3.1 and 3.2 the adapter imports and runs; what those versions lack
degrades with one log line naming the feature and the Airflow that has it:

* shared trigger streams (3.3): each table's event trigger polls the catalog
  on its own instead of one poll per catalog;
* the asset state store (3.3): a triggerer restart fires one event for the
  current snapshot again (harmless: a run with nothing pending ends at once).

Names that moved: the task exceptions live in ``airflow.sdk.exceptions`` from
3.2 (``airflow.exceptions`` before); ``AssetOrTimeSchedule`` and
``CronTriggerTimetable`` in ``airflow.sdk`` from 3.2 (``airflow.timetables``
before); the stats client is ``airflow.sdk.observability.stats`` from 3.2
(``airflow.stats.Stats`` before).
"""

from __future__ import annotations

import logging
from typing import Any

import airflow
from packaging.version import Version

log = logging.getLogger("iceberg_cdc")

AIRFLOW_VERSION = Version(Version(airflow.__version__).base_version)
# The supported range, as requirements.txt declares it.
OLDEST_SUPPORTED = Version("3.1.8")
# Airflow where the triggerer shares one stream (shared_stream_key) and triggers get asset_state_store.
SHARED_TRIGGER_STREAMS_SINCE = Version("3.3.0")
ASSET_STATE_STORE_SINCE = Version("3.3.0")

try:  # Airflow >= 3.2
    from airflow.sdk.exceptions import (
        AirflowException,
        AirflowFailException,
        AirflowNotFoundException,
        AirflowRescheduleException,
        AirflowSensorTimeout,
        AirflowSkipException,
        ParamValidationError,
    )
except ImportError:  # Airflow 3.1: the same classes, in airflow.exceptions
    from airflow.exceptions import (  # type: ignore[no-redef]
        AirflowException,
        AirflowFailException,
        AirflowNotFoundException,
        AirflowRescheduleException,
        AirflowSensorTimeout,
        AirflowSkipException,
        ParamValidationError,
    )

try:  # Airflow >= 3.2
    from airflow.sdk import AssetOrTimeSchedule, CronTriggerTimetable
except ImportError:  # Airflow 3.1
    from airflow.timetables.assets import AssetOrTimeSchedule  # type: ignore[no-redef]
    from airflow.timetables.trigger import CronTriggerTimetable  # type: ignore[no-redef]

__all__ = [
    "AIRFLOW_VERSION",
    "AirflowException",
    "AirflowFailException",
    "AirflowNotFoundException",
    "AirflowRescheduleException",
    "AirflowSensorTimeout",
    "AirflowSkipException",
    "AssetOrTimeSchedule",
    "airflow_user",
    "CronTriggerTimetable",
    "ParamValidationError",
    "has_asset_state_store",
    "has_shared_trigger_streams",
    "note_degraded",
    "stats_client",
]

_noted: set[str] = set()


def stats_client() -> Any:
    """Airflow's stats client (``incr``/``gauge``/``timing``), initialised by Airflow from ``[metrics]``."""
    try:  # Airflow >= 3.2
        from airflow.sdk.observability import stats

        return stats
    except ImportError:  # Airflow 3.1
        from airflow.stats import Stats

        return Stats


async def airflow_user(request: Any, bearer: Any) -> Any:
    """The user ``get_user`` of Airflow's core API authenticates (``Authorization: Bearer``, else the UI cookie).

    Its unused OAuth2 parameter is ``oauth_token`` on 3.1 and 3.2, ``_oauth_token`` from 3.3;
    ``None`` there means the same on both: the bearer header, else the ``_token`` cookie.
    """
    import inspect

    from airflow.api_fastapi.core_api.security import get_user

    oauth = "_oauth_token" if "_oauth_token" in inspect.signature(get_user).parameters else "oauth_token"
    return await get_user(request=request, bearer_credentials=bearer, **{oauth: None})


def has_shared_trigger_streams() -> bool:
    """Whether the triggerer runs one ``open_shared_stream`` loop for triggers with the same key."""
    return AIRFLOW_VERSION >= SHARED_TRIGGER_STREAMS_SINCE


def has_asset_state_store() -> bool:
    """Whether event triggers get ``asset_state_store`` (a cursor that survives a triggerer restart)."""
    return AIRFLOW_VERSION >= ASSET_STATE_STORE_SINCE


def note_degraded(feature: str, since: Version, consequence: str) -> bool:
    """Log once per process that ``feature`` needs Airflow ``since`` and what happens instead here.

    Returns whether this call logged (the first for ``feature``).
    """
    if feature in _noted:
        return False
    _noted.add(feature)
    log.warning(
        "Airflow %s has no %s (Airflow >= %s): %s. Upgrade Airflow to %s or later to have it.",
        AIRFLOW_VERSION,
        feature,
        since,
        consequence,
        since,
    )
    return True

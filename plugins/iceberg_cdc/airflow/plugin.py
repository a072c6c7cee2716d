"""Airflow plugin: the CDC view in Airflow's UI (Airflow 3.1+ ``fastapi_apps`` + ``external_views``).

Loaded by the installed distribution's ``airflow.plugins`` entry point
(:mod:`iceberg_cdc.airflow.provider_info` says why), or, without it, by
``plugins/cdc_ui_plugin.py`` in a plugins folder. It mounts
:func:`iceberg_cdc.airflow.views.app.create_app` in the API server at
``/cdc`` and adds "CDC" to the UI's navigation, which shows the page in
Airflow's frame at ``/plugin/cdc``. Every data route of the app requires a
user authenticated by Airflow's auth manager and shows only the tables whose
DAG that user may read; see ``docs/ui.md``. Its listener
(:mod:`iceberg_cdc.airflow.listeners.run_notes`) writes each CDC DAG run's note
when the run ends, in the scheduler.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from iceberg_cdc.airflow.listeners import run_notes, task_preload
from iceberg_cdc.airflow.views.app import MOUNT_PREFIX, create_app


class CdcUiPlugin(AirflowPlugin):
    name = "iceberg_cdc_ui"
    # When a CDC DAG run ends, its note in the Runs list and grid says what it did, or why it failed.
    # In the scheduler, before its LocalExecutor forks: the tasks' modules, imported once for every task.
    listeners = [run_notes, task_preload]  # noqa: RUF012
    fastapi_apps = [  # noqa: RUF012 (AirflowPlugin declares these as class attributes)
        {"app": create_app(), "url_prefix": MOUNT_PREFIX, "name": "Change data capture"}
    ]
    external_views = [  # noqa: RUF012
        {
            "name": "CDC",
            # Relative to Airflow's base URL (no leading slash), so a base path such as /airflow/ works.
            "href": MOUNT_PREFIX.strip("/") + "/",
            "icon": MOUNT_PREFIX.strip("/") + "/icon.svg",
            "url_route": "cdc",
            "destination": "nav",
            "nav_top_level": True,
        }
    ]

"""What Airflow's providers manager reads of this distribution, and whether it is installed as one.

``pip install iceberg-cdc`` registers two entry points (pyproject.toml):

* ``apache_airflow_provider`` -> :func:`get_provider_info`: ``airflow providers
  list`` shows the provider, its hooks and its plugin;
* ``airflow.plugins`` -> :class:`iceberg_cdc.airflow.plugin.CdcUiPlugin`: the
  CDC view and the run-notes listener. Airflow 3 loads the plugins a provider
  declares only when ``[core] lazy_discover_providers`` is off (it is on by
  default), so the plugin needs its own entry point, as Airflow's OpenLineage
  provider does for its plugin. With that setting off, Airflow finds
  the plugin twice and notes the second as "already registered, skipping",
  as it does for OpenLineage's.

This module imports nothing of Airflow: the providers manager calls
:func:`get_provider_info` while it discovers providers, and the plugins-folder
shim (``plugins/cdc_ui_plugin.py``) calls :func:`plugin_entry_point_installed`
before it decides to import the plugin.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

import iceberg_cdc

DISTRIBUTION = "iceberg-cdc"
PLUGIN_NAME = "iceberg_cdc_ui"
PLUGIN_CLASS = "iceberg_cdc.airflow.plugin.CdcUiPlugin"


def get_provider_info() -> dict[str, Any]:
    """The provider's description for Airflow's providers manager (schema: ``provider_info.schema.json``).

    No ``connection-types``: the pipeline defines no connection type of its own.
    :class:`~iceberg_cdc.airflow.hooks.cdc.CdcHook` reads AWS and
    ``spark_connect`` connections, the PostgreSQL mirror reads ``postgres``
    ones; their providers register those types.
    """
    return {
        "package-name": DISTRIBUTION,
        "name": "Iceberg CDC",
        "description": (
            "Change data capture from Apache Iceberg tables as an Airflow + Spark batch pipeline: "
            "one DAG per table from a YAML config, a changelog sink table, mirrors, and the CDC view."
        ),
        "versions": [iceberg_cdc.__version__],
        "integrations": [
            {
                "integration-name": "Iceberg CDC",
                "tags": ["software"],
            }
        ],
        "hooks": [
            {
                "integration-name": "Iceberg CDC",
                "python-modules": [
                    "iceberg_cdc.airflow.hooks.cdc",
                    "iceberg_cdc.airflow.hooks.mirror_postgres",
                ],
            }
        ],
        "plugins": [{"name": PLUGIN_NAME, "plugin-class": PLUGIN_CLASS}],
    }


def plugin_entry_point_installed() -> bool:
    """Whether an installed distribution's ``airflow.plugins`` entry point loads the CDC plugin.

    Airflow registers a plugin name once and reports a second registration as
    an import error, so the plugins-folder shim steps aside when this is true.
    """
    module, _, attr = PLUGIN_CLASS.rpartition(".")
    return any(
        entry_point.value.replace(" ", "") == f"{module}:{attr}"
        for entry_point in metadata.entry_points(group="airflow.plugins")
    )

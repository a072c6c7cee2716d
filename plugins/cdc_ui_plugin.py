"""Airflow plugin entry for a plugins-folder deployment (managed Airflow without ``pip install``).

Airflow imports every module of its plugins folder and registers the
:class:`~airflow.plugins_manager.AirflowPlugin` classes it finds in them.
This one brings :class:`iceberg_cdc.airflow.plugin.CdcUiPlugin` (the CDC view
and the run-notes listener) -- unless the ``iceberg-cdc`` distribution is
installed, whose ``airflow.plugins`` entry point already loads it: Airflow
would report the second registration of the same plugin as an import error.
``iceberg_cdc/`` is excluded from Airflow's own module scan by ``.airflowignore``.
"""

from iceberg_cdc.airflow.provider_info import plugin_entry_point_installed

if not plugin_entry_point_installed():
    from iceberg_cdc.airflow.plugin import CdcUiPlugin

    __all__ = ["CdcUiPlugin"]

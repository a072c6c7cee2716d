"""Airflow plugin entry: Airflow imports every module of its plugins folder, and finds this one.

The plugin itself -- the CDC view and the run-notes listener -- is
:class:`iceberg_cdc.airflow.plugin.CdcUiPlugin`; ``iceberg_cdc/`` is excluded
from Airflow's own module scan by ``.airflowignore``.
"""

from iceberg_cdc.airflow.plugin import CdcUiPlugin

__all__ = ["CdcUiPlugin"]

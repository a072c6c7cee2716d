"""The CDC view in Airflow's UI: what each table's pipeline has done, is doing, and is behind on.

* :mod:`.status` -- the status model, read from the catalog and the sinks'
  snapshot summaries only (no Airflow import; usable anywhere);
* :mod:`.airflow_api` -- the Airflow side: authentication and authorization
  with Airflow's own auth manager, failed runs and their first error line;
* :mod:`.page` -- the server-rendered HTML page;
* :mod:`.app` -- the FastAPI app that ``plugins/cdc_ui_plugin.py`` mounts
  in Airflow's API server.
"""

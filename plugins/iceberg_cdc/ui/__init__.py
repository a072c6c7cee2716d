"""The CDC view's content, Airflow-free: what each table's pipeline has done, is doing, and is behind on.

* :mod:`.status` -- each table's status, read from the catalog and the sinks'
  snapshot summaries only;
* :mod:`.table_status` -- the model of one table (what the page and the JSON show);
* :mod:`.sink_history` -- the sink's commits with their figures, replaced ones marked;
* :mod:`.page` -- the server-rendered HTML page; :mod:`.page_runs` its tables of
  Airflow runs; :mod:`.page_format` its value formatting, style and script.

The Airflow side -- authentication and authorization with Airflow's auth
manager, the DAG runs, and the FastAPI app the plugin mounts in Airflow's API
server -- is :mod:`iceberg_cdc.airflow.views`.
"""

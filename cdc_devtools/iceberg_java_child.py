"""Runs inside the Iceberg Java venv (pyspark 3.5 + Iceberg 1.10 for Spark 3.5): one Spark session, many jobs.

Started by :mod:`cdc_devtools.iceberg_java` as ``python iceberg_java_child.py <job.json>``. The job names
the SQLite catalog file pyiceberg uses (same catalog name: Iceberg's JdbcCatalog and pyiceberg's
SqlCatalog share its tables), the warehouse, the jars, and a list of steps:

* ``{"sql": "..."}`` -- a statement (writes, procedures);
* ``{"read": "<ns.table>", "out": "<dir>"}`` -- the table's rows, as Iceberg Java reads them, to Parquet;
* ``{"query": "...", "out": "<dir>"}`` -- a query's rows to Parquet;
* ``{"metadata": "<ns.table>", "out": "<file.json>"}`` -- what Java's loaded table says of itself.

Each result carries the step's ``seconds``. The job may set ``master``, ``driver_memory`` and more
Spark ``conf`` (defaults: ``local[1]``, ``1g``). The process exits when done, so the SQLite file is
free for pyiceberg writers again -- unless the job says ``"serve": true``: then the session stays up
and takes further step lists, one JSON line each on stdin, answering each with one stdout line
``iceberg-java-result <json>`` (a failed step answers ``{"error": ...}``), until stdin closes. No
import of the project: this runs with the Java venv's own packages only.
"""

from __future__ import annotations

import json
import sys
import time
import traceback

RESULT = "iceberg-java-result "


def main(job_path: str) -> None:
    with open(job_path) as f:
        job = json.load(f)
    spark = _session(job)
    try:
        results = [_step(spark, job["catalog"], number, step) for number, step in enumerate(job["steps"])]
        with open(job["results"], "w") as f:
            json.dump(results, f)
        if job.get("serve"):
            _serve(spark, job["catalog"])
    finally:
        spark.stop()


def _session(job: dict):
    from pyspark.sql import SparkSession

    name = job["catalog"]
    prefix = f"spark.sql.catalog.{name}"
    builder = (
        SparkSession.builder.master(job.get("master", "local[1]"))
        .appName("iceberg-java-judge")
        .config("spark.jars", ",".join(job["jars"]))
        .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
        .config(prefix, "org.apache.iceberg.spark.SparkCatalog")
        .config(f"{prefix}.catalog-impl", "org.apache.iceberg.jdbc.JdbcCatalog")
        # WAL: a reader (the rewrite planning the table) does not lock out the commit that follows.
        .config(f"{prefix}.uri", f"jdbc:sqlite:{job['sqlite']}?journal_mode=WAL&busy_timeout=30000")
        .config(f"{prefix}.warehouse", job["warehouse"])
        # One connection: SQLite allows one writer, and a pool of two locks itself out.
        .config(f"{prefix}.clients", "1")
        .config("spark.sql.defaultCatalog", name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", job.get("driver_memory", "1g"))
    )
    for key, value in job.get("conf", {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _serve(spark, catalog: str) -> None:
    """Step lists from stdin, one JSON line each, answered on stdout: a warm session for many jobs."""
    print(RESULT + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            answer = [_step(spark, catalog, n, step) for n, step in enumerate(json.loads(line))]
        except Exception as error:  # the parent raises it; the session stays usable
            answer = {"error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()[-4000:]}
        print(RESULT + json.dumps(answer), flush=True)


def _step(spark, catalog: str, number: int, step: dict) -> dict:
    print(f"iceberg-java step {number}: {step}", file=sys.stderr, flush=True)
    started = time.perf_counter()
    if "sql" in step:
        spark.sql(step["sql"]).collect()
        result: dict = {"ok": True}
    elif "read" in step or "query" in step:
        frame = spark.table(step["read"]) if "read" in step else spark.sql(step["query"])
        frame.write.mode("overwrite").parquet(step["out"])
        seconds = time.perf_counter() - started
        # Counted from the written files' footers: counting the frame would run its plan again.
        result = {"rows": spark.read.parquet(step["out"]).count(), "write_seconds": round(seconds, 3)}
    elif "metadata" in step:
        result = _metadata(spark, catalog, step["metadata"], step["out"])
    else:
        raise ValueError(f"unknown step {step}")
    result["seconds"] = round(time.perf_counter() - started, 3)
    return result


def _metadata(spark, catalog: str, table: str, out: str) -> dict:
    """The loaded table's format version, next row id and snapshots, through Iceberg's Java API."""
    jvm = spark.sparkContext._jvm
    cat = spark._jsparkSession.sessionState().catalogManager().catalog(catalog)
    loaded = cat.icebergCatalog().loadTable(jvm.org.apache.iceberg.catalog.TableIdentifier.parse(table))
    ops = loaded.operations().current()
    snapshots = []
    for snap in loaded.snapshots():
        snapshots.append(
            {
                "snapshot_id": snap.snapshotId(),
                "first_row_id": None if snap.firstRowId() is None else int(snap.firstRowId()),
                "added_rows": None if snap.addedRows() is None else int(snap.addedRows()),
            }
        )
    info = {
        "format_version": ops.formatVersion(),
        "next_row_id": int(ops.nextRowId()),
        "snapshots": snapshots,
    }
    with open(out, "w") as f:
        json.dump(info, f)
    return info


if __name__ == "__main__":
    main(sys.argv[1])

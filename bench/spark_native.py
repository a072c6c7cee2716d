"""What a user would run without the pipeline: one PySpark job, Spark's own shuffle. Run with spark-submit.

``--mode native`` computes the same changelog as the pipeline from the same
removed (DELETE) and added (INSERT) Parquet files:

1. read both sides, tag each row with -1 (DELETE) or +1 (INSERT);
2. ``repartition(identifier)``: the one shuffle, on the identifier's hash, into
   ``spark.sql.shuffle.partitions`` (P = 64, as the pipeline) partitions that
   adaptive execution coalesces to its advisory size (64 MB), as the
   pipeline's coalescer does with its target;
3. carryover removal by multiplicity: ``groupBy(every column)`` summing the
   tags -- a full row's net count; rows with net 0 were carried over, net
   -k / +k leave k DELETEs / INSERTs;
4. update pairing per key: a window over the identifier counts what is left;
   a key with one DELETE and one INSERT becomes UPDATE_BEFORE + UPDATE_AFTER,
   a key left with two of one kind fails (as the pipeline and Iceberg do);
5. write Parquet (zstd, as the pipeline stages its files).

Steps 3 and 4 need rows clustered by (a superset of) the identifier, which
the repartition already gives, so Spark plans no second exchange
(``explain`` is written next to the result to show it).

``--mode noop`` only starts a SparkSession, runs a two-task job and stops:
the fixed cost of one Spark application here.

``--mode floor`` reads every input file and writes about as many rows as the
changelog has (a hash filter on the identifier), with no shuffle at all: the
least any engine must do here.

Timings go to ``--result`` as JSON: SparkSession start, the job itself, stop.

:func:`run_on_connect` runs the same ``native`` changelog as a Spark Connect
client job on a running server (``bench/connect_run.py``): ``native`` uses the
DataFrame API only, which Spark Connect serves as it is; only the plan's text
comes from the Connect client's ``explain`` instead of the JVM's.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", choices=["native", "floor", "noop"], required=True)
    parser.add_argument("--inputs", default=None, help="JSON file: {removed: [paths], added: [paths]}")
    parser.add_argument("--out", required=True, help="output directory (Parquet)")
    parser.add_argument("--result", required=True, help="JSON file for timings and counts")
    parser.add_argument("--key", action="append", default=None, help="identifier column (repeatable)")
    parser.add_argument("--keep-fraction", type=float, default=0.1, help="floor: share of rows written")
    return parser.parse_args()


def native(spark, removed: list[str], added: list[str], key: list[str]):
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    deletes = spark.read.parquet(*removed).withColumn("_op", F.lit(-1))
    inserts = spark.read.parquet(*added).withColumn("_op", F.lit(1))
    columns = [c for c in deletes.columns if c != "_op"]
    rows = deletes.unionByName(inserts).repartition(*key)
    net = rows.groupBy(*columns).agg(F.sum("_op").alias("_net")).where(F.col("_net") != 0)
    left = net.select(
        *columns,
        F.when(F.col("_net") > 0, F.lit("I")).otherwise(F.lit("D")).alias("_kind"),
        F.explode(F.array_repeat(F.lit(1), F.abs(F.col("_net")).cast("int"))).alias("_copy"),
    )
    per_key = Window.partitionBy(*key)
    left = left.withColumn("_d", F.sum((F.col("_kind") == "D").cast("int")).over(per_key)).withColumn(
        "_i", F.sum((F.col("_kind") == "I").cast("int")).over(per_key)
    )
    pair = (F.col("_d") == 1) & (F.col("_i") == 1)
    ambiguous = (F.col("_d") > 1) | (F.col("_i") > 1)
    change = (
        F.when(
            ambiguous,
            F.raise_error(
                F.concat(F.lit("cannot pair updates for key "), *[F.col(k).cast("string") for k in key])
            ),
        )
        .when(pair & (F.col("_kind") == "D"), F.lit("UPDATE_BEFORE"))
        .when(pair, F.lit("UPDATE_AFTER"))
        .when(F.col("_kind") == "D", F.lit("DELETE"))
        .otherwise(F.lit("INSERT"))
    )
    return left.select(*columns, change.alias("_change_type"))


def floor(spark, removed: list[str], added: list[str], key: list[str], keep_fraction: float):
    from pyspark.sql import functions as F

    rows = spark.read.parquet(*removed).unionByName(spark.read.parquet(*added))
    buckets = 1_000_000
    keep = F.pmod(F.xxhash64(*key), F.lit(buckets)) < F.lit(int(keep_fraction * buckets))
    return rows.where(keep)


def run_on_connect(
    url: str, removed: list[str], added: list[str], out: str, key: list[str], conf: dict[str, str]
) -> dict:
    """``native`` as one client job on the Spark Connect server at ``url``: a new session, the job, release.

    ``conf`` (session SQL settings: shuffle partitions, Parquet codec) is set
    on this client's own session, so other sessions on the server keep theirs.
    The plan's text is asked for after the job and left out of the wall time:
    a Connect ``explain`` is one more analysis of the plan on the server (file
    listing, Parquet footers), which the job itself does not need.
    """
    from pyspark.sql import SparkSession

    started = time.perf_counter()
    spark = SparkSession.builder.remote(url).create()
    for name, value in conf.items():
        spark.conf.set(name, value)
    session_ready = time.perf_counter()
    result = native(spark, removed, added, key)
    job_started_ms = int(time.time() * 1000)
    job_started = time.perf_counter()
    result.write.mode("overwrite").parquet(out)
    job_done = time.perf_counter()
    job_done_ms = int(time.time() * 1000)
    plan = result._explain_string(extended=True)
    plan_seconds = time.perf_counter() - job_done
    spark.stop()
    stopped = time.perf_counter()
    return {
        "mode": "native",
        "wall_seconds": round(stopped - started - plan_seconds, 3),
        "explain_seconds": round(plan_seconds, 3),
        "session_seconds": round(session_ready - started, 3),
        "job_seconds": round(job_done - job_started, 3),
        "stop_seconds": round(stopped - job_done - plan_seconds, 3),
        "job_window_ms": [job_started_ms, job_done_ms],
        "exchanges": plan.count("Exchange hashpartitioning"),
        "plan": plan,
    }


def main() -> None:
    args = parse_args()
    key = args.key or ["id"]
    inputs = json.loads(Path(args.inputs).read_text()) if args.inputs else {}
    started = time.perf_counter()
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.appName(f"bench spark-{args.mode}")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    session_ready = time.perf_counter()
    if args.mode == "noop":
        spark.sparkContext.parallelize(range(2), 2).map(lambda x: x).collect()
        result = spark.range(1)
    elif args.mode == "native":
        result = native(spark, inputs["removed"], inputs["added"], key)
    else:
        result = floor(spark, inputs["removed"], inputs["added"], key, args.keep_fraction)
    plan = result._jdf.queryExecution().toString()
    job_started = time.perf_counter()
    result.write.mode("overwrite").parquet(args.out)
    job_done = time.perf_counter()
    spark.stop()
    stopped = time.perf_counter()
    report = {
        "mode": args.mode,
        "session_seconds": round(session_ready - started, 3),
        "job_seconds": round(job_done - job_started, 3),
        "stop_seconds": round(stopped - job_done, 3),
        "exchanges": plan.count("Exchange hashpartitioning"),
        "plan": plan,
    }
    with open(args.result, "w") as out:
        json.dump(report, out, indent=2)


if __name__ == "__main__":
    main()

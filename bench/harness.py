"""What every bench run shares: the work directory, catalog and configs (:class:`Bench`), and the row checks.

Apart from ``run.py`` (the full bench) so that a bench run on its own --
``python bench/peer.py`` -- uses the same harness without importing the
bench that imports it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import workload as wl
import yaml
from pipeline_run import PipelineSetup, breakdown, expected_reads, run_pipeline
from s3log import RequestLog
from sparkrun import dag_conf, spark_submit

from cdc_devtools.local_s3 import LocalS3Server
from iceberg_cdc.config import CdcConfig, parse_config

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
PARTITIONS = 64
SHUFFLE_BUCKET = "bench-shuffle"
RESULTS = ROOT / "bench" / "results"
SPARK_SQL_CONF = {
    # As the pipeline stages its files (zstd) and as Iceberg stores timestamps (micros).
    "spark.sql.parquet.compression.codec": "zstd",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.shuffle.partitions": str(PARTITIONS),
}
NATIVE_DRIVER_MEMORY = "4g"  # local mode: Spark's executors live in the driver JVM
# The path before carryover was cancelled in the write tasks: every row through the shuffle.
NO_CANCEL = {"cancel_before_shuffle": False}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- configs -------------------------------------------------------------------------------------


class Bench:
    """The work directory, catalog and the configs of every run."""

    def __init__(self, work: Path, quick: bool) -> None:
        self.work = work
        self.quick = quick
        self.logs = work / "logs"
        self.catalog = wl.open_catalog(work)
        self.write_task_size = 0  # set from the main workload's input size
        self.s3: LocalS3Server | None = None
        self.request_log: RequestLog | None = None

    def config(
        self, label: str, source: str, sink: str, shuffle: str = "file", extra: dict[str, Any] | None = None
    ) -> tuple[Path, dict[str, Any], CdcConfig]:
        shuffle_extra = extra
        if shuffle == "s3":
            assert self.s3 is not None
            uri, extra = f"s3://{SHUFFLE_BUCKET}/{label}", dict(self.s3.properties)
        else:
            uri, extra = (self.work / "shuffle" / label).as_uri(), {}
        raw = {
            "catalog": wl.catalog_properties(self.work),
            "shuffle": {
                "uri": uri,
                "partitions": PARTITIONS,
                "write_task_size": self.write_task_size,
                **extra,
                **(shuffle_extra or {}),
            },
            "spark": {"parallel_jobs": 1},
            "tables": [{"source": source, "sink": sink}],
        }
        path = self.work / f"{label}.yaml"
        path.write_text(yaml.safe_dump(raw))
        return path, raw, parse_config(raw)

    def pipeline(
        self,
        label: str,
        workload: wl.Workload,
        shuffle: str,
        inline: bool = False,
        connect_url: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        sink = f"{workload.table}_changes_{label.replace('-', '_')}"
        wl.start_sink_at_parent(self.catalog, workload, sink)
        path, _, config = self.config(label, workload.table, sink, shuffle, extra)
        setup = PipelineSetup(
            label,
            path,
            config,
            workload.table,
            self.logs,
            request_log=self.request_log if shuffle == "s3" else None,
            inline=inline,
            connect_url=connect_url,
        )
        result = run_pipeline(setup)
        result["breakdown"] = breakdown(result, connect=connect_url is not None)
        result["expected_reads"] = expected_reads(result)
        result["sink"] = sink
        if connect_url:
            result["mode"] = "Spark Connect local[2]"
        else:
            result["mode"] = "in-process (no Spark)" if inline else "spark-submit local[2]"
        return result

    def spark_app(self, label: str, mode: str, workload: wl.Workload | None, *extra: str) -> dict[str, Any]:
        args = ["--mode", mode, "--out", str(self.work / f"{label}-out")]
        args += ["--result", str(self.work / f"{label}-result.json")]
        if workload is not None:
            inputs = self.work / f"{label}-inputs.json"
            inputs.write_text(json.dumps({"removed": workload.removed, "added": workload.added}))
            args += ["--inputs", str(inputs)]
        submit = spark_submit(
            label,
            ROOT / "bench" / "spark_native.py",
            [*args, *extra],
            logs=self.logs,
            conf={**dag_conf(), **SPARK_SQL_CONF},
            driver_memory=NATIVE_DRIVER_MEMORY,
            event_dir=self.work / "events" / label,
        )
        inner = json.loads((self.work / f"{label}-result.json").read_text())
        rows = pq.ParquetDataset(self.work / f"{label}-out").read().num_rows if mode != "noop" else 0
        return {
            "wall_seconds": submit.seconds,
            "session_seconds": inner["session_seconds"],
            "job_seconds": inner["job_seconds"],
            "stop_seconds": inner["stop_seconds"],
            "fixed_seconds": round(submit.seconds - inner["job_seconds"], 3),
            "exchanges": inner["exchanges"],
            "rows_written": rows,
            "stages": submit.stages,
            "shuffle_write_bytes": sum(s.get("shuffle_write_bytes", 0) for s in submit.stages),
            "plan": inner["plan"],
            "out": str(self.work / f"{label}-out"),
        }


# --- checks --------------------------------------------------------------------------------------


def _normalized(table: pa.Table, like: pa.Schema) -> pa.Table:
    schema = pa.schema([pa.field(f.name, f.type, nullable=True) for f in like])
    return table.select(like.names).cast(schema)


def same_rows(expected: pa.Table, actual: pa.Table) -> dict[str, Any]:
    """Multiset equality of two changelogs (every column and the change type), with counts per type."""
    a = _normalized(expected, expected.schema)
    b = _normalized(actual, expected.schema)
    keys = [(name, "ascending") for name in a.column_names]
    a, b = a.sort_by(keys).combine_chunks(), b.sort_by(keys).combine_chunks()
    equal = a.num_rows == b.num_rows and a.equals(b)
    result: dict[str, Any] = {
        "equal": equal,
        "rows": [a.num_rows, b.num_rows],
        "by_type": [by_type(a), by_type(b)],
    }
    if not equal and a.num_rows == b.num_rows:
        for name in a.column_names:
            if not a.column(name).equals(b.column(name)):
                result["first_differing_column"] = name
                break
    return result


def by_type(table: pa.Table) -> dict[str, int]:
    counts = table.column("_change_type").value_counts().to_pylist()
    return {c["values"]: c["counts"] for c in sorted(counts, key=lambda c: c["values"])}

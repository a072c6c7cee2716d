"""The pipeline as users run it, for end-to-end tests: moto S3, a SQLite catalog, ``airflow dags test``.

:class:`AirflowPipeline` writes a config with the warehouse and the shuffle
on the S3 server, creates ``shop.orders`` and runs one DAG run per call to
:meth:`run` (spark-submit on the given master). Every run's log is kept.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pyiceberg.catalog import load_catalog
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from cdc_devtools.airflow_env import airflow_env, dags_test, ensure_airflow_db
from iceberg_cdc.sink.table import read_watermark
from iceberg_cdc.watermark import Watermark

if TYPE_CHECKING:
    from cdc_devtools.connect_server import LocalSparkConnectServer

SOURCE = "shop.orders"
SINK = "shop.orders_changes"
DAG_ID = "cdc__shop__orders"


class AirflowPipeline:
    def __init__(
        self,
        tmp: Path,
        s3,
        schema: Schema,
        *,
        partition_spec: PartitionSpec = UNPARTITIONED_PARTITION_SPEC,
        spark_master: str = "local[1]",
        spark: dict[str, Any] | None = None,
        connect: LocalSparkConnectServer | None = None,
    ) -> None:
        """``connect``: a running Spark Connect server (``url``): the config's ``spark.mode`` is ``connect``."""
        if connect is not None:
            spark = {"mode": "connect", **(spark or {})}
        suffix = uuid.uuid4().hex[:8]
        for bucket in (f"wh-{suffix}", f"shuffle-{suffix}"):
            s3.client().create_bucket(Bucket=bucket)
        self.config = {
            "catalog": {
                "name": "e2e",
                "type": "sql",
                "uri": f"sqlite:///{tmp / 'catalog.db'}",
                "warehouse": f"s3://wh-{suffix}/",
                **s3.properties,
            },
            "shuffle": {
                "uri": f"s3://shuffle-{suffix}/cdc",
                "partitions": 8,
                "target_partition_size": "64KB",
            },
            # These tests are about the Spark phases: their tiny snapshots would otherwise run in the
            # task's process (spark.in_process_below); tests of that path pass a size.
            "spark": {"parallel_jobs": 1, "in_process_below": 0, **(spark or {})},
            "tables": [{"source": SOURCE, "sink": SINK}],
        }
        self.config_path = tmp / "cdc.yaml"
        self.config_path.write_text(yaml.safe_dump(self.config))
        self.catalog = load_catalog("e2e", **{k: v for k, v in self.config["catalog"].items() if k != "name"})
        self.catalog.create_namespace("shop")
        self.source: Table = self.catalog.create_table(SOURCE, schema=schema, partition_spec=partition_spec)
        self.home = tmp / "airflow"
        self.env = airflow_env(
            self.home,
            self.config_path,
            spark_master=spark_master,
            connect_url=None if connect is None else connect.url,
        )
        ensure_airflow_db(self.env)
        self.logs = tmp / "logs"
        self.logs.mkdir()
        self.shuffle = s3.client()
        self.shuffle_bucket = f"shuffle-{suffix}"
        self.last_log = self.logs / "none.log"

    def run(self, conf: dict[str, Any] | None = None, env_overrides: dict[str, str] | None = None) -> int:
        """One DAG run; its log is ``self.last_log``."""
        env = {**self.env, **(env_overrides or {})}
        self.last_log = self.logs / f"run-{len(list(self.logs.iterdir())):02d}.log"
        with open(self.last_log, "w") as out:
            return dags_test(env, DAG_ID, {"trigger_next": False, **(conf or {})}, out)

    def log_tail(self, chars: int = 3000) -> str:
        return self.last_log.read_text()[-chars:]

    def sink(self) -> Table:
        return self.catalog.load_table(SINK)

    def watermark(self) -> Watermark | None:
        return read_watermark(self.sink(), SOURCE)

    def shuffle_objects(self) -> list[str]:
        listed = self.shuffle.list_objects_v2(Bucket=self.shuffle_bucket, Prefix=f"cdc/{SOURCE}/")
        return [item["Key"] for item in listed.get("Contents", [])]

    def lease_exists(self) -> bool:
        """Whether some run holds the table's lease (a released lease stays as a tombstone)."""
        listed = self.shuffle.list_objects_v2(Bucket=self.shuffle_bucket, Prefix="cdc/_leases/")
        for item in listed.get("Contents", []):
            body = self.shuffle.get_object(Bucket=self.shuffle_bucket, Key=item["Key"])["Body"].read()
            if not json.loads(body).get("released", False):
                return True
        return False

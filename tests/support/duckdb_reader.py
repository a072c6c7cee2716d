"""A reader no one here wrote: DuckDB 1.4.4's iceberg extension from pip, over the local S3 server.

The extensions come from the ``duckdb-ext-*`` wheels (``duckdb_ext/extensions/v1.4.4/<platform>/``);
``SET extension_directory`` points DuckDB at the wheel's folder, so nothing is
downloaded. A table is read by its metadata file's path, every column.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

import pyarrow as pa


def extension_directory() -> str:
    import duckdb_ext  # the namespace the duckdb-ext-* wheels install into

    return str(Path(next(iter(duckdb_ext.__path__))) / "extensions")


def read_iceberg(metadata_location: str, s3_properties: dict[str, str]) -> pa.Table:
    """Every row of the Iceberg table whose metadata file is ``metadata_location``, as DuckDB reads it."""
    import duckdb

    connection = duckdb.connect(
        config={"extension_directory": extension_directory(), "autoinstall_known_extensions": False}
    )
    try:
        for name in ("httpfs", "avro", "iceberg"):
            connection.execute(f"LOAD {name}")
        endpoint = urlparse(s3_properties["s3.endpoint"])
        connection.execute(
            "CREATE SECRET local_s3 (TYPE s3, KEY_ID ?, SECRET ?, REGION ?, ENDPOINT ?, URL_STYLE 'path', USE_SSL false)",
            [
                s3_properties["s3.access-key-id"],
                s3_properties["s3.secret-access-key"],
                s3_properties.get("s3.region", "us-east-1"),
                endpoint.netloc,
            ],
        )
        return connection.execute("SELECT * FROM iceberg_scan(?)", [metadata_location]).fetch_arrow_table()
    finally:
        connection.close()

"""Names of the datasets a run reads and writes, as OpenLineage wants them (no Airflow, no OpenLineage import).

An Iceberg table is named by where it lives, as OpenLineage's Spark
integration names the tables Spark jobs write: namespace ``s3://bucket``
(``file`` for local paths), name the table's location path. So a lineage
graph joins this pipeline's events with the events of the jobs that write the
source. A ``symlinks`` identifier adds the catalog's name for the table
(``iceberg://<catalog>`` / ``namespace.table``, type ``TABLE``) and a
``catalog`` facet says which catalog. The **version** of a dataset is the
Iceberg snapshot id: the source snapshot a run processed, the sink snapshot
its commit made. An input whose changes were read between two snapshots also
names the range (:func:`read_range`): the snapshot after which the read
started, exclusive, and the version it read through.

Mirrors (``tables[].mirrors``) name their target the same way:
:func:`mirror_dataset` gives an Iceberg mirror's or a PostgreSQL table's
name, for the mirror tasks to report as their output
(:mod:`iceberg_cdc.airflow.operators.lineage`). A verification reports the
mirror as its input with a data-quality assertion (:func:`verify_datasets`),
in the mirror DAG's ``verify`` task and in ``make verify`` alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlparse

from iceberg_cdc.config import CatalogConfig, CdcConfig


@dataclass(frozen=True)
class DatasetRef:
    """One dataset of a lineage event: namespace and name, with what facets say about it."""

    namespace: str
    name: str
    version: str | None = None
    symlink: tuple[str, str] | None = None  # (namespace, name) of the catalog identifier
    catalog: dict[str, str] = field(default_factory=dict)  # framework, type, name, warehouseUri
    rows: int | None = None  # output rows written (outputs only)
    # The snapshots an input's changes were read across: (after, through], ``after`` exclusive (None:
    # from the table's first snapshot), ``through`` = ``version``. OpenLineage's ``version`` holds one.
    snapshot_range: tuple[str | None, str] | None = None
    # Data-quality assertions on an input (name, success, actual), e.g. a mirror's verification.
    assertions: tuple[tuple[str, bool, str], ...] = ()


def location_name(location: str) -> tuple[str, str]:
    """``s3://bucket/wh/shop/orders`` -> (``s3://bucket``, ``wh/shop/orders``); ``file:///x/y`` -> (``file``, ``/x/y``)."""
    parsed = urlparse(location)
    scheme = {"s3a": "s3", "s3n": "s3", "gcs": "gs"}.get(parsed.scheme, parsed.scheme)
    if scheme in ("file", ""):
        return "file", parsed.path.rstrip("/") or "/"
    return f"{scheme}://{parsed.netloc}", parsed.path.strip("/")


def iceberg_dataset(
    catalog: CatalogConfig,
    identifier: str,
    location: str,
    *,
    version: int | str | None = None,
    rows: int | None = None,
) -> DatasetRef:
    """An Iceberg table of the config's catalog, at ``version`` (a snapshot id) when given."""
    namespace, name = location_name(location)
    properties = catalog.properties
    facet = {"framework": "iceberg", "type": properties.get("type", "unknown"), "name": catalog.name}
    if properties.get("warehouse"):
        facet["warehouseUri"] = properties["warehouse"]
    return DatasetRef(
        namespace=namespace,
        name=name,
        version=None if version is None else str(version),
        symlink=(f"iceberg://{catalog.name}", identifier),
        catalog=facet,
        rows=rows,
    )


def read_range(ref: DatasetRef, after: int | str | None) -> DatasetRef:
    """``ref`` as an input whose changes were read after ``after`` (exclusive; None: from the first snapshot).

    Through its ``version``: a run reads the changes between two snapshots,
    and the end alone does not say which (a mirror apply over three changelog
    snapshots, a changelog commit of one source snapshot after its parent).
    """
    if ref.version is None:
        return ref
    return replace(ref, snapshot_range=(None if after is None else str(after), ref.version))


def mirror_dataset(mirror: dict[str, Any], catalog: CatalogConfig, location: str | None = None) -> DatasetRef:
    """A mirror's target: ``{type: iceberg, table}`` (with its ``location``) or ``{type: postgres, dsn|conn_id, table}``.

    PostgreSQL follows OpenLineage's naming: ``postgres://host:port`` and
    ``database.schema.table``; with only ``conn_id`` (the host is in Airflow's
    connection), the namespace is ``postgres://<conn_id>``.
    """
    kind = mirror.get("type")
    table = str(mirror.get("table", ""))
    if kind == "iceberg":
        if location is None:
            raise ValueError(f"an Iceberg mirror's dataset needs its table location ({table})")
        return iceberg_dataset(catalog, table, location)
    if kind == "postgres":
        dsn = mirror.get("dsn")
        if dsn:
            parsed = urlparse(str(dsn))
            host = f"{parsed.hostname}:{parsed.port or 5432}"
            database = parsed.path.strip("/") or "postgres"
            return DatasetRef(namespace=f"postgres://{host}", name=f"{database}.{table}")
        return DatasetRef(namespace=f"postgres://{mirror.get('conn_id')}", name=table)
    raise ValueError(f"unknown mirror type {kind!r}: expected iceberg or postgres")


def verify_datasets(
    detected: dict[str, Any], verified: dict[str, Any] | None, config: CdcConfig | None = None
) -> tuple[list[DatasetRef], list[DatasetRef]]:
    """A mirror's verification: the mirror as an input, with a data-quality assertion of equality.

    ``detected`` names the table and mirror (``source``, ``mirror``);
    ``config`` defaults to the one ``CDC_CONFIG`` names. ``equal_to_source``
    succeeds when the mirror held exactly its source's rows (or was repaired
    to); ``actual`` says how many keys differed and were left. Nothing is
    reported when no verification ran (not due).
    """
    if not verified or not verified.get("verified"):
        return [], []
    if config is None:
        from iceberg_cdc.config import load_config

        config = load_config()
    mirror = config.table(detected["source"]).mirror(detected["mirror"])
    target = mirror_dataset(
        mirror.model_dump(include={"type", "table", "dsn", "conn_id"}),
        config.catalog,
        location=verified.get("mirror_location"),
    )
    drifted, left = int(verified.get("drifted_keys") or 0), int(verified.get("left_keys") or 0)
    status = str(verified.get("status"))
    actual = f"{drifted} keys differed, {left} left ({status})"
    return [replace(target, assertions=(("equal_to_source", status in ("equal", "repaired"), actual),))], []

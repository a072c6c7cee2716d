"""Names of the datasets a run reads and writes, as OpenLineage wants them (no Airflow, no OpenLineage import).

An Iceberg table is named by where it lives, as OpenLineage's Spark
integration names the tables Spark jobs write: namespace ``s3://bucket``
(``file`` for local paths), name the table's location path. So a lineage
graph joins this pipeline's events with the events of the jobs that write the
source. A ``symlinks`` identifier adds the catalog's name for the table
(:func:`catalog_symlink`: namespace the catalog's URI or warehouse
location, as OpenLineage's Spark integration names an Iceberg catalog's
tables; type ``TABLE``) and a ``catalog`` facet says which catalog. The
catalog's configured *name* is in that facet only: two deployments may both
call theirs ``prod``. The **version** of a dataset is the
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
from iceberg_cdc.verify_status import is_equal


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
    # The range is a bridge over a gap in the source's history (expired, rolled back): its changes are
    # the net change from the range's start to its end, the snapshots between were not read one by one.
    bridge: str | None = None
    # Data-quality assertions on an input (name, success, actual), e.g. a mirror's verification.
    assertions: tuple[tuple[str, bool, str], ...] = ()


# Hadoop's names of object stores -> OpenLineage's (its naming spec: ``s3://bucket``, ``gs://bucket``).
_SCHEMES = {"s3a": "s3", "s3n": "s3", "gcs": "gs"}


def location_name(location: str) -> tuple[str, str]:
    """``s3://bucket/wh/shop/orders`` -> (``s3://bucket``, ``wh/shop/orders``); ``file:///x/y`` -> (``file``, ``/x/y``)."""
    parsed = urlparse(location)
    scheme = _SCHEMES.get(parsed.scheme, parsed.scheme)
    if scheme in ("file", ""):
        return "file", parsed.path.rstrip("/") or "/"
    return f"{scheme}://{parsed.netloc}", parsed.path.strip("/")


def public_uri(uri: str) -> str:
    """``uri`` without what may be secret (user, password, query) or a driver (``postgresql+psycopg2``)."""
    parsed = urlparse(uri)
    scheme = parsed.scheme.split("+", 1)[0]
    host = parsed.hostname or ""
    if parsed.port is not None:
        host = f"{host}:{parsed.port}"
    return f"{scheme}://{host}{parsed.path.rstrip('/')}"


def catalog_symlink(catalog: CatalogConfig, identifier: str) -> tuple[str, str] | None:
    """The catalog's (namespace, name) for a table, as OpenLineage's Spark integration names Iceberg catalogs.

    * ``rest``: the catalog's URI / ``namespace.table``;
    * ``hive``: ``hive://host:port`` of the metastore / ``namespace.table``;
    * ``glue`` (with ``glue.id`` and a region): ``arn:aws:glue:<region>:<account>`` / ``table/<db>/<table>``;
    * otherwise the warehouse location (``s3://bucket/path``, ``file:/path``) / ``namespace.table``,
      or without one the catalog's URI (a SQL catalog's database);
    * None when the config holds neither (e.g. both in an Airflow connection): no symlink rather
      than a name of our own. URIs lose credentials and query (:func:`public_uri`).
    """
    properties = catalog.properties
    kind, uri, warehouse = properties.get("type", ""), properties.get("uri"), properties.get("warehouse")
    if kind == "rest" and uri:
        return public_uri(uri), identifier
    metastore = urlparse(uri.split(",")[0]) if kind == "hive" and uri else None
    if metastore is not None and metastore.hostname:
        return f"hive://{metastore.hostname}:{metastore.port or 9083}", identifier
    region = properties.get("glue.region") or properties.get("client.region")
    if kind == "glue" and properties.get("glue.id") and region:
        database, _, table = identifier.rpartition(".")
        return f"arn:aws:glue:{region}:{properties['glue.id']}", f"table/{database}/{table}"
    if warehouse:
        return warehouse_namespace(warehouse), identifier
    if uri:
        return public_uri(uri), identifier
    return None


def warehouse_namespace(warehouse: str) -> str:
    """A warehouse location as a namespace: ``s3://bucket/wh/`` -> ``s3://bucket/wh``; ``file:///x`` -> ``file:/x``."""
    parsed = urlparse(warehouse)
    scheme = _SCHEMES.get(parsed.scheme, parsed.scheme)
    path = parsed.path.rstrip("/")
    if scheme in ("file", ""):
        return f"file:{path or '/'}"
    return f"{scheme}://{parsed.netloc}{path}"


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
    if properties.get("uri"):
        facet["metadataUri"] = public_uri(properties["uri"])
    return DatasetRef(
        namespace=namespace,
        name=name,
        version=None if version is None else str(version),
        symlink=catalog_symlink(catalog, identifier),
        catalog=facet,
        rows=rows,
    )


def read_range(ref: DatasetRef, after: int | str | None, bridge: str | None = None) -> DatasetRef:
    """``ref`` as an input whose changes were read after ``after`` (exclusive; None: from the first snapshot).

    Through its ``version``: a run reads the changes between two snapshots,
    and the end alone does not say which (a mirror apply over three changelog
    snapshots, a changelog commit of one source snapshot after its parent).
    ``bridge``: the reason, when the range is a bridge over a gap in the history.
    """
    if ref.version is None:
        return ref
    return replace(ref, snapshot_range=(None if after is None else str(after), ref.version), bridge=bridge)


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
    return [replace(target, assertions=(("equal_to_source", is_equal(status), actual),))], []

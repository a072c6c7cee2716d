"""The catalog symlink of a lineage dataset: named as OpenLineage names an Iceberg catalog's tables.

Never by the catalog's configured name alone (two deployments may both call
theirs ``prod``), never with a credential from the catalog's URI.
"""

from __future__ import annotations

import pytest

from iceberg_cdc.config import CatalogConfig
from iceberg_cdc.lineage import catalog_symlink, iceberg_dataset


def catalog(**properties: str) -> CatalogConfig:
    return CatalogConfig(name="prod", **properties)


def test_two_deployments_whose_catalogs_share_a_name_are_told_apart():
    eu = iceberg_dataset(
        catalog(type="sql", uri="sqlite:///c.db", warehouse="s3://eu-wh/"),
        "shop.orders",
        "s3://eu-wh/shop/orders",
    )
    us = iceberg_dataset(
        catalog(type="sql", uri="sqlite:///c.db", warehouse="s3a://us-wh/lake"),
        "shop.orders",
        "s3://us-wh/lake/shop/orders",
    )
    assert eu.symlink == ("s3://eu-wh", "shop.orders")
    assert us.symlink == ("s3://us-wh/lake", "shop.orders")
    assert eu.catalog["name"] == us.catalog["name"] == "prod"  # the name stays, in the catalog facet


@pytest.mark.parametrize(
    ("properties", "expected"),
    [
        (
            {
                "type": "rest",
                "uri": "https://user:s3cret@rest.example:8181/api/catalog/?token=x",
                "warehouse": "lake",
            },
            ("https://rest.example:8181/api/catalog", "shop.orders"),
        ),
        (
            {"type": "hive", "uri": "thrift://meta-1:9083,thrift://meta-2:9083"},
            ("hive://meta-1:9083", "shop.orders"),
        ),
        (
            {"type": "glue", "glue.id": "123456789012", "glue.region": "eu-west-1", "warehouse": "s3://wh"},
            ("arn:aws:glue:eu-west-1:123456789012", "table/shop/orders"),
        ),
        (
            {"type": "glue", "warehouse": "s3://wh/x/"},
            ("s3://wh/x", "shop.orders"),
        ),  # no account: its warehouse
        (
            {"type": "sql", "uri": "sqlite:////tmp/c.db", "warehouse": "file:///tmp/wh/"},
            ("file:/tmp/wh", "shop.orders"),
        ),
        (
            {"type": "sql", "uri": "postgresql+psycopg2://cdc:s3cret@db.internal:5432/iceberg"},
            ("postgresql://db.internal:5432/iceberg", "shop.orders"),
        ),
        (
            {"type": "rest"},
            None,
        ),  # everything in an Airflow connection: no symlink rather than a made-up name
    ],
)
def test_each_catalog_type_is_named_by_its_uri_or_warehouse(properties, expected):
    assert catalog_symlink(catalog(**properties), "shop.orders") == expected


def test_no_credential_reaches_the_dataset():
    ref = iceberg_dataset(
        catalog(type="sql", uri="postgresql://cdc:s3cret@db.internal:5432/iceberg?sslmode=require"),
        "shop.orders",
        "s3://wh/shop/orders",
    )
    assert "s3cret" not in repr(ref) and "sslmode" not in repr(ref)
    assert ref.catalog["metadataUri"] == "postgresql://db.internal:5432/iceberg"

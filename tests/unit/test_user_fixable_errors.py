"""Problems a user fixes raise the pipeline's errors, naming the fix, instead of built-in exceptions.

Built-ins (``ValueError``, ``KeyError``) read as bugs and are retried as if
transient; the pipeline's errors say what to change. The cases whose checks
live next to their module's other tests (identifier columns, shuffle
partitions, a file without field ids, the retrying FileIO's properties) are
tested there; these are the rest.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from iceberg_cdc.errors import CdcError, ConfigError, CorruptShuffleError, SinkSchemaError
from iceberg_cdc.pipeline.plan import PLAN_VERSION, SnapshotPlan
from iceberg_cdc.run.lease import LEASE_TTL_ENV, lease_ttl_seconds
from iceberg_cdc.shuffle.rows import OP_COLUMN, shuffle_schema
from iceberg_cdc.storage import open_store


def test_a_plan_of_another_release_says_to_plan_again():
    with pytest.raises(
        CorruptShuffleError, match=r"version 1, but this release .* Clear the DAG run from detect"
    ):
        SnapshotPlan.from_json(json.dumps({"version": 1, "write_tasks": [], "groups": []}))
    assert PLAN_VERSION != 1


@pytest.mark.parametrize("raw", ["0", "-5", "soon"])
def test_a_bad_lease_ttl_names_the_variable(monkeypatch, raw):
    monkeypatch.setenv(LEASE_TTL_ENV, raw)
    with pytest.raises(ConfigError, match=rf"{LEASE_TTL_ENV}='{raw}' must be a positive number.*unset it"):
        lease_ttl_seconds()
    monkeypatch.setenv(LEASE_TTL_ENV, "42")
    assert lease_ttl_seconds() == 42.0


def test_an_unsupported_shuffle_uri_names_the_setting():
    with pytest.raises(ConfigError, match=r"'hdfs://x/y'.*set shuffle\.uri"):
        open_store("hdfs://x/y")


def test_a_source_column_named_like_the_shuffle_tag_says_to_rename_it():
    with pytest.raises(SinkSchemaError, match=rf"'{OP_COLUMN}'.*rename the source column"):
        shuffle_schema(pa.schema([("id", pa.int64()), (OP_COLUMN, pa.int8())]))


def test_they_are_the_pipelines_errors():
    assert all(issubclass(e, CdcError) for e in (ConfigError, CorruptShuffleError, SinkSchemaError))
    assert not issubclass(ConfigError, (ValueError, KeyError))

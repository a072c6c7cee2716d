"""The retrying FileIO through the fault proxy: bit-identical reads and writes, permanent errors at once."""

from __future__ import annotations

import importlib
import io
import os
import pickle
import uuid
from collections.abc import Iterator

import boto3
import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from pyarrow.fs import AwsStandardS3RetryStrategy
from pyiceberg.io import S3_RETRY_STRATEGY_IMPL, load_file_io
from pyiceberg.io.pyarrow import PyArrowFileIO

from cdc_devtools.fault_proxy import FaultProxy, first_requests
from cdc_devtools.local_s3 import LocalS3Server
from iceberg_cdc.errors import ConfigError, StorageError, TransientStorageError
from iceberg_cdc.pipeline import runtime as runtime_module
from iceberg_cdc.pipeline.runtime import Runtime, with_retrying_io
from iceberg_cdc.sink.staging import write_staged_file
from iceberg_cdc.storage import RETRYING_IO_IMPL
from iceberg_cdc.storage.retrying_io import (
    ONE_ATTEMPT_S3_RETRY_STRATEGY_IMPL,
    RETRY_ATTEMPTS,
    RETRY_BASE_DELAY_MS,
    RETRY_MAX_DELAY_MS,
    RetryingPyArrowFileIO,
    policy_from_properties,
)
from iceberg_cdc.storage.retrying_streams import ResumableInputStream, RetryingUploadStream, is_transient
from tests.support.auth_s3 import auth_s3_server

pytestmark = pytest.mark.s3

HEAVY = {"error_rate": 0.3, "drop_rate": 0.1, "cut_rate": 0.1}
SECRET = "TOPSECRET-retrying-io-do-not-log"


def parquet_bytes(rows: int, seed: int, row_group_size: int = 40_000) -> tuple[pa.Table, bytes]:
    """An uncompressed multi-row-group Parquet file of a few MB, and its table."""
    rng = np.random.default_rng(seed)
    table = pa.table(
        {
            "id": np.arange(rows, dtype=np.int64),
            "value": rng.random(rows),
            "name": pa.array([f"name-{i:08d}" for i in rng.integers(0, 10**8, rows)]),
        }
    )
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=row_group_size, compression="none")
    return table, sink.getvalue()


@pytest.fixture
def proxy(moto_server: LocalS3Server) -> Iterator[FaultProxy]:
    with FaultProxy(moto_server.endpoint, seed=20260124) as running:
        yield running


@pytest.fixture
def file_io(proxy: FaultProxy, s3_properties) -> RetryingPyArrowFileIO:
    fio = load_file_io({**proxy.properties(s3_properties), "py-io-impl": RETRYING_IO_IMPL})
    assert isinstance(fio, RetryingPyArrowFileIO)
    return fio


@pytest.fixture(scope="module")
def files(s3_client) -> dict[str, tuple[pa.Table, bytes]]:
    """Three Parquet files of 2-5 MB in a bucket of their own, written without the proxy."""
    bucket = f"retrying-io-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=bucket)
    made = {}
    for n, rows in enumerate((120_000, 200_000, 260_000)):
        table, raw = parquet_bytes(rows, seed=n)
        s3_client.put_object(Bucket=bucket, Key=f"data/file-{n}.parquet", Body=raw)
        made[f"s3://{bucket}/data/file-{n}.parquet"] = (table, raw)
    return made


class SdkRetries(AwsStandardS3RetryStrategy):
    """pyarrow's own retries, as a catalog that names its own ``s3.retry-strategy-impl`` gets them."""

    def __init__(self) -> None:
        super().__init__(max_attempts=4)


@pytest.mark.parametrize(
    "sdk_retries", [True, False], ids=["with-pyarrow-retries", "without-pyarrow-retries"]
)
def test_reads_survive_heavy_faults_bit_identical(proxy, s3_properties, files, sdk_retries):
    """Reads are exact through 50% faults, whether pyarrow's own retries absorb some faults or none.

    By default pyarrow makes one attempt per request (OneAttemptS3RetryStrategy):
    every fault reaches the streams, which must then reopen the object mid-read
    and go on where they were. A catalog naming its own strategy gets pyarrow's
    retries too, which absorb many faults (even most cut bodies) first.
    """
    properties = {**proxy.properties(s3_properties), "py-io-impl": RETRYING_IO_IMPL}
    if sdk_retries:
        properties[S3_RETRY_STRATEGY_IMPL] = f"{__name__}.SdkRetries"
    else:
        properties.update(
            {
                RETRY_ATTEMPTS: "25",  # 50% of requests fail: 8 attempts would not do for ~150 reads
                RETRY_BASE_DELAY_MS: "5",
                RETRY_MAX_DELAY_MS: "50",
            }
        )
    file_io = load_file_io(properties)
    proxy.set_rates(**HEAVY)
    streams: list[ResumableInputStream] = []
    rng = np.random.default_rng(3)

    def opened(path: str, seekable: bool = True) -> ResumableInputStream:
        stream = file_io.new_input(path).open(seekable=seekable)
        streams.append(stream)
        return stream

    for path, (table, raw) in files.items():
        with opened(path) as stream:  # as source.reading.read_data_file reads
            parquet = pq.ParquetFile(stream, buffer_size=1 << 20, pre_buffer=False)
            assert parquet.metadata.num_row_groups >= 3
            batches = list(parquet.iter_batches(batch_size=30_000, use_threads=False))
            assert pa.Table.from_batches(batches).equals(table)
        with opened(path) as stream:  # as pyiceberg's ArrowScan reads (pre-buffered)
            fragment = ds.ParquetFileFormat(pre_buffer=True, buffer_size=8 << 20).make_fragment(stream)
            assert fragment.to_table().equals(table)
        with opened(path, seekable=False) as stream:  # as manifests and metadata are read
            assert stream.read() == raw
        with opened(path) as stream:
            for start in rng.integers(0, len(raw), 5):
                stream.seek(int(start))
                assert stream.read(100_000) == raw[start : start + 100_000]
        assert len(file_io.new_input(path)) == len(raw)
        assert file_io.new_input(path).exists()
    counts = proxy.counts
    assert counts["error_500"] and counts["error_503"] and counts["drop"] and counts["cut"], counts
    assert any(r.fault == "cut" and r.method == "GET" for r in proxy.records)
    if not sdk_retries:  # a body cut mid-read made its stream reopen the object and go on where it was
        assert sum(stream.reopens for stream in streams) > len(streams)


def test_staged_parquet_files_are_written_through_faults(proxy, file_io, s3_bucket, s3_client):
    proxy.set_rates(**HEAVY)
    written = {}
    for n, rows in enumerate((50_000, 150_000, 260_000, 400_000)):  # ~1 MB to ~7 MB: PUT and multipart
        table, _ = parquet_bytes(rows, seed=10 + n)
        path = f"s3://{s3_bucket}/sink/data/_staged/snapshot=1/range-{n:05d}-a1.parquet"
        staged = write_staged_file(file_io, path, table)
        assert staged.record_count == rows
        written[path] = (table, staged)
    put_faults = [r for r in proxy.records if r.method in ("PUT", "POST") and r.fault != "none"]
    assert put_faults, "no write was faulted; the test proves nothing"
    proxy.set_rates(error_rate=0.0, drop_rate=0.0, cut_rate=0.0)
    for path, (table, staged) in written.items():
        key = path.split("/", 3)[3]
        body = s3_client.get_object(Bucket=s3_bucket, Key=key)["Body"].read()
        assert len(body) == staged.file_size
        assert pq.read_table(io.BytesIO(body)).equals(table)


def test_missing_object_is_not_retried_and_named(proxy, file_io, s3_bucket, s3_properties):
    path = f"s3://{s3_bucket}/no/such.parquet"

    def look(fio, named: str) -> None:
        with pytest.raises(FileNotFoundError, match=named):
            fio.new_input(path).open()
        with pytest.raises(FileNotFoundError, match=named):
            len(fio.new_input(path))
        assert not fio.new_input(path).exists()
        with pytest.raises(FileNotFoundError, match=named):
            fio.delete(path)

    look(PyArrowFileIO(proxy.properties(s3_properties)), "no/such.parquet")
    plain = proxy.by_method.copy()
    look(file_io, path)  # the full URI, where pyarrow's own message says bucket/key
    assert proxy.by_method - plain == plain  # exactly the requests pyarrow makes itself: nothing retried


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory, _no_real_aws) -> Iterator[tuple[LocalS3Server, dict[str, str]]]:
    """A moto server of our own that checks credentials (tests.support.auth_s3)."""
    with auth_s3_server(tmp_path_factory.mktemp("moto-auth-io")) as (server, good):
        yield server, {k: v for k, v in good.items() if k != "s3.endpoint"}


def test_wrong_credentials_are_not_retried_and_named(auth_server):
    server, good = auth_server
    bucket = f"retrying-auth-{uuid.uuid4().hex[:12]}"
    admin = boto3.client(
        "s3",
        endpoint_url=server.endpoint,
        region_name="us-east-1",
        aws_access_key_id=good["s3.access-key-id"],
        aws_secret_access_key=good["s3.secret-access-key"],
    )
    admin.create_bucket(Bucket=bucket)
    admin.put_object(Bucket=bucket, Key="k.parquet", Body=b"PAR1")
    with FaultProxy(server.endpoint) as proxy:
        wrong = {
            **good,
            "s3.endpoint": proxy.endpoint,
            "s3.access-key-id": "AKIAWRONGWRONGWRONG",
            "s3.secret-access-key": SECRET,
        }
        fio = RetryingPyArrowFileIO({**wrong, RETRY_BASE_DELAY_MS: "1"})
        path = f"s3://{bucket}/k.parquet"
        for action in (
            lambda: fio.new_input(path).open(),
            lambda: len(fio.new_input(path)),
            lambda: fio.new_input(path).exists(),
        ):
            before = proxy.counts["requests"]
            with pytest.raises(PermissionError) as raised:
                action()
            message = str(raised.value)
            assert path in message and "access denied" in message and "s3.access-key-id" in message
            assert SECRET not in message and SECRET not in repr(raised.value.__cause__)
            assert proxy.counts["requests"] - before == 1, "a 403 was retried"


def test_exhausted_retries_name_the_object_and_say_a_retry_is_safe(proxy, s3_properties, files):
    path = next(iter(files))
    fio = RetryingPyArrowFileIO(
        {
            **proxy.properties(s3_properties),
            RETRY_ATTEMPTS: "3",
            RETRY_BASE_DELAY_MS: "1",
            S3_RETRY_STRATEGY_IMPL: "pyarrow.fs.AwsDefaultS3RetryStrategy",  # pyarrow's own: 3 quick retries
        }
    )
    proxy.set_rates(error_rate=1.0)
    with pytest.raises(TransientStorageError) as raised:
        fio.new_input(path).open()
    error = raised.value
    assert isinstance(error, StorageError) and error.retry_safe
    assert (error.location, error.operation, error.attempts) == (path, "open", 3)
    message = str(error)
    assert path in message and "3 attempts" in message and "Retrying the DAG run is safe" in message
    assert "nothing was committed" in message
    copy = pickle.loads(pickle.dumps(error))  # Spark ships executor errors to the driver
    assert (copy.retry_safe, copy.location, copy.attempts, str(copy)) == (True, path, 3, message)

    stream = fio.new_output(path + ".copy").create(overwrite=True)
    stream.write(b"data")
    with pytest.raises(TransientStorageError, match=r"upload \(4 bytes\) to s3://.*3 attempts"):
        stream.close()


def _read_all(fio: RetryingPyArrowFileIO, path: str) -> bytes:
    with fio.new_input(path).open(seekable=False) as stream:
        return stream.read()


@pytest.mark.parametrize("failures", [1, 4, 7])
def test_n_transient_failures_then_success_reach_s3_n_plus_one_times(proxy, s3_properties, files, failures):
    """One retry layer: pyarrow makes one attempt per request, the FileIO retries; nothing multiplies them."""
    path = sorted(files)[0]
    key = path.split("/", 3)[3]
    fio = RetryingPyArrowFileIO({**proxy.properties(s3_properties), RETRY_BASE_DELAY_MS: "0"})
    assert _read_all(fio, path) == files[path][1]
    clean = proxy.requests_for(key, "GET")
    proxy.fault_filter = first_requests(failures, key, "GET")
    proxy.error_statuses = (503,)
    proxy.set_rates(error_rate=1.0)
    assert _read_all(fio, path) == files[path][1]
    assert proxy.requests_for(key, "GET") - clean == clean + failures
    assert proxy.counts["error_503"] == failures


def test_more_failures_than_the_budget_name_the_object_and_the_requests_made(proxy, s3_properties, files):
    path = sorted(files)[0]
    key = path.split("/", 3)[3]
    fio = RetryingPyArrowFileIO(
        {**proxy.properties(s3_properties), RETRY_ATTEMPTS: "4", RETRY_BASE_DELAY_MS: "0"}
    )
    stream = fio.new_input(path).open(seekable=False)
    proxy.fault_filter = first_requests(100, key, "GET")
    proxy.error_statuses = (503,)
    proxy.set_rates(error_rate=1.0)
    with pytest.raises(TransientStorageError) as raised:
        stream.read()
    assert (raised.value.location, raised.value.operation, raised.value.attempts) == (path, "read", 4)
    assert proxy.requests_for(key, "GET") == 4
    assert path in str(raised.value) and "4 attempts" in str(raised.value)


def test_plain_pyarrow_fileio_fails_through_the_same_proxy(proxy, s3_properties, files):
    """The proxy reproduces the measured failure: without the retrying FileIO, reads fail."""
    plain = PyArrowFileIO(proxy.properties(s3_properties))
    proxy.set_rates(**HEAVY)
    failures: list[str] = []
    for _ in range(20):  # bounded; at these rates the first few reads fail
        for path in files:
            try:
                with plain.new_input(path).open() as stream:
                    pq.ParquetFile(stream).read()
            except OSError as error:
                failures.append(str(error))
        if failures:
            break
    assert failures, "no read failed without retries: the proxy does not reproduce the problem"


def test_lost_delete_answer_counts_as_deleted(proxy, file_io, s3_bucket, s3_client):
    s3_client.put_object(Bucket=s3_bucket, Key="gone/k", Body=b"x")
    dropped = []

    def first_delete(method: str, target: str) -> bool:
        if method == "DELETE" and not dropped:
            dropped.append(target)
            return True
        return False

    proxy.fault_filter = first_delete
    proxy.set_rates(drop_rate=1.0)
    file_io.delete(f"s3://{s3_bucket}/gone/k")
    assert dropped and proxy.counts["drop"] >= 1
    left = s3_client.list_objects_v2(Bucket=s3_bucket, Prefix="gone/").get("Contents", [])
    assert [o["Key"] for o in left] == ["gone/"]  # pyarrow leaves a directory marker in place


def test_a_failed_block_uploads_nothing(file_io, s3_bucket, s3_client):
    path = f"s3://{s3_bucket}/partial.parquet"
    with pytest.raises(RuntimeError, match="writer failed"), file_io.new_output(path).create() as stream:
        assert isinstance(stream, RetryingUploadStream)
        stream.write(b"half a file")
        raise RuntimeError("writer failed")
    assert s3_client.list_objects_v2(Bucket=s3_bucket).get("KeyCount") == 0
    with file_io.new_output(path).create() as stream:
        stream.write(b"whole")
    with pytest.raises(FileExistsError, match=path):
        file_io.new_output(path).create(overwrite=False)
    assert file_io.new_input(path).open().read() == b"whole"


def test_local_files_go_straight_through(tmp_path):
    fio = RetryingPyArrowFileIO({})
    path = str(tmp_path / "x" / "f.bin")
    with fio.new_output(path).create() as stream:
        assert isinstance(stream, pa.NativeFile)
        stream.write(b"local")
    with fio.new_input(f"file://{path}").open() as stream:
        assert isinstance(stream, pa.NativeFile) and stream.read() == b"local"
    fio.delete(path)
    assert not os.path.exists(path)


def test_policy_properties_and_pickling(proxy, s3_properties, files):
    fio = RetryingPyArrowFileIO({**proxy.properties(s3_properties), RETRY_ATTEMPTS: "5"})
    assert fio.policy.attempts == 5
    assert fio.properties[S3_RETRY_STRATEGY_IMPL] == ONE_ATTEMPT_S3_RETRY_STRATEGY_IMPL
    own = RetryingPyArrowFileIO({S3_RETRY_STRATEGY_IMPL: "my.Strategy"})
    assert own.properties[S3_RETRY_STRATEGY_IMPL] == "my.Strategy"
    copy = pickle.loads(pickle.dumps(fio))
    assert copy.policy == fio.policy
    path, (_, raw) = next(iter(files.items()))
    with copy.new_input(path).open() as stream:
        assert isinstance(stream, ResumableInputStream) and stream.read() == raw
    for bad in ({RETRY_ATTEMPTS: "0"}, {RETRY_ATTEMPTS: "many"}, {RETRY_MAX_DELAY_MS: "-1"}):
        with pytest.raises(ConfigError, match=RETRY_ATTEMPTS):
            policy_from_properties(bad)


def test_runtime_and_catalog_use_the_retrying_fileio(tmp_path):
    module, _, name = RETRYING_IO_IMPL.rpartition(".")
    assert getattr(importlib.import_module(module), name) is RetryingPyArrowFileIO
    assert runtime_module.RETRYING_IO_IMPL is RETRYING_IO_IMPL
    assert with_retrying_io({"a": "b"}) == {"a": "b", "py-io-impl": RETRYING_IO_IMPL}
    assert with_retrying_io({"py-io-impl": "my.FileIO"}) == {"py-io-impl": "my.FileIO"}
    runtime = Runtime("file:///tmp/shuffle", {}, {"s3.secret-access-key": SECRET})
    assert isinstance(pickle.loads(pickle.dumps(runtime)).file_io(), RetryingPyArrowFileIO)
    assert SECRET not in repr(runtime)

    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    catalog = SqlCatalog(
        "t", **with_retrying_io({"uri": f"sqlite:///{tmp_path}/c.db", "warehouse": f"file://{tmp_path}/wh"})
    )
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.t", Schema(NestedField(1, "id", LongType())))
    assert isinstance(table.io, RetryingPyArrowFileIO)
    assert isinstance(catalog.load_table("ns.t").io, RetryingPyArrowFileIO)


@pytest.mark.parametrize(
    ("message", "transient"),
    [
        ("AWS Error INTERNAL_FAILURE during GetObject operation: Failed to flush response stream", True),
        (
            "AWS Error NETWORK_CONNECTION during HeadObject operation: curlCode: 52, Empty reply from server",
            True,
        ),
        ("AWS Error UNKNOWN (HTTP status 500) during HeadObject operation: No response body.", True),
        ("AWS Error SERVICE_UNAVAILABLE during GetObject operation: ", True),
        ("AWS Error SLOW_DOWN during PutObject operation: Please reduce your request rate.", True),
        ("AWS Error UNKNOWN (HTTP status 429) during GetObject operation", True),
        ("AWS Error UNKNOWN (HTTP status 403) during HeadObject operation: No response body.", False),
        ("AWS Error ACCESS_DENIED during GetObject operation: Access Denied", False),
        ("AWS Error UNKNOWN (HTTP status 400) during CreateMultipartUpload operation", False),
        ("AWS Error NO_SUCH_BUCKET during HeadObject operation", False),
        ("Parquet magic bytes not found in footer", False),
    ],
)
def test_transient_classification(message, transient):
    assert is_transient(OSError(message)) is transient


def test_permanent_and_plain_errors_are_not_transient():
    assert not is_transient(FileNotFoundError("Failed to flush response stream"))
    assert not is_transient(PermissionError("HTTP status 503"))
    assert not is_transient(ValueError("timed out"))
    assert is_transient(ConnectionResetError())
    assert is_transient(TimeoutError())

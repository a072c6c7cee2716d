"""S3ObjectStore against a real (moto) S3 server over HTTP."""

from __future__ import annotations

import hashlib
import io
import os
import socket
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from cdc_devtools.fault_proxy import first_requests
from iceberg_cdc.errors import ObjectNotFoundError, ShortObjectError, StorageError, TransientStorageError
from iceberg_cdc.retry import RetryPolicy
from iceberg_cdc.shuffle.layout import data_key, index_key
from iceberg_cdc.shuffle.partitioner import HashPartitioner
from iceberg_cdc.shuffle.reader import read_index
from iceberg_cdc.shuffle.rows import OP_COLUMN, Op, shuffle_schema
from iceberg_cdc.shuffle.writer import MapOutputWriter
from iceberg_cdc.storage import ObjectInfo, open_store
from iceberg_cdc.storage.s3 import S3ObjectStore, split_s3_uri
from iceberg_cdc.storage.s3 import s3_client as make_s3_client
from tests.support.shuffle_reads import read_span

pytestmark = pytest.mark.s3

MIB = 1024 * 1024


def test_open_store_gives_an_s3_store(s3_store, s3_bucket):
    assert isinstance(s3_store, S3ObjectStore)
    assert s3_store.uri == f"s3://{s3_bucket}/shuffle"
    assert s3_store.describe("a/b.data") == f"s3://{s3_bucket}/shuffle/a/b.data"


def test_split_s3_uri():
    assert split_s3_uri("s3://bucket/a/b/") == ("bucket", "a/b")
    assert split_s3_uri("s3://bucket") == ("bucket", "")
    with pytest.raises(ValueError, match="no bucket"):
        split_s3_uri("s3:///prefix")
    with pytest.raises(ValueError, match="not an s3"):
        split_s3_uri("gs://bucket/prefix")


def test_put_get_get_range_list_delete(s3_store, s3_client, s3_bucket):
    s3_store.put("a/one.data", b"0123456789")
    s3_store.put("a/two.data", b"")
    s3_store.put("a/sub/three.data", b"xyz")
    s3_store.put("b/other.data", b"keep me")

    assert s3_store.get("a/one.data") == b"0123456789"
    assert s3_store.get("a/two.data") == b""
    assert s3_store.get_range("a/one.data", 0, 10) == b"0123456789"
    assert s3_store.get_range("a/one.data", 3, 7) == b"3456"
    assert s3_store.get_range("a/one.data", 9, 10) == b"9"
    assert s3_store.get_range("a/one.data", 4, 4) == b""

    # keys are stored under the store's prefix and listed relative to it
    raw_keys = sorted(o["Key"] for o in s3_client.list_objects_v2(Bucket=s3_bucket)["Contents"])
    assert raw_keys == [
        "shuffle/a/one.data",
        "shuffle/a/sub/three.data",
        "shuffle/a/two.data",
        "shuffle/b/other.data",
    ]
    assert s3_store.list("a/") == [
        ObjectInfo("a/one.data", 10),
        ObjectInfo("a/sub/three.data", 3),
        ObjectInfo("a/two.data", 0),
    ]
    assert s3_store.list("a/one") == [ObjectInfo("a/one.data", 10)]
    assert s3_store.list("nothing/") == []

    assert s3_store.delete_prefix("a/") == 3
    assert s3_store.list("a/") == []
    assert s3_store.get("b/other.data") == b"keep me"
    assert s3_store.delete_prefix("a/") == 0


def test_overwrite_replaces_the_object(s3_store):
    s3_store.put("k", b"first version, longer")
    s3_store.put("k", b"second")
    assert s3_store.get("k") == b"second"
    assert s3_store.list("k") == [ObjectInfo("k", 6)]


def test_store_without_prefix(s3_bucket, s3_properties):
    store = open_store(f"s3://{s3_bucket}", s3_properties)
    store.put("top.data", b"abc")
    assert store.list("") == [ObjectInfo("top.data", 3)]
    assert store.get_range("top.data", 1, 3) == b"bc"


def test_multipart_upload(s3_bucket, s3_properties, s3_client):
    store = open_store(f"s3://{s3_bucket}/mp", {**s3_properties, "s3.part-size": str(5 * MIB)})
    assert store.part_size == 5 * MIB
    payload = np.random.default_rng(7).integers(0, 256, 12 * MIB + 12345, dtype=np.uint8).tobytes()
    with store.open_writer("big.data") as writer:
        for start in range(0, len(payload), MIB - 1):  # chunks that do not line up with parts
            writer.write(payload[start : start + MIB - 1])
    assert store.requests["CREATE_MULTIPART"] == 1
    assert store.requests["UPLOAD_PART"] == 3  # 5 MiB + 5 MiB + the rest
    assert store.requests["COMPLETE_MULTIPART"] == 1
    assert store.requests["PUT"] == 0
    head = s3_client.head_object(Bucket=s3_bucket, Key="mp/big.data")
    assert head["ContentLength"] == len(payload)
    assert head["ETag"].strip('"').endswith("-3")  # a multipart object of 3 parts
    assert store.get("big.data") == payload
    boundary = 5 * MIB
    assert (
        store.get_range("big.data", boundary - 100, boundary + 100)
        == payload[boundary - 100 : boundary + 100]
    )
    assert store.list("big") == [ObjectInfo("big.data", len(payload))]


def test_multipart_exactly_one_part(s3_bucket, s3_properties):
    store = open_store(f"s3://{s3_bucket}/mp", {**s3_properties, "s3.part-size": str(5 * MIB)})
    payload = os.urandom(5 * MIB)
    store.put("one.data", payload)
    assert store.requests["UPLOAD_PART"] == 1
    assert store.requests["COMPLETE_MULTIPART"] == 1
    assert store.get("one.data") == payload


def test_small_object_is_a_single_put(s3_store):
    s3_store.put("small", b"x" * 1000)
    assert s3_store.requests["PUT"] == 1
    assert s3_store.requests["CREATE_MULTIPART"] == 0


def test_failed_multipart_write_is_aborted(s3_bucket, s3_properties, s3_client):
    store = open_store(f"s3://{s3_bucket}/mp", {**s3_properties, "s3.part-size": str(5 * MIB)})
    with pytest.raises(RuntimeError, match="task failed"), store.open_writer("partial.data") as writer:
        writer.write(os.urandom(6 * MIB))
        raise RuntimeError("task failed")
    assert store.requests["UPLOAD_PART"] == 1
    assert store.list("partial") == []
    assert s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []


def test_part_size_below_the_s3_minimum_is_rejected(s3_bucket, s3_properties):
    with pytest.raises(ValueError, match="at least 5 MiB"):
        open_store(f"s3://{s3_bucket}/x", {**s3_properties, "s3.part-size": str(MIB)})


@pytest.mark.parametrize("size", [100, 6 * MIB], ids=["put", "multipart"])
def test_server_side_encryption(s3_bucket, s3_properties, s3_client, size):
    properties = {**s3_properties, "s3.sse": "AES256", "s3.part-size": str(5 * MIB)}
    store = open_store(f"s3://{s3_bucket}/enc", properties)
    assert store.sse_args == {"ServerSideEncryption": "AES256"}
    payload = os.urandom(size)
    store.put("secret.data", payload)
    head = s3_client.head_object(Bucket=s3_bucket, Key="enc/secret.data")
    assert head["ServerSideEncryption"] == "AES256"
    assert store.get("secret.data") == payload


def test_without_sse_nothing_is_requested(s3_store, s3_client, s3_bucket):
    assert s3_store.sse_args == {}
    s3_store.put("plain", b"abc")
    head = s3_client.head_object(Bucket=s3_bucket, Key="shuffle/plain")
    assert head.get("ServerSideEncryption") in (None, "AES256")  # AES256 if the bucket defaults to it


def test_get_range_past_the_end(s3_store):
    s3_store.put("short", b"0123456789")
    with pytest.raises(StorageError, match="short"):
        s3_store.get_range("short", 5, 20)  # starts inside, ends past the end
    with pytest.raises(StorageError, match="short"):
        s3_store.get_range("short", 10, 20)  # starts at the end
    with pytest.raises(StorageError, match="short"):
        s3_store.get_range("short", 50, 60)  # starts past the end


def test_missing_key(s3_store, s3_bucket):
    for call in (lambda: s3_store.get("nope"), lambda: s3_store.get_range("nope", 0, 10)):
        with pytest.raises(ObjectNotFoundError) as info:
            call()
        assert f"s3://{s3_bucket}/shuffle/nope" in str(info.value)


def test_missing_bucket(s3_properties):
    store = open_store("s3://no-such-bucket-for-cdc-tests/shuffle", s3_properties)
    for call in (
        lambda: store.get("x"),
        lambda: store.get_range("x", 0, 5),
        lambda: store.put("x", b"data"),
        lambda: store.list(""),
        lambda: store.delete_prefix("x"),
    ):
        with pytest.raises(StorageError) as info:
            call()
        assert not isinstance(info.value, ObjectNotFoundError)
        assert "no-such-bucket-for-cdc-tests" in str(info.value)


def test_unreachable_endpoint_is_a_storage_error(s3_properties):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once the socket closes
    properties = {**s3_properties, "s3.endpoint": f"http://127.0.0.1:{port}"}
    store = S3ObjectStore("s3://bucket/p", make_s3_client(properties), request_attempts=1)
    with pytest.raises(StorageError, match="reachable"):
        store.get("x")


# -- a shuffle through S3 ------------------------------------------------------------------------

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("tags", pa.list_(pa.string()))])


def _batch(start: int, stop: int) -> pa.RecordBatch:
    ids = list(range(start, stop))
    return pa.record_batch(
        [
            pa.array(ids, pa.int64()),
            pa.array([f"n{i}" for i in ids]),
            pa.array([[str(i)] * (i % 3) for i in ids]),
        ],
        schema=SCHEMA,
    )


def test_map_outputs_through_s3_one_ranged_get_per_map_output(s3_store, tmp_path):
    num_partitions = 40
    partitioner = HashPartitioner(num_partitions, ["id"])
    names = [f"snap-1/map-{m:05d}" for m in range(3)]
    written: dict[str, list] = {}
    for m, name in enumerate(names):
        inserts, deletes = _batch(m * 10_000, m * 10_000 + 3000), _batch(m * 10_000 + 5000, m * 10_000 + 5500)
        with MapOutputWriter(
            s3_store,
            name,
            SCHEMA,
            partitioner,
            buffer_bytes=32 * 1024,
            block_bytes=4096,
            spill_dir=str(tmp_path),
        ) as writer:
            writer.write(inserts, Op.INSERT)
            writer.write(deletes, Op.DELETE)
            stats = writer.commit()
        assert stats.spills > 1
        written[name] = [(inserts, Op.INSERT), (deletes, Op.DELETE)]

    sizes = {info.key: info.size for info in s3_store.list("snap-1/")}
    assert set(sizes) == {data_key(n) for n in names} | {index_key(n) for n in names}
    indexes = {n: read_index(s3_store, n, num_partitions, sizes[data_key(n)]) for n in names}
    schema = shuffle_schema(SCHEMA)

    for start, end in [(0, num_partitions), (5, 17), (39, 40), (12, 13)]:
        before = s3_store.requests.copy()
        got: Counter = Counter()
        for name in names:
            for batch in read_span(s3_store, indexes[name], start, end, schema):
                got.update(
                    zip(batch.column("id").to_pylist(), batch.column(OP_COLUMN).to_pylist(), strict=True)
                )
        delta = s3_store.requests - before
        nonempty = sum(
            1 for n in names if indexes[n].byte_range(start, end)[0] < indexes[n].byte_range(start, end)[1]
        )
        assert nonempty == len(names)
        assert delta == Counter({"GET_RANGE": len(names)}), f"range [{start}, {end})"

        want: Counter = Counter()
        for batches in written.values():
            for batch, op in batches:
                partitions = partitioner.partitions(batch)
                ids = batch.column("id").to_numpy()[(partitions >= start) & (partitions < end)]
                want.update((int(i), int(op)) for i in ids)
        assert got == want


# -- transient S3 errors: every verb through the fault proxy ----------------------------------------


@pytest.fixture
def proxy(moto_server):
    from cdc_devtools.fault_proxy import FaultProxy

    with FaultProxy(moto_server.endpoint, seed=4242) as running:
        yield running


def proxied_store(proxy, s3_properties, bucket: str, attempts: int = 8) -> S3ObjectStore:
    client = make_s3_client(proxy.properties(s3_properties))
    return S3ObjectStore(f"s3://{bucket}/shuffle", client, part_size=5 * MIB, request_attempts=attempts)


@pytest.mark.parametrize("failures", [0, 1, 3, 7])
@pytest.mark.parametrize("verb", ["GET", "PUT"])
def test_n_transient_failures_then_success_reach_s3_n_plus_one_times(
    proxy, s3_properties, s3_bucket, s3_client, verb, failures
):
    """One retry layer: botocore makes one attempt, the store retries; nothing multiplies the requests."""
    key = f"n-plus-one-{verb}-{failures}.data"
    s3_client.put_object(Bucket=s3_bucket, Key=f"shuffle/{key}", Body=b"before")
    store = proxied_store(proxy, s3_properties, s3_bucket)
    store.policy = RetryPolicy(store.policy.attempts, 0.0, 0.0)
    proxy.fault_filter = first_requests(failures, key)
    proxy.set_rates(error_rate=1.0)
    if verb == "GET":
        assert store.get(key) == b"before"
    else:
        store.put(key, b"after")
    assert proxy.requests_for(key, verb) == failures + 1
    assert s3_client.get_object(Bucket=s3_bucket, Key=f"shuffle/{key}")["Body"].read() == (
        b"before" if verb == "GET" else b"after"
    )


def test_more_failures_than_the_budget_name_the_object_and_the_requests_made(
    proxy, s3_properties, s3_bucket, s3_client
):
    key = "over-budget.data"
    s3_client.put_object(Bucket=s3_bucket, Key=f"shuffle/{key}", Body=b"x")
    store = proxied_store(proxy, s3_properties, s3_bucket, attempts=4)
    store.policy = RetryPolicy(4, 0.0, 0.0)
    proxy.fault_filter = first_requests(100, key)
    proxy.error_statuses = (503,)
    proxy.set_rates(error_rate=1.0)
    with pytest.raises(TransientStorageError) as raised:
        store.get(key)
    assert raised.value.attempts == 4 == proxy.requests_for(key, "GET")
    assert f"s3://{s3_bucket}/shuffle/{key}" in str(raised.value)
    assert "SlowDown for 4 attempts" in str(raised.value)


def test_every_verb_survives_errors_drops_and_cut_bodies(proxy, s3_properties, s3_bucket, s3_client):
    store = proxied_store(proxy, s3_properties, s3_bucket)
    # SlowDown (503) is throttling to botocore: it backs off ~1 s x 2^n, so fewer of them here.
    proxy.set_rates(error_rate=0.2, drop_rate=0.1, cut_rate=0.1)
    payloads = {f"a/{n}.data": os.urandom(50_000 + n) for n in range(8)}
    for key, data in payloads.items():
        store.put(key, data)
    big = os.urandom(11 * MIB + 5)
    store.put("a/big.data", big)  # multipart: create, 3 parts, complete
    for key, data in payloads.items():
        assert store.get(key) == data
        assert store.get_range(key, 1000, 2000) == data[1000:2000]
    assert store.get_range("a/big.data", 5 * MIB - 10, 5 * MIB + 10) == big[5 * MIB - 10 : 5 * MIB + 10]
    assert {info.key for info in store.list("a/")} == {*payloads, "a/big.data"}

    # Conditional writes: a lost answer comes back as "not done" although it was done; the
    # caller recognises its own write by reading it back (as coordination.lease does by token).
    for n in range(6):
        key, mine = f"leases/{n}.json", f"token-{n}".encode()
        version = store.put_if_absent(key, mine)
        found = store.get_with_version(key)
        assert found is not None and found[0] == mine
        assert version is None or version == found[1]
        newer = mine + b"-renewed"
        if store.put_if_version(key, newer, found[1]) is None:
            assert store.get_with_version(key)[0] == newer, "a failed put_if_version wrote nothing else"
        current = store.get_with_version(key)
        if not store.delete_if_version(key, current[1]):
            assert store.get_with_version(key) is None, "the lost delete did delete"

    assert store.delete_prefix("a/") == len(payloads) + 1
    assert store.list("") == []
    proxy.set_rates(error_rate=0.0, drop_rate=0.0, cut_rate=0.0)
    assert s3_client.list_objects_v2(Bucket=s3_bucket).get("KeyCount") == 0
    counts = proxy.counts
    assert counts["error_500"] and counts["error_503"] and counts["drop"] and counts["cut"], counts
    faulted = {r.method for r in proxy.records if r.fault != "none"}
    assert {"GET", "PUT", "POST", "DELETE"} <= faulted


def test_exhausted_retries_are_transient_errors_naming_the_object(proxy, s3_properties, s3_bucket):
    store = proxied_store(proxy, s3_properties, s3_bucket, attempts=3)
    proxy.set_rates(error_rate=1.0)
    where = f"s3://{s3_bucket}/shuffle/k.data"
    for call in (
        lambda: store.get("k.data"),
        lambda: store.get_range("k.data", 0, 5),
        lambda: store.put("k.data", b"x"),
        lambda: store.put_if_absent("k.data", b"x"),
        lambda: store.list("k.data"),
    ):
        with pytest.raises(TransientStorageError) as raised:
            call()
        error = raised.value
        assert isinstance(error, StorageError) and error.retry_safe
        assert error.attempts == 3  # the store's attempts; botocore makes one per attempt
        assert where in str(error) and "Retrying the DAG run is safe" in str(error)
    proxy.set_rates(error_rate=0.0, drop_rate=1.0)
    with pytest.raises(TransientStorageError, match="reachable"):
        store.get("k.data")


def test_a_body_cut_on_every_attempt_is_a_transient_error(proxy, s3_properties, s3_bucket, s3_client):
    s3_client.put_object(Bucket=s3_bucket, Key="shuffle/cut.data", Body=os.urandom(100_000))
    store = proxied_store(proxy, s3_properties, s3_bucket, attempts=2)
    proxy.set_rates(cut_rate=1.0)
    with pytest.raises(
        TransientStorageError, match=r"cut\.data: S3 get_object response body broke off 2 times"
    ):
        store.get("cut.data")


class _Flaky:
    """A boto3 client double: the real client, with chosen calls misbehaving once."""

    def __init__(self, real, **overrides) -> None:
        self._real = real
        self._overrides = overrides
        self.meta = real.meta

    def __getattr__(self, name: str):
        return self._overrides.get(name) or getattr(self._real, name)


def test_batch_delete_retries_keys_that_failed_transiently(s3_store, s3_bucket, s3_client):
    for n in range(5):
        s3_store.put(f"d/{n}", b"x")
    real = s3_store.client
    calls = []

    def delete_objects(**kwargs):
        calls.append([o["Key"] for o in kwargs["Delete"]["Objects"]])
        if len(calls) == 1:  # S3 deletes some keys and reports the others as failed, with a 200
            objects = kwargs["Delete"]["Objects"]
            real.delete_objects(Bucket=kwargs["Bucket"], Delete={"Objects": objects[:2], "Quiet": True})
            return {
                "Errors": [
                    {"Key": o["Key"], "Code": "InternalError", "Message": "retry"} for o in objects[2:]
                ]
            }
        return real.delete_objects(**kwargs)

    s3_store.client = _Flaky(real, delete_objects=delete_objects)
    assert s3_store.delete_prefix("d/") == 5
    assert calls == [[f"shuffle/d/{n}" for n in range(5)], [f"shuffle/d/{n}" for n in range(2, 5)]]
    assert s3_client.list_objects_v2(Bucket=s3_bucket).get("KeyCount") == 0

    s3_store.put("d/denied", b"x")

    def denied(**kwargs):
        return {"Errors": [{"Key": "shuffle/d/denied", "Code": "AccessDenied", "Message": "no"}]}

    s3_store.client = _Flaky(real, delete_objects=denied)
    with pytest.raises(StorageError, match=f"s3://{s3_bucket}/shuffle/d/denied: delete failed .AccessDenied"):
        s3_store.delete_prefix("d/")


def _no_such_upload():
    import botocore.exceptions

    return botocore.exceptions.ClientError(
        {"Error": {"Code": "NoSuchUpload", "Message": "gone"}, "ResponseMetadata": {"HTTPStatusCode": 404}},
        "CompleteMultipartUpload",
    )


def test_a_lost_complete_answer_is_recognised_by_the_etag(s3_bucket, s3_properties, s3_client):
    store = open_store(f"s3://{s3_bucket}/mp", {**s3_properties, "s3.part-size": str(5 * MIB)})
    real = store.client

    def completed_then_lost(**kwargs):
        real.complete_multipart_upload(**kwargs)  # applied, but the answer never arrives;
        raise _no_such_upload()  # botocore's retry then finds the upload gone

    store.client = _Flaky(real, complete_multipart_upload=completed_then_lost)
    payload = os.urandom(7 * MIB)
    store.put("lost.data", payload)
    assert store.get("lost.data") == payload
    head = s3_client.head_object(Bucket=s3_bucket, Key="mp/lost.data")
    assert head["ETag"].strip('"').endswith("-2")

    def never_completed(**kwargs):
        raise _no_such_upload()

    store.client = _Flaky(real, complete_multipart_upload=never_completed)
    with pytest.raises(StorageError, match=f"s3://{s3_bucket}/mp/other.data"):
        store.put("other.data", os.urandom(6 * MIB))
    assert store.list("other") == []


def test_multipart_etag_matches_s3():
    from iceberg_cdc.storage.s3 import multipart_etag

    parts = [b"a" * 10, b"b" * 20]
    etags = ['"' + hashlib.md5(p).hexdigest() + '"' for p in parts]
    expected = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest() + "-2"
    assert multipart_etag(etags) == expected


def test_a_range_streamed_to_a_sink_survives_cut_bodies_and_resumes(
    proxy, s3_properties, s3_bucket, s3_client
):
    data = os.urandom(3 * MIB + 17)
    s3_client.put_object(Bucket=s3_bucket, Key="shuffle/stream.data", Body=data)
    store = proxied_store(proxy, s3_properties, s3_bucket)
    proxy.set_rates(cut_rate=0.2, error_rate=0.1)
    ranges = [(0, len(data)), (123, 2 * MIB + 5), (len(data) - 1, len(data))]
    ranges += [(n * 100_000, n * 100_000 + MIB) for n in range(20)]
    for start, end in ranges:
        sink = io.BytesIO()
        store.get_range_into("stream.data", start, end, sink)
        assert sink.getvalue() == data[start:end]
    proxy.set_rates(cut_rate=0.0, error_rate=0.0)
    assert proxy.counts["cut"], proxy.counts
    with pytest.raises(ShortObjectError):
        store.get_range_into("stream.data", len(data) - 5, len(data) + 5, io.BytesIO())


def test_a_streamed_range_cut_on_every_attempt_is_a_transient_error(
    proxy, s3_properties, s3_bucket, s3_client
):
    s3_client.put_object(Bucket=s3_bucket, Key="shuffle/cut.data", Body=os.urandom(2 * MIB))
    store = proxied_store(proxy, s3_properties, s3_bucket, attempts=2)
    proxy.set_rates(cut_rate=1.0)
    with pytest.raises(
        TransientStorageError, match=r"cut\.data: S3 get_object response body broke off 2 times"
    ):
        store.get_range_into("cut.data", 0, 2 * MIB, io.BytesIO())

"""The fault-injecting proxy: faithful when quiet, and each fault kind does what it says."""

from __future__ import annotations

import http.client
import os
import socket
import time
import uuid
from collections.abc import Iterator

import boto3
import botocore.config
import botocore.exceptions
import pytest

from cdc_devtools.fault_proxy import FaultProxy, first_requests
from cdc_devtools.local_s3 import DUMMY_CREDENTIALS, LocalS3Server

pytestmark = pytest.mark.s3

MIB = 1024 * 1024


@pytest.fixture
def proxy(moto_server: LocalS3Server) -> Iterator[FaultProxy]:
    with FaultProxy(moto_server.endpoint, seed=11) as running:
        yield running


@pytest.fixture
def bucket(s3_client) -> str:
    name = f"proxy-test-{uuid.uuid4().hex[:16]}"
    s3_client.create_bucket(Bucket=name)
    return name


def client(proxy: FaultProxy, attempts: int = 1):
    """A boto3 client through the proxy; one attempt, so a fault is seen as it is."""
    return boto3.client(
        "s3",
        endpoint_url=proxy.endpoint,
        aws_access_key_id=DUMMY_CREDENTIALS["s3.access-key-id"],
        aws_secret_access_key=DUMMY_CREDENTIALS["s3.secret-access-key"],
        region_name="us-east-1",
        config=botocore.config.Config(
            retries={"total_max_attempts": attempts, "mode": "standard"}, s3={"addressing_style": "path"}
        ),
    )


def signed_path(proxy: FaultProxy, operation: str, bucket: str, key: str) -> str:
    """A presigned path for the proxy's address (moto refuses unsigned GET and HEAD)."""
    url = client(proxy).generate_presigned_url(operation, Params={"Bucket": bucket, "Key": key})
    return url[len(proxy.endpoint) :]


def test_quiet_proxy_relays_every_verb_over_kept_alive_connections(proxy, bucket, s3_client):
    s3 = client(proxy)
    payload = os.urandom(3 * MIB + 17)
    s3.put_object(Bucket=bucket, Key="a/one", Body=payload)
    assert s3.get_object(Bucket=bucket, Key="a/one")["Body"].read() == payload
    assert s3.get_object(Bucket=bucket, Key="a/one", Range="bytes=5-9")["Body"].read() == payload[5:10]
    assert s3.head_object(Bucket=bucket, Key="a/one")["ContentLength"] == len(payload)
    upload = s3.create_multipart_upload(Bucket=bucket, Key="a/big")["UploadId"]
    parts = [os.urandom(5 * MIB), b"tail"]
    etags = [
        s3.upload_part(Bucket=bucket, Key="a/big", UploadId=upload, PartNumber=n + 1, Body=part)["ETag"]
        for n, part in enumerate(parts)
    ]
    s3.complete_multipart_upload(
        Bucket=bucket,
        Key="a/big",
        UploadId=upload,
        MultipartUpload={"Parts": [{"ETag": e, "PartNumber": n + 1} for n, e in enumerate(etags)]},
    )
    assert s3_client.get_object(Bucket=bucket, Key="a/big")["Body"].read() == b"".join(parts)
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="a/")["Contents"]
    assert sorted(o["Key"] for o in listed) == ["a/big", "a/one"]
    s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "a/one"}, {"Key": "a/big"}]})
    assert s3_client.list_objects_v2(Bucket=bucket).get("KeyCount") == 0

    assert proxy.faults == 0
    assert proxy.counts["requests"] == proxy.counts["forwarded"] == 10
    assert proxy.by_method == {"PUT": 3, "GET": 3, "HEAD": 1, "POST": 3}
    assert proxy.counts["connections"] == 1  # one connection, kept alive across all of them
    assert all(record.fault == "none" for record in proxy.records)


def test_chunked_request_body_and_head_on_one_connection(proxy, bucket, s3_client):
    connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    chunks = [b"first chunk;", os.urandom(70_000), b"", b"last"]
    connection.request("PUT", f"/{bucket}/chunked", body=iter(chunks), encode_chunked=True)
    response = connection.getresponse()
    response.read()
    assert response.status == 200
    connection.request("HEAD", signed_path(proxy, "head_object", bucket, "chunked"))
    head = connection.getresponse()
    assert head.status == 200 and head.read() == b""
    assert int(head.getheader("Content-Length")) == sum(map(len, chunks))
    # the same connection still works after a HEAD (no body to wait for)
    connection.request("GET", signed_path(proxy, "get_object", bucket, "chunked"))
    assert connection.getresponse().read() == b"".join(chunks)
    connection.close()
    assert proxy.counts["connections"] == 1
    assert s3_client.get_object(Bucket=bucket, Key="chunked")["Body"].read() == b"".join(chunks)


def test_expect_100_continue_is_answered_by_the_proxy(proxy, bucket, s3_client):
    body = os.urandom(2048)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        sock.sendall(
            (
                f"PUT /{bucket}/expect HTTP/1.1\r\nHost: 127.0.0.1:{proxy.port}\r\n"
                f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n"
            ).encode()
        )
        assert sock.recv(64).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(body)
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 200")
    assert s3_client.get_object(Bucket=bucket, Key="expect")["Body"].read() == body


def test_errors_are_s3_answers_and_nothing_is_forwarded(proxy, bucket, s3_client):
    proxy.set_rates(error_rate=1.0)
    s3 = client(proxy)
    codes = set()
    for n in range(12):
        with pytest.raises(botocore.exceptions.ClientError) as raised:
            s3.put_object(Bucket=bucket, Key=f"never-{n}", Body=b"x")
        error = raised.value.response
        codes.add((error["ResponseMetadata"]["HTTPStatusCode"], error["Error"]["Code"]))
    assert codes == {(500, "InternalError"), (503, "SlowDown")}
    assert s3_client.list_objects_v2(Bucket=bucket).get("KeyCount") == 0
    assert proxy.counts["forwarded"] == 0
    assert proxy.counts["error_500"] + proxy.counts["error_503"] == proxy.faults == 12
    assert proxy.counts["connections"] == 1  # an error answer keeps the connection


def test_a_dropped_request_was_applied_but_never_answered(proxy, bucket, s3_client):
    proxy.set_rates(drop_rate=1.0)
    with pytest.raises(botocore.exceptions.ConnectionClosedError):
        client(proxy).put_object(Bucket=bucket, Key="applied", Body=b"done anyway")
    assert s3_client.get_object(Bucket=bucket, Key="applied")["Body"].read() == b"done anyway"
    assert proxy.counts["drop"] == 1 and proxy.counts["forwarded"] == 1
    assert proxy.records[-1].status is None


def test_a_cut_response_sends_the_headers_and_part_of_the_body(proxy, bucket, s3_client):
    payload = os.urandom(MIB)
    s3_client.put_object(Bucket=bucket, Key="cut", Body=payload)
    proxy.set_rates(cut_rate=1.0)
    path = signed_path(proxy, "get_object", bucket, "cut")
    for _ in range(3):
        connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
        connection.request("GET", path)
        response = connection.getresponse()
        assert response.status == 200 and int(response.getheader("Content-Length")) == len(payload)
        with pytest.raises(http.client.IncompleteRead) as raised:
            response.read()
        assert len(raised.value.partial) < len(payload)
        assert payload.startswith(raised.value.partial)
    with pytest.raises(botocore.exceptions.ResponseStreamingError):
        client(proxy).get_object(Bucket=bucket, Key="cut")["Body"].read()
    assert proxy.counts["cut"] == 4


def test_a_cut_without_a_body_is_a_drop(proxy, bucket, s3_client):
    s3_client.put_object(Bucket=bucket, Key="k", Body=b"abc")
    proxy.set_rates(cut_rate=1.0)
    with pytest.raises(botocore.exceptions.ConnectionClosedError):
        client(proxy).head_object(Bucket=bucket, Key="k")
    assert proxy.counts["drop"] == 1 and proxy.counts["cut"] == 0


def test_the_seed_fixes_the_sequence_of_faults(moto_server, bucket, s3_client):
    s3_client.put_object(Bucket=bucket, Key="k", Body=b"abc")
    sequences = []
    for _ in range(2):
        with FaultProxy(moto_server.endpoint, error_rate=0.3, drop_rate=0.2, cut_rate=0.2, seed=5) as proxy:
            # One request per connection, no retries: exactly 30 requests reach the proxy. (An SDK
            # client's retries and pooled keep-alive connections make the count depend on timing.)
            path = signed_path(proxy, "get_object", bucket, "k")
            for _ in range(30):
                connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
                try:
                    connection.request("GET", path, headers={"Connection": "close"})
                    connection.getresponse().read()
                except (OSError, http.client.HTTPException):
                    pass
                finally:
                    connection.close()
            deadline = time.monotonic() + 5
            while len(proxy.records) < 30 and time.monotonic() < deadline:
                time.sleep(0.01)
            sequences.append([record.fault for record in proxy.records])
    assert len(sequences[0]) == 30
    assert sequences[0] == sequences[1]
    assert {"none", "drop", "cut"} <= set(sequences[0])
    assert {"error_500", "error_503"} & set(sequences[0])


def test_rates_change_at_runtime_and_pause(proxy, bucket, s3_client):
    s3_client.put_object(Bucket=bucket, Key="k", Body=b"abc")
    s3 = client(proxy)
    proxy.set_rates(error_rate=1.0)
    with proxy.paused():
        assert proxy.rates == {"error_rate": 0.0, "drop_rate": 0.0, "cut_rate": 0.0}
        assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"abc"
    assert proxy.rates["error_rate"] == 1.0
    with pytest.raises(botocore.exceptions.ClientError):
        s3.get_object(Bucket=bucket, Key="k")
    proxy.fault_filter = lambda method, target: method == "PUT"
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"abc"
    proxy.set_rates(error_rate=0.0)
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"abc"
    assert proxy.faults == 1
    with pytest.raises(ValueError, match="sum to at most 1"):
        proxy.set_rates(error_rate=0.6, drop_rate=0.6)
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        proxy.set_rates(cut_rate=-0.1)


def test_only_loopback(moto_server):
    for upstream in ("http://localhost:9000", "http://10.0.0.1:9000", "https://127.0.0.1:9000"):
        with pytest.raises(ValueError, match=r"only forwards to http://127\.0\.0\.1"):
            FaultProxy(upstream)
    with FaultProxy(moto_server.endpoint) as proxy:
        assert proxy.endpoint.startswith("http://127.0.0.1:")
        assert proxy._listener is not None and proxy._listener.getsockname()[0] == "127.0.0.1"


def test_stop_ends_every_thread_and_the_port(moto_server, bucket):
    with FaultProxy(moto_server.endpoint) as proxy:
        s3 = client(proxy)
        s3.list_objects_v2(Bucket=bucket)  # leaves a kept-alive connection (and its thread) open
        port = proxy.port
        assert proxy.live_threads == 2
    deadline = time.monotonic() + 5
    while proxy.live_threads and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proxy.live_threads == 0
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


def test_first_requests_fault_only_the_first_n_for_one_key(proxy, bucket, s3_client):
    s3_client.put_object(Bucket=bucket, Key="first/a", Body=b"a")
    s3_client.put_object(Bucket=bucket, Key="first/b", Body=b"b")
    proxied = client(proxy)
    proxy.fault_filter = first_requests(2, "first/a", "GET")
    proxy.set_rates(error_rate=1.0)
    assert proxied.get_object(Bucket=bucket, Key="first/b")["Body"].read() == b"b"
    for _ in range(2):
        with pytest.raises(botocore.exceptions.ClientError):
            proxied.get_object(Bucket=bucket, Key="first/a")
    assert proxied.get_object(Bucket=bucket, Key="first/a")["Body"].read() == b"a"
    assert proxy.requests_for("first/a", "GET") == 3 and proxy.requests_for("first/b") == 1
    assert proxy.faults == 2

"""A moto S3 server of a test module's own that checks credentials, with one IAM user allowed to use S3.

Authentication is switched on (moto's reset-auth) only after the user is
made, so setting up needs no credentials; the session's shared server is
left alone.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import boto3

from cdc_devtools.local_s3 import LocalS3Server


@contextmanager
def auth_s3_server(log_dir: Path) -> Iterator[tuple[LocalS3Server, dict[str, str]]]:
    """(server, the user's ``s3.*`` properties with the server's endpoint)."""
    with LocalS3Server(log_path=log_dir / "server.log") as server:
        iam = boto3.client(
            "iam",
            endpoint_url=server.endpoint,
            region_name="us-east-1",
            aws_access_key_id="setup",
            aws_secret_access_key="setup",
        )
        iam.create_user(UserName="cdc")
        policy = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
        }
        iam.put_user_policy(UserName="cdc", PolicyName="s3", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="cdc")["AccessKey"]
        good = {
            "s3.endpoint": server.endpoint,
            "s3.access-key-id": key["AccessKeyId"],
            "s3.secret-access-key": key["SecretAccessKey"],
            "s3.region": "us-east-1",
        }
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        request = urllib.request.Request(
            f"{server.endpoint}/moto-api/reset-auth",
            data=b"0",
            method="POST",
            headers={"Content-Type": "text/plain"},
        )
        with opener.open(request, timeout=10) as response:
            assert response.status == 200
        yield server, good

"""One redaction module, used everywhere a person reads text; it fails closed."""

from __future__ import annotations

import re
import string
from pathlib import Path

import hypothesis.strategies as st
from hypothesis import example, given, settings

from iceberg_cdc import redaction
from iceberg_cdc.config import parse_config
from iceberg_cdc.redaction import MASK, WITHHELD, Redactor, redact, redact_value, secret_values

PACKAGE = Path(redaction.__file__).parent
# Shaped like an AWS access key id, built at run time so no file holds one.
FAKE_KEY_ID = "AKIA" + "ABCDEFGHIJKLMNOP"


def test_each_rule():
    cases = {
        "s3://key:hunter2@bucket/x": "hunter2",
        "postgresql://u:p/ss@w0rd@db:5432/cdc": "p/ss@w0rd",  # a password holding / and @
        "https://ghp_token123456@github.com/x": "ghp_token123456",  # a token as the user name
        "sc://h:15002/;token=tok123;session_id=abc": "tok123",
        "s3.secret-access-key=abcd1234 next": "abcd1234",
        'password: "p4ss word" next': "p4ss word",
        '{"s3.session-token": "FQoGZXIvYXdz"}': "FQoGZXIvYXdz",
        "S3_SECRET_KEY=xyz123": "xyz123",
        f"key {FAKE_KEY_ID} used": FAKE_KEY_ID,
        "Authorization: Bearer abcdefghijklmnop": "abcdefghijklmnop",
        "cookie _token=eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig": "eyJhbGciOiJIUzI1NiJ9",
        "https://b.s3.amazonaws.com/k?X-Amz-Signature=deadbeef99&X-Amz-Date=1": "deadbeef99",
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----": "MIIEow",
    }
    for text, secret in cases.items():
        out = redact(text)
        assert secret not in out and MASK in out, (text, out)
    # What names no secret is kept: error types, hosts, a Spark Connect session id, numbers.
    plain = (
        "SourceHistoryError: snapshot 5200992516889735211 of shop.orders at s3://bucket/x (session_id=abc)"
    )
    assert redact(plain) == plain
    assert redact("config value s3cr3t-value leaked", ["s3cr3t-value"]) == "config value *** leaked"
    assert redact("short abc stays", ["abc"]) == "short abc stays"  # too short to be a known secret


def test_it_fails_closed():
    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert redact(Unprintable()) == WITHHELD
    assert redact_value({"a": object(), "b": [1, "s3://u:pw12@h"]}) == {"a": MASK, "b": [1, "s3://u:***@h"]}
    assert redact_value({"password": 1234, "token": None}) == {"password": MASK, "token": None}


def test_the_config_repr_and_its_secret_values():
    config = parse_config(
        {
            "catalog": {
                "name": "c",
                "uri": "postgresql://u:pg-pass@db/x",
                "s3.secret-access-key": "sak-1234",
            },
            "shuffle": {"uri": "s3://b/p", "s3.session-token": "sess-5678"},
            "tables": [{"source": "a.b", "sink": "a.c"}],
            "spark": {"mode": "connect", "connect_url": "sc://h:15002/;token=conn-tok-1"},
        }
    )
    shown = repr(config) + str(config.redacted())
    for secret in ("pg-pass", "sak-1234", "sess-5678", "conn-tok-1"):
        assert secret not in shown
    assert secret_values(config.model_dump(mode="json")) >= {"pg-pass", "sak-1234", "sess-5678"}
    hide = Redactor(secret_values(config.model_dump(mode="json")))
    assert hide("error: bad sak-1234 here") == "error: bad *** here" and hide.known >= 3


_SECRET = st.text(alphabet=string.ascii_letters + string.digits + "/+=@:!$%", min_size=6, max_size=24)
_KEY = st.sampled_from(["password", "s3.secret-access-key", "token", "api_key", "aws_session_token"])
_NOISE = st.text(alphabet=string.ascii_letters + " .,:;/-", max_size=40)


@settings(max_examples=300, deadline=None)
@given(secret=_SECRET, key=_KEY, before=_NOISE, after=_NOISE, form=st.integers(0, 4))
# A URL parameter whose value holds an "@": the URL rule once took it for the end of a user-info.
@example(secret="@00000", key="password", before="", after="", form=4)
def test_a_secret_never_survives_in_any_of_its_shapes(secret, key, before, after, form):
    shapes = [
        f"{key}={secret}",
        f'"{key}": "{secret}"',
        f"{key}: '{secret}'",
        f"s3://user:{secret}@host/path",
        f"sc://host:15002/;{key}={secret}",
    ]
    text = f"{before} {shapes[form]} {after}"
    out = redact(text)
    # The secret may only remain where it is also part of the text around it (the key's name included).
    around = f"{before} {shapes[form].replace(secret, chr(0))} {after}"
    assert secret not in out or secret in around, (text, out)


def test_one_module_and_no_private_airflow_imports():
    """Every other copy of the rules is gone; nothing imports Airflow's private secrets masker."""
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        assert "_shared.secrets_masker" not in text and "_shared import secrets" not in text, path
        if path.name != "redaction.py":
            # A URL-password regex, a secret-key-hint list or a scrub function outside the module.
            assert not re.search(
                r"_URL_PASSWORD|_SECRET_HINTS|def scrub\(|class _Redactor|_without_url_secrets", text
            ), path


def test_a_known_secret_inside_a_longer_one_leaves_nothing_of_the_longer():
    """Longest first: masking the short one first would leave the rest of the long one readable."""
    long, short = "vault-abcd-efgh-ijkl", "vault-abcd"
    assert redact(f"read {long} from the store", secrets=[short, long]) == f"read {MASK} from the store"
    assert Redactor([long, short])(f"read {long} and {short}") == f"read {MASK} and {MASK}"

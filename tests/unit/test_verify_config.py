"""tables[].mirrors[].verify and repair: parsed, validated, and what 'due' means."""

from __future__ import annotations

import pytest

from iceberg_cdc.config import parse_config
from iceberg_cdc.errors import ConfigError
from iceberg_cdc.mirror.verify.record import due


def _mirror(**extra):
    raw = {
        "catalog": {"name": "c", "type": "sql", "uri": "sqlite:///x.db", "warehouse": "file:///tmp/w"},
        "shuffle": {"uri": "file:///tmp/s"},
        "tables": [
            {
                "source": "shop.orders",
                "sink": "shop.orders_changes",
                "mirrors": [{"type": "iceberg", "table": "m.o", **extra}],
            }
        ],
    }
    return parse_config(raw).tables[0].mirrors[0]


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (None, 86400.0),
        ("always", 0.0),
        (True, 0.0),
        (False, None),
        ("false", None),
        ("24h", 86400.0),
        ("30m", 1800.0),
    ],
)
def test_verify_setting(value, seconds):
    mirror = _mirror() if value is None else _mirror(verify=value)
    assert mirror.verify == seconds
    assert mirror.repair is True


def test_a_bad_verify_setting_names_the_choices():
    with pytest.raises((ConfigError, ValueError), match="'always', a duration such as 24h"):
        _mirror(verify="sometimes")


def test_due():
    assert due(0.0, {"verified_at": 100.0}, now=101.0)
    assert due(0.0, {"verified_at": 200.0}, now=100.0)  # always: even when the clocks disagree
    assert not due(None, None, now=0.0)
    assert due(3600.0, None, now=0.0)  # never verified: due at once
    assert not due(3600.0, {"verified_at": 100.0}, now=3699.0)
    assert due(3600.0, {"verified_at": 100.0}, now=3700.0)

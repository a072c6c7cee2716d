"""The freshness callback by dotted path: found, or an error naming the fix (no Airflow scheduler needed)."""

from __future__ import annotations

import pytest

from iceberg_cdc.airflow.freshness_dag import resolve_callback
from iceberg_cdc.errors import ConfigError
from iceberg_cdc.run.freshness import breaches
from iceberg_cdc.units import format_duration

NOT_CALLABLE = 42


def test_a_callable_is_found_by_its_dotted_path():
    assert resolve_callback("json.dumps")({"a": 1}) == '{"a": 1}'


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("no_such_module_xyz.alert", r"cannot be imported .*put the module on the workers' Python path"),
        ("json.no_such_name", r"cannot be imported .*AttributeError"),
        (f"{__name__}.NOT_CALLABLE", r"is a int, not a callable or notifier"),
    ],
)
def test_a_wrong_path_names_the_fix(path, message):
    with pytest.raises(ConfigError, match=message):
        resolve_callback(path)


def test_the_breach_rule_is_strictly_above_a_configured_slo():
    assert not breaches(900.0, 900.0) and breaches(900.5, 900.0)
    assert not breaches(10**6, None) and not breaches(None, 60.0)
    assert (format_duration(59), format_duration(61), format_duration(7260)) == (
        "59 s",
        "1 min 1 s",
        "2 h 1 min",
    )

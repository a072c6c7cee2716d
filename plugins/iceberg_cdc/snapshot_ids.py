"""Snapshot ids as people and browsers handle them: strings of digits, exact.

Iceberg snapshot ids are 63-bit integers, mostly above 2**53. A browser's
JSON parser, Airflow's Params form and its JSON editor hold numbers as
doubles and round such ids (``5200992516889735211`` becomes
``5200992516889735000``, another snapshot or none). So wherever a person or a
browser sees or types an id -- the DAG's Params, a chained run's conf, asset
event extras, the CDC view's JSON -- it travels as a string of digits
(:func:`as_text`); API callers may still send an integer. :func:`parse`
accepts both and nothing else.
"""

from __future__ import annotations

import re
from typing import Any

from iceberg_cdc.errors import ConfigError

# JSON Schema pattern of a snapshot id typed as text (Airflow validates Params with it).
PATTERN = r"^\s*-?[0-9]{1,19}\s*$"
_DIGITS = re.compile(PATTERN)
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
# Above this a double cannot hold every integer: an id that arrives as a float was rounded on the way.
_EXACT_FLOAT = 2**53


def parse(value: Any, name: str = "snapshot_id") -> int | None:
    """An id from a run's params or conf: an integer, or a string of digits; None for none.

    Raises :class:`~iceberg_cdc.errors.ConfigError` naming ``name`` and the
    fix for anything else -- including a float, which a JSON reader may have
    rounded on the way.
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):
        raise ConfigError(_problem(name, value, "is a boolean"))
    if isinstance(value, int):
        number = value
    elif isinstance(value, float):
        if value.is_integer() and abs(value) < _EXACT_FLOAT:
            number = int(value)
        else:
            raise ConfigError(
                _problem(
                    name,
                    value,
                    "arrived as a floating-point number, which cannot hold a 19-digit id exactly (a "
                    "browser or JSON editor rounded it)",
                )
            )
    elif isinstance(value, str) and _DIGITS.match(value):
        number = int(value.strip())
    else:
        raise ConfigError(_problem(name, value, "is not a snapshot id (digits only)"))
    if not _LONG_MIN <= number <= _LONG_MAX:
        raise ConfigError(_problem(name, value, "does not fit a 64-bit snapshot id"))
    return number


def as_text(value: Any) -> str | None:
    """An id as a string of digits (None stays None): what a browser or JSON reader is given."""
    return None if value is None else str(int(value))


def _problem(name: str, value: Any, what: str) -> str:
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
    return (
        f"{name}={shown} {what}. Give the id as a string of digits, exactly as Iceberg shows it, e.g. "
        f'{{"{name}": "5200992516889735211"}} (in the Trigger form, type it in the {name} field). '
        "Nothing was run."
    )

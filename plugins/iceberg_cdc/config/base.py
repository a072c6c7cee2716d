"""What every config section shares: strict, frozen models that never print a secret, and durations."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict

from iceberg_cdc.redaction import redact_value

_IDENT = re.compile(r"^[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)+$")


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|d)?\s*$", re.IGNORECASE)
_DURATION_UNITS = {"ms": 0.001, "s": 1, "": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def parse_duration(value: Any) -> float:
    """Seconds from ``24h`` / ``90min`` / ``3d`` / ``500ms`` / a number of seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 24h")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(f"{value!r} is not a duration; write e.g. 30s, 15min, 24h or 3d")
        seconds = float(match.group(1)) * _DURATION_UNITS[(match.group(2) or "").lower()]
    if seconds <= 0:
        raise ValueError(f"duration must be positive, got {value!r}")
    return seconds


class _Redacting(BaseModel):
    """``repr()`` and ``str()`` (and pydantic's pretty printers) with every secret value replaced.

    A config object ends up in tracebacks, logs and debugger output: its
    printed form must never carry a credential. The values themselves stay
    as they are (``model_dump`` is what connects to the catalog).
    """

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            # A nested config model prints itself through this same method; anything else is redacted.
            nested = isinstance(value, _Redacting) or (
                isinstance(value, list) and value and all(isinstance(v, _Redacting) for v in value)
            )
            yield name, value if nested else redact_value(value, name or "")


class _Strict(_Redacting):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

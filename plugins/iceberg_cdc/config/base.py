"""What every config section shares: strict, frozen models that never print a secret (durations: :mod:`iceberg_cdc.units`)."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict

from iceberg_cdc.redaction import redact_value

IDENT = re.compile(r"^[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)+$")


class Redacting(BaseModel):
    """``repr()`` and ``str()`` (and pydantic's pretty printers) with every secret value replaced.

    A config object ends up in tracebacks, logs and debugger output: its
    printed form must never carry a credential. The values themselves stay
    as they are (``model_dump`` is what connects to the catalog).
    """

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            # A nested config model prints itself through this same method; anything else is redacted.
            nested = isinstance(value, Redacting) or (
                isinstance(value, list) and value and all(isinstance(v, Redacting) for v in value)
            )
            yield name, value if nested else redact_value(value, name or "")


class Strict(Redacting):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

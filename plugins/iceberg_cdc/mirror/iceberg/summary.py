"""Every ``cdc.mirror.*`` key an Iceberg mirror writes, in one place.

The mirror's table properties carry its watermark (``cdc.mirror.watermark.*``:
what the next run reads); each apply's snapshot summary carries the same mark
(``cdc.mirror.<field>``: how an apply whose answer was lost is recognised)
and what the apply did::

    cdc.mirror.changelog-snapshot-id, .source-snapshot-id, .ordinal, .source-table   the marker
    cdc.mirror.rows.upserted, .rows.replaced, .rows.live-change                      conservation
    cdc.mirror.files.added, .files.removed, .files.scanned                           files
    cdc.mirror.keys                                                                  distinct changed keys
    cdc.mirror.mode                                                                  merge-on-read / copy-on-write
    cdc.mirror.seconds.<phase>                                                       seconds per phase

The table's properties also carry ``cdc.mirror.field-ids``: the mapping of the
changelog's field ids to the mirror's (JSON; :mod:`.schema`), set in the
commit that brings the schema it describes, and ``cdc.mirror.last-apply``:
the latest apply (JSON: ``at_ms``, ``ordinal``, ``rows``, ``seconds``), set by
every apply's commit -- one that changed no row too, which makes no snapshot
and so has no summary -- as the PostgreSQL target's state row records every
apply. Mirrors written before it have only the summaries.

All values are strings, as Iceberg's are. The layout is the contract with
every mirror already written: change it only by reading the old form too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from iceberg_cdc.mirror.iceberg.inputs import Through

WATERMARK_PREFIX = "cdc.mirror.watermark."
MARKER_PREFIX = "cdc.mirror."
MAPPING_PROPERTY = f"{MARKER_PREFIX}field-ids"  # changelog field id -> mirror field id (JSON)
REPAIR_KEY = f"{MARKER_PREFIX}repair"  # a verification's repair: the snapshot keeps the watermark
LAST_APPLY_PROPERTY = f"{MARKER_PREFIX}last-apply"  # the latest apply, no-ops too (JSON)
_FIELDS = ("changelog-snapshot-id", "source-snapshot-id", "ordinal")
SOURCE_KEY = "source-table"


def _mark(prefix: str, through: Through, source: str) -> dict[str, str]:
    return {
        f"{prefix}changelog-snapshot-id": str(through.changelog_snapshot_id),
        f"{prefix}source-snapshot-id": str(through.source_snapshot_id),
        f"{prefix}ordinal": str(through.ordinal),
        f"{prefix}{SOURCE_KEY}": source,
    }


def watermark_properties(through: Through, source: str) -> dict[str, str]:
    """The table properties that say the mirror holds the source's rows as of ``through``."""
    return _mark(WATERMARK_PREFIX, through, source)


def marker_summary(through: Through, source: str) -> dict[str, str]:
    """The snapshot summary keys of the apply that reached ``through``."""
    return _mark(MARKER_PREFIX, through, source)


def parse_mark(values: Mapping[str, str], prefix: str) -> Through | None:
    try:
        raw = [values.get(f"{prefix}{name}") for name in _FIELDS]
        if any(v is None for v in raw):
            return None
        return Through(int(raw[0]), int(raw[1]), int(raw[2]))  # type: ignore[arg-type]
    except ValueError:
        return None


def parse_apply(values: Mapping[str, str]) -> dict[str, dict] | None:
    """What an apply's snapshot summary says it did: ``rows`` (upserted, replaced) and ``seconds`` per phase.

    None for a snapshot that is no apply: no marker, or a verification's repair.
    """
    if parse_mark(values, MARKER_PREFIX) is None or values.get(REPAIR_KEY):
        return None
    rows = {}
    for name in ("upserted", "replaced"):
        try:
            rows[name] = int(values[f"{MARKER_PREFIX}rows.{name}"])
        except (KeyError, ValueError):
            continue
    seconds = {}
    prefix = f"{MARKER_PREFIX}seconds."
    for key, value in values.items():
        if key.startswith(prefix):
            try:
                seconds[key[len(prefix) :]] = float(value)
            except ValueError:
                continue
    return {"rows": rows, "seconds": seconds}


def apply_summary(
    figures: Mapping[str, int],
    seconds: Mapping[str, float],
    *,
    keys: int,
    files_scanned: int,
    mode: str,
) -> dict[str, str]:
    """What an apply's snapshot summary says it did (the marker is :func:`marker_summary`)."""
    summary = {f"{MARKER_PREFIX}{name}": str(value) for name, value in figures.items()}
    summary.update({f"{MARKER_PREFIX}seconds.{phase}": str(value) for phase, value in seconds.items()})
    summary[f"{MARKER_PREFIX}keys"] = str(keys)
    summary[f"{MARKER_PREFIX}files.scanned"] = str(files_scanned)
    summary[f"{MARKER_PREFIX}mode"] = mode
    return summary


def last_apply_property(marker: Mapping[str, str], at_ms: int) -> dict[str, str]:
    """The table property that records the apply whose snapshot summary is ``marker`` (a repair: none)."""
    found = parse_apply(marker)
    through = parse_mark(marker, MARKER_PREFIX)
    if found is None or through is None:
        return {}
    record = {"at_ms": int(at_ms), "ordinal": through.ordinal, **found}
    return {LAST_APPLY_PROPERTY: json.dumps(record, sort_keys=True, separators=(",", ":"))}


def parse_last_apply(properties: Mapping[str, str]) -> dict[str, Any] | None:
    """The latest apply :func:`last_apply_property` recorded (None: none, or unreadable)."""
    raw = properties.get(LAST_APPLY_PROPERTY)
    if raw is None:
        return None
    try:
        found = json.loads(raw)
        return {
            "at_ms": int(found["at_ms"]),
            "ordinal": int(found["ordinal"]),
            "rows": {str(k): int(v) for k, v in found.get("rows", {}).items()},
            "seconds": {str(k): float(v) for k, v in found.get("seconds", {}).items()},
        }
    except (ValueError, TypeError, KeyError, AttributeError):
        return None

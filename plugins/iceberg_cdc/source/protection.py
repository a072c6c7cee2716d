"""Iceberg tags on the source that keep what the sink still needs through expiry.

``tables[].protect_base`` (on by default) keeps the **base**: the watermark's
snapshot -- the state the changelog describes, where a bridge over a gap in
the history starts -- and the snapshot a run processes now (the next base):

    cdc-base-<sink identifier>-<snapshot id>

``tables[].protect_pending: true`` also keeps every pending snapshot
(:func:`~iceberg_cdc.source.retention.needed_snapshots`), so each is
processed on its own even across an expiry:

    cdc-pending-<sink identifier>-<snapshot id>

A tag heads its snapshot, and every snapshot expiry keeps ref heads: Iceberg's
own (``RemoveSnapshots``: a tag without ``max-ref-age-ms`` is kept for good)
and pyiceberg's (which keeps *only* ref heads, so a branch with its own
retention would not do). Detect moves the tags at the start of every run
(:func:`sync_tags`): tags of snapshots the sink has passed are removed, tags
of newly arrived snapshots added, in **one** metadata commit on the source --
none when nothing changed, so an idle run writes nothing (and the event
trigger, which compares ``main``'s snapshot, never fires on it).

**Cost and access.** One small metadata commit on the source per run that
moves something (a new metadata file; no data or manifest is written), so the
pipeline needs write access to the source table's metadata, not only read
access. A source with a long backlog carries one tag per pending snapshot.

**Removal.** Tags go when they are no longer needed (the next run), when
``protect_pending`` is turned off (that table's next run removes all of its
tags), or when the table leaves the config: every table whose tags the
pipeline ever set is recorded in the shuffle store (``_protection/``), and
detect of any table of the config sweeps the records of tables no longer
configured with ``protect_pending`` (:func:`sweep_unconfigured`), removing
their tags. ``iceberg-cdc protection release --config ... --source ns.t
--sink ns.t_changes`` does the same by hand.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table
from pyiceberg.table.refs import SnapshotRefType

from iceberg_cdc.storage.base import ObjectStore

log = logging.getLogger("iceberg_cdc")

TAG_PREFIX = "cdc-pending-"
BASE_TAG_PREFIX = "cdc-base-"
REGISTRY_PREFIX = "_protection/"
_ATTEMPTS = 5


def tag_prefix(sink: str) -> str:
    """The prefix of the tags one sink's pipeline keeps on pending snapshots of its source."""
    return f"{TAG_PREFIX}{sink}-"


def base_tag_prefix(sink: str) -> str:
    """The prefix of the tags that hold one sink's base (``protect_base``): the watermark's snapshot."""
    return f"{BASE_TAG_PREFIX}{sink}-"


def own_tag_prefixes(sink: str) -> tuple[str, str]:
    """Every prefix of one sink's tags on its source (pending and base)."""
    return tag_prefix(sink), base_tag_prefix(sink)


def tag_name(sink: str, snapshot_id: int) -> str:
    return f"{tag_prefix(sink)}{snapshot_id}"


def base_tag_name(sink: str, snapshot_id: int) -> str:
    return f"{base_tag_prefix(sink)}{snapshot_id}"


@dataclass(frozen=True)
class TagChange:
    """What one sync did to the source's tags (``committed``: whether a metadata commit was made)."""

    added: tuple[int, ...] = ()
    removed: tuple[int, ...] = ()
    kept: int = 0
    committed: bool = False
    attempts: int = 0

    def to_dict(self) -> dict[str, object]:
        return {
            "added": [str(s) for s in self.added],
            "removed": [str(s) for s in self.removed],
            "kept": self.kept,
            "committed": self.committed,
        }


def own_tags(table: Table, sink: str) -> dict[str, int]:
    """The pipeline's tags for ``sink`` on ``table`` (pending and base): name -> snapshot id."""
    prefixes = own_tag_prefixes(sink)
    return {
        name: ref.snapshot_id
        for name, ref in table.metadata.refs.items()
        if name.startswith(prefixes) and ref.snapshot_ref_type == SnapshotRefType.TAG
    }


def sync_tags(
    table: Table, sink: str, snapshot_ids: Iterable[int], base_ids: Iterable[int] = ()
) -> TagChange:
    """Make the sink's tags on ``table`` exactly: a pending tag per snapshot of ``snapshot_ids`` and a base
    tag per snapshot of ``base_ids``, for those that exist.

    One metadata commit for all changes, none when the tags already match. A
    concurrent commit on the source makes the catalog refuse ours; the table is
    then reloaded and the change worked out again (up to five attempts).
    Snapshots already gone from the metadata cannot be tagged and are left out.
    """
    named = [(tag_name(sink, sid), sid) for sid in snapshot_ids]
    named += [(base_tag_name(sink, sid), sid) for sid in base_ids]
    for attempt in range(1, _ATTEMPTS + 1):
        current = own_tags(table, sink)
        wanted = {name: sid for name, sid in named if table.metadata.snapshot_by_id(sid) is not None}
        stale = sorted(name for name, sid in current.items() if wanted.get(name) != sid)
        missing = sorted(name for name in wanted if current.get(name) != wanted[name])
        if not stale and not missing:
            return TagChange(kept=len(current), attempts=attempt)
        try:
            with table.manage_snapshots() as refs:
                for name in stale:
                    refs.remove_tag(name)
                for name in missing:
                    refs.create_tag(wanted[name], name)
        except CommitFailedException:
            if attempt == _ATTEMPTS:
                raise
            table.refresh()
            continue
        return TagChange(
            added=tuple(wanted[n] for n in missing),
            removed=tuple(current[n] for n in stale),
            kept=len(current) - len(stale),
            committed=True,
            attempts=attempt,
        )
    raise AssertionError("unreachable")


def release_tags(table: Table, sink: str) -> TagChange:
    """Remove every tag the pipeline keeps for ``sink`` on ``table`` (one commit; none when there are none)."""
    return sync_tags(table, sink, (), ())


# ----------------------------------------------------------------------------- registry and sweep


@dataclass(frozen=True)
class Protected:
    """A (source, sink) pair whose tags the pipeline set, as recorded in the shuffle store."""

    source: str
    sink: str
    key: str = field(default="", compare=False)


def registry_key(source: str, sink: str) -> str:
    return f"{REGISTRY_PREFIX}{source}/{sink}.json"


def record(store: ObjectStore, source: str, sink: str) -> None:
    """Remember that ``source`` carries tags for ``sink`` (written before the first tag, so none is forgotten)."""
    key = registry_key(source, sink)
    if not store.list(key):
        store.put(key, json.dumps({"source": source, "sink": sink}).encode())


def recorded(store: ObjectStore) -> list[Protected]:
    """Every (source, sink) recorded, from one listing of the registry."""
    found = []
    for info in store.list(REGISTRY_PREFIX):
        if not info.key.endswith(".json"):
            continue
        source, _, rest = info.key[len(REGISTRY_PREFIX) :].partition("/")
        if source and rest:
            found.append(Protected(source, rest[: -len(".json")], info.key))
    return found


def forget(store: ObjectStore, source: str, sink: str) -> None:
    store.delete_prefix(registry_key(source, sink))


def sweep_unconfigured(
    store: ObjectStore,
    protected_now: Iterable[tuple[str, str]],
    load_table: Callable[[str], Table | None],
) -> list[Protected]:
    """Remove the tags of recorded (source, sink) pairs that are no longer configured with protect_pending.

    ``protected_now``: the config's (source, sink) pairs with protection on;
    ``load_table``: the source table by identifier, or None when it no longer
    exists (its tags went with it). A failure on one pair is logged and left
    for the next run's sweep. Returns the pairs released.
    """
    keep = set(protected_now)
    released = []
    for entry in recorded(store):
        if (entry.source, entry.sink) in keep:
            continue
        try:
            table = load_table(entry.source)
            if table is not None:
                change = release_tags(table, entry.sink)
                log.warning(
                    "protect_pending: %s -> %s is no longer configured; removed its %d tag(s) from %s",
                    entry.source,
                    entry.sink,
                    len(change.removed),
                    entry.source,
                )
            forget(store, entry.source, entry.sink)
            released.append(entry)
        except Exception as exc:  # the next run's sweep tries again
            log.warning(
                "protect_pending: could not remove the tags of %s -> %s (%s: %s); the next run tries again",
                entry.source,
                entry.sink,
                type(exc).__name__,
                exc,
            )
    return released

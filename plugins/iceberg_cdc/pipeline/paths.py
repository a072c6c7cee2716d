"""Where a snapshot's objects live in the shuffle store.

Everything one source snapshot needs sits under one prefix, so cleanup is a
single prefix delete and a rerun starts from a clean slate::

    <table>/snapshot-<id>/plan.json            the plan (detect)
    <table>/snapshot-<id>/map/<task>.data      map outputs (SHUFFLE_WRITE)
    <table>/snapshot-<id>/map/<task>.index     ... written last: the commit marker
    <table>/snapshot-<id>/failed/<task>.json   a write task that gave up (barrier fails fast)
    <table>/snapshot-<id>/ranges.json          read ranges (coalesce)
    <table>/snapshot-<id>/staged/<part>.json   staged sink files and figures of one read/insert task
    <table>/snapshot-<id>/stats/<phase>.json   seconds and figures per phase
"""

from __future__ import annotations

from dataclasses import dataclass

from iceberg_cdc.shuffle.layout import INDEX_SUFFIX


@dataclass(frozen=True)
class SnapshotPaths:
    table: str  # source identifier, e.g. "shop.orders"
    snapshot_id: int

    @property
    def prefix(self) -> str:
        return f"{self.table}/snapshot-{self.snapshot_id}/"

    @property
    def plan(self) -> str:
        return self.prefix + "plan.json"

    @property
    def map_prefix(self) -> str:
        return self.prefix + "map/"

    def map_output(self, task_id: str) -> str:
        """Map output name: ``NAME.data`` and ``NAME.index`` sit beside each other."""
        return self.map_prefix + task_id

    @property
    def failed_prefix(self) -> str:
        return self.prefix + "failed/"

    def failed(self, task_id: str) -> str:
        return self.failed_prefix + task_id + ".json"

    @property
    def ranges(self) -> str:
        return self.prefix + "ranges.json"

    @property
    def staged_prefix(self) -> str:
        return self.prefix + "staged/"

    def staged(self, part: str) -> str:
        return self.staged_prefix + part + ".json"

    def stats(self, phase: str) -> str:
        return self.prefix + f"stats/{phase}.json"

    def task_of_index_key(self, key: str) -> str | None:
        """The write task id of a map output index key, or None for other keys."""
        if key.startswith(self.map_prefix) and key.endswith(INDEX_SUFFIX):
            return key[len(self.map_prefix) : -len(INDEX_SUFFIX)]
        return None

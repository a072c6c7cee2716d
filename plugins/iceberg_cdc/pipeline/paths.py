"""Where a snapshot's objects live in the shuffle store.

Everything one attempt at a source snapshot needs sits under one prefix named
after the run's lease epoch, so cleanup is a single prefix delete, and two
runs of one snapshot (a run that was overtaken and the run that took over)
can never read, overwrite or delete each other's objects::

    <table>/snapshot-<id>/epoch-<n>/plan.json             the plan (detect)
    <table>/snapshot-<id>/epoch-<n>/map/<task>.data       map outputs (SHUFFLE_WRITE)
    <table>/snapshot-<id>/epoch-<n>/map/<task>.index      ... the byte contract's commit marker
    <table>/snapshot-<id>/epoch-<n>/written/<task>.json   rows per partition of that output (last)
    <table>/snapshot-<id>/epoch-<n>/failed/<task>.json    a write task that gave up (barrier fails fast)
    <table>/snapshot-<id>/epoch-<n>/ranges.json           read ranges and their expected rows (coalesce)
    <table>/snapshot-<id>/epoch-<n>/staged/<part>.json    staged sink files and figures of one read/insert task
    <table>/snapshot-<id>/epoch-<n>/stats/<phase>.json    seconds and figures per phase
    <table>/snapshot-<id>/epoch-<n>/errors/<phase>-<g>.json  why a phase group failed (one line)
    <table>/snapshot-<id>/epoch-<n>/commit-pending.json   a sink commit whose outcome is not known yet
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ATTEMPT_KEY = re.compile(r"^snapshot-(-?\d+)/(epoch-\d+)/")


def attempt_name(epoch: int) -> str:
    """The namespace of one lease epoch: ``epoch-<n>``."""
    return f"epoch-{epoch}"


def table_prefix(table: str) -> str:
    """Every object of every snapshot and attempt of ``table`` (ends with ``/``)."""
    return f"{table}/"


def attempt_of_key(table: str, key: str) -> tuple[int, str] | None:
    """``(snapshot id, attempt)`` of a key under :func:`table_prefix`, or None for other keys."""
    match = (
        _ATTEMPT_KEY.match(key[len(table_prefix(table)) :]) if key.startswith(table_prefix(table)) else None
    )
    return (int(match.group(1)), match.group(2)) if match else None


@dataclass(frozen=True)
class SnapshotPaths:
    table: str  # source identifier, e.g. "shop.orders"
    snapshot_id: int
    attempt: str  # the run's namespace, attempt_name(epoch)

    @property
    def prefix(self) -> str:
        return f"{self.table}/snapshot-{self.snapshot_id}/{self.attempt}/"

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
    def written_prefix(self) -> str:
        return self.prefix + "written/"

    def written(self, task_id: str) -> str:
        return self.written_prefix + task_id + ".json"

    def task_of_written_key(self, key: str) -> str | None:
        """The write task id of a ``written/<task>.json`` key, or None for other keys."""
        if key.startswith(self.written_prefix) and key.endswith(".json"):
            return key[len(self.written_prefix) : -len(".json")]
        return None

    def group_error(self, phase: str, group: int) -> str:
        """Why a phase group failed, in one line (the Airflow task raises it first)."""
        return self.prefix + f"errors/{phase}-{group:04d}.json"

    @property
    def commit_pending(self) -> str:
        return self.prefix + "commit-pending.json"

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

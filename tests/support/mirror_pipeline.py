"""An :class:`InlinePipeline` with a PostgreSQL mirror on a real server, run in process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cdc_devtools.inline_mirror import MirrorRun, run_mirror
from cdc_devtools.inline_pipeline import SINK, SOURCE, InlinePipeline
from cdc_devtools.mirror_check import MirrorVerdict, assert_mirror_exact
from iceberg_cdc.mirror.postgres.target import Hook, PostgresTarget


class MirrorPipeline(InlinePipeline):
    """The changelog pipeline plus one PostgreSQL mirror ``<schema>.orders`` named ``pg``."""

    def __init__(
        self, tmp: Path, dsn: str, schema: str, *, table: dict[str, Any] | None = None, **kwargs
    ) -> None:
        self.dsn = dsn
        self.mirror_table = f"{schema}.orders"
        mirror = {"type": "postgres", "dsn": dsn, "table": self.mirror_table, "name": "pg"}
        super().__init__(tmp, table={"mirrors": [mirror], **(table or {})}, **kwargs)

    @property
    def target(self) -> PostgresTarget:
        return PostgresTarget(self.dsn, self.mirror_table, changelog=SINK, source=SOURCE)

    def mirror(self, *, hook: Hook | None = None, run_id: str | None = None) -> MirrorRun:
        return run_mirror(self.config, SOURCE, "pg", hook=hook, run_id=run_id)

    def sync(self) -> MirrorRun:
        """The changelog caught up, then the mirror: what ``make sync`` does."""
        self.catch_up()
        return self.mirror()

    def check(self) -> MirrorVerdict:
        return assert_mirror_exact(self.source, self.target)

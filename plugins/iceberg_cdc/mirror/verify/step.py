"""The mirror DAG's ``verify`` step: verify when due, under the run's own lease, and say what was found."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from iceberg_cdc.config import MirrorConfig
from iceberg_cdc.errors import MirrorDriftError
from iceberg_cdc.mirror.steps import mirror_lease
from iceberg_cdc.mirror.verify.check import verify_mirror
from iceberg_cdc.mirror.verify.record import due, last_verification, save_verification
from iceberg_cdc.run.context import Context

log = logging.getLogger("iceberg_cdc.mirror")


def verify_step(
    ctx: Context,
    mirror: MirrorConfig,
    detected: dict[str, Any] | None,
    *,
    on_result: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Verify (and repair, per config) when ``mirror.verify`` says one is due; MirrorDriftError when drift is left."""
    if not detected or detected.get("epoch") is None:
        return {"verified": False, "reason": "the run holds no lease"}
    store = ctx.runtime.store()
    last = last_verification(store, ctx.table.source, mirror.mirror_name)
    if not due(mirror.verify, last):
        return {"verified": False, "reason": "not due", "last": (last or {}).get("line")}
    run_id, epoch = str(detected["run_id"]), int(detected["epoch"])
    mirror_lease(ctx, mirror).renew(run_id, epoch, float(detected["lease_ttl"]))
    result = verify_mirror(ctx, mirror, repair=mirror.repair, run_id=run_id, epoch=epoch)
    answer = {**result.to_dict(), "verified": True, "line": result.line()}
    save_verification(store, ctx.table.source, mirror.mirror_name, answer)
    if on_result is not None:  # metrics: before a drift error ends the task
        on_result(answer)
    log.info("%s", result.line())
    if not result.equal:
        raise MirrorDriftError(
            f"{result.line()}. Repair with `make verify CONFIG=<config> TABLE={ctx.table.source} "
            f"MIRROR={mirror.mirror_name}` (or set tables[].mirrors[].repair: true)"
        )
    return answer

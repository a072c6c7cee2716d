"""One phase group of a snapshot plan: its units, the function that runs one, and its figures.

A group is what one Spark application runs (one mapped Airflow task). The
Spark driver and the in-process runner share these, so both execute the same
units with the same functions and leave the same figures for commit.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from iceberg_cdc.errors import ConfigError
from iceberg_cdc.pipeline import executor_tasks
from iceberg_cdc.pipeline.paths import SnapshotPaths
from iceberg_cdc.pipeline.plan import SnapshotPlan
from iceberg_cdc.pipeline.runtime import Runtime
from iceberg_cdc.sink.summary import SKEW_LISTED, Skew
from iceberg_cdc.storage import ObjectStore, get_json_many

UnitFunction = Callable[[SnapshotPlan, Runtime, Any], dict[str, Any]]


PHASE_FUNCTIONS: dict[str, UnitFunction] = {
    "write": executor_tasks.run_write_task,
    "read": executor_tasks.run_read_task,
    "insert": executor_tasks.run_insert_task,
}
PlanLoader = Callable[[ObjectStore, str], Any]
_PHASE_PLANS: dict[str, PlanLoader] = {}


def register_phase(phase: str, function: UnitFunction, load_plan: PlanLoader) -> None:
    """Add a phase of a higher layer (the Iceberg mirror's join): its unit function and plan loader.

    The layers that own such phases register them in the processes that drive
    a group (:func:`iceberg_cdc.mirror.iceberg.phase.register`: the Airflow
    adapter, the Spark entry point, in-process runners); this layer never
    imports theirs. Executors need no registry: the unit function reaches them
    pickled by reference, and they import its module from the package.
    """
    PHASE_FUNCTIONS[phase] = function
    _PHASE_PLANS[phase] = load_plan


def phase_names() -> list[str]:
    return sorted(PHASE_FUNCTIONS)


def load_phase_plan(phase: str, store: ObjectStore, key: str) -> Any:
    """The plan a phase's group runs from: a snapshot plan, or a registered phase's own (a mirror's apply plan)."""
    if phase not in PHASE_FUNCTIONS:
        raise ConfigError(
            f"unknown phase {phase!r}; known here: {', '.join(phase_names())}. A mirror's phase is known once "
            "its package registers it (iceberg_cdc.mirror.iceberg.phase.register)"
        )
    if phase in _PHASE_PLANS:
        return _PHASE_PLANS[phase](store, key)
    return SnapshotPlan.load(store, key)


def units_of(phase: str, plan: Any, group: int, store: ObjectStore) -> list[Any]:
    """Write/insert groups list task ids (from the plan); read groups list range documents (from coalesce);
    a registered phase's groups list its plan's unit ids."""
    if phase in _PHASE_PLANS:
        return list(plan.groups[group])
    if phase in ("write", "insert"):
        return list(plan.groups[group].task_ids)
    paths = plan.paths
    ranges = json.loads(store.get(paths.ranges))
    wanted = set(ranges["groups"][group])
    return [r for r in ranges["ranges"] if r["index"] in wanted]


def read_group_count(plan: SnapshotPlan, store: ObjectStore) -> int:
    """How many read groups coalesce planned."""
    paths = plan.paths
    return len(json.loads(store.get(paths.ranges))["groups"])


def record_group(
    store: ObjectStore,
    plan: SnapshotPlan,
    phase: str,
    group: int,
    seconds: float,
    results: list[Any],
    *,
    runner: str = "spark",
) -> None:
    """The group's wall time, unit figures and where they ran, summed into the commit's ``cdc.seconds.*``."""
    paths = plan.paths
    document = {
        "phase": phase,
        "group": group,
        "seconds": round(seconds, 3),
        "units": results,
        "runner": runner,
    }
    store.put(paths.stats(f"{phase}-{group:04d}"), json.dumps(document).encode())


def record_phase(
    store: ObjectStore, paths: SnapshotPaths, phase: str, started: float, **figures: Any
) -> None:
    """Seconds (since ``started``, a ``perf_counter`` value) and figures of one non-Spark step."""
    document = {"phase": phase, "seconds": round(time.perf_counter() - started, 3), **figures}
    store.put(paths.stats(phase), json.dumps(document).encode())


def phase_records(store: ObjectStore, paths: SnapshotPaths) -> list[dict[str, Any]]:
    """Every stats record of one attempt (one listing): detect's, coalesce's, each Spark group's."""
    return get_json_many(store, [info.key for info in store.list(paths.prefix + "stats/")])


def phase_seconds(
    store: ObjectStore, paths: SnapshotPaths, records: list[dict[str, Any]] | None = None
) -> dict[str, float]:
    """Seconds per phase of one attempt, from every stats record (groups of a phase add up)."""
    seconds: dict[str, float] = {}
    for document in phase_records(store, paths) if records is None else records:
        seconds[document["phase"]] = seconds.get(document["phase"], 0.0) + float(document.get("seconds", 0))
    return {k: round(v, 2) for k, v in seconds.items()}


def skew_summary(records: list[dict[str, Any]]) -> Skew | None:
    """Skew coalesce found, for the sink summary; None when the attempt had no coalesce (no shuffle).

    How many partitions were skewed (``0`` when none), the first
    :data:`~iceberg_cdc.sink.summary.SKEW_LISTED` of them largest first, and
    the largest one's size over the median non-empty partition's.
    """
    coalesce = next((r for r in records if r.get("phase") == "coalesce"), None)
    if coalesce is None:
        return None
    skew = sorted(coalesce.get("skew") or [], key=lambda s: (-int(s["size"]), int(s["partition"])))
    if not skew and coalesce.get("skewed"):  # a record from before sizes were kept
        return Skew(count=len(coalesce["skewed"]), partitions=_listed(coalesce["skewed"]))
    if not skew:
        return Skew(count=0)
    largest = skew[0]
    median = max(int(largest["median"]), 1)
    return Skew(
        count=len(skew),
        partitions=_listed([s["partition"] for s in skew]),
        max_ratio=round(int(largest["size"]) / median, 1),
        max_bytes=int(largest["size"]),
        median_bytes=int(largest["median"]),
    )


def _listed(partitions: list[Any]) -> tuple[int, ...]:
    return tuple(int(p) for p in partitions[:SKEW_LISTED])

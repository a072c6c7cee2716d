"""The freshness SLO measured: a commit to a paused table breaks it, the alert fires once, then clears once.

Real SQLite catalog, real Iceberg tables, the shuffle store on the file system
(the alert state's conditional writes), the changelog caught up by the inline
pipeline (the same steps as a DAG run). The check is the freshness DAG's task
body (:func:`iceberg_cdc.airflow.freshness_dag.run_check`) with a recording
metrics backend and a ``freshness_callback`` given by dotted path.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from cdc_devtools.inline_pipeline import SOURCE, InlinePipeline
from cdc_devtools.orders import SCHEMA, rows
from iceberg_cdc.airflow.freshness_dag import build_freshness_dag, run_check, run_checks
from iceberg_cdc.errors import ObjectNotFoundError
from iceberg_cdc.run import steps
from iceberg_cdc.run.freshness import Freshness, state_key
from iceberg_cdc.run.metrics import metric_prefix
from iceberg_cdc.ui.mirrors import default_reader
from iceberg_cdc.ui.status import table_status
from tests.support.mirror_pipeline import MirrorPipeline


def stored_state(ctx: steps.Context, mirror: str | None = None) -> dict[str, Any] | None:
    """The alert state as the last transition wrote it (where ``check`` keeps it), or None."""
    try:
        return json.loads(ctx.runtime.store().get(state_key(ctx.table.source, mirror)))
    except ObjectNotFoundError:
        return None


SLO = 1.5  # seconds: long enough that a fresh commit is within it, short enough to wait out

CALLS: list[dict[str, Any]] = []
FIELDS = set(Freshness.__dataclass_fields__)


def record(context: dict[str, Any]) -> None:
    """The operator's callback (``freshness_callback: tests.integration.test_freshness_slo.record``)."""
    CALLS.append(context)


FAILURES: list[int] = []  # how many more calls of ``flaky`` raise


def flaky(context: dict[str, Any]) -> None:
    """A callback whose alerting service is down for the next ``FAILURES[0]`` calls."""
    CALLS.append({**context, "raised": bool(FAILURES and FAILURES[0])})
    if FAILURES and FAILURES[0]:
        FAILURES[0] -= 1
        raise ConnectionError("the alerting service is down")


class RecordingStats:
    def __init__(self) -> None:
        self.gauges: dict[str, float] = {}

    def incr(self, stat: str, count: int = 1, rate: float = 1, *, tags: Any = None) -> None: ...

    def gauge(
        self, stat: str, value: float, rate: float = 1, delta: bool = False, *, tags: Any = None
    ) -> None:
        self.gauges[stat] = value

    def timing(self, stat: str, dt: Any, *, tags: Any = None) -> None: ...


@pytest.fixture
def pipeline(tmp_path) -> InlinePipeline:
    CALLS.clear()
    table = {"freshness_slo": f"{SLO}s", "freshness_callback": f"{__name__}.record"}
    p = InlinePipeline(tmp_path, table=table)
    p.create_source(SCHEMA).append(rows(range(20)))
    p.catch_up()
    return p


def test_a_commit_to_a_paused_table_fires_the_alert_once_and_it_clears_once_caught_up(pipeline):
    ctx = steps.Context.of(pipeline.config, SOURCE)
    stats = RecordingStats()
    lag, breached = (
        f"{metric_prefix(SOURCE)}.freshness.lag_seconds",
        f"{metric_prefix(SOURCE)}.freshness.breached",
    )

    measured, transition = run_check(ctx, {"dag_id": "cdc_freshness"}, stats)
    assert (measured["lag_seconds"], measured["pending"], transition) == (0.0, 0, None)
    assert stats.gauges == {lag: 0.0, breached: 0.0}

    pipeline.source.append(rows(range(20, 25), "eu"))  # the table's DAG is paused: nothing processes it
    snapshot_id = pipeline.source.current_snapshot().snapshot_id
    measured, transition = run_check(ctx, {}, stats)
    assert transition is None and not measured["breached"] and measured["lag_seconds"] <= SLO
    assert table_status(pipeline.catalog, ctx.table).state == "behind"  # within the SLO: amber
    assert CALLS == []

    time.sleep(SLO + 0.5)
    measured, transition = run_check(ctx, {"dag_id": "cdc_freshness"}, stats)
    assert transition == "fired" and measured["breached"] and measured["lag_seconds"] > SLO
    assert measured["oldest_pending"] == str(snapshot_id) and measured["pending"] == 1
    assert stats.gauges[breached] == 1.0 and stats.gauges[lag] > SLO
    for _ in range(3):  # still late: no second alert
        assert run_check(ctx, {}, stats)[1] is None
    assert [c["freshness_transition"] for c in CALLS] == ["fired"]
    assert CALLS[0]["dag_id"] == "cdc_freshness" and CALLS[0]["freshness"]["oldest_pending"] == str(
        snapshot_id
    )
    assert stored_state(ctx)["breached"] is True
    shown = table_status(pipeline.catalog, ctx.table)  # the CDC view: red ("late"), not amber ("behind")
    assert shown.state == "late" and shown.to_dict()["freshness"] == {"slo_seconds": SLO, "breached": True}

    pipeline.catch_up()
    measured, transition = run_check(ctx, {}, stats)
    assert transition == "cleared" and measured == {**measured, "lag_seconds": 0.0, "breached": False}
    assert run_check(ctx, {}, stats)[1] is None
    assert [c["freshness_transition"] for c in CALLS] == ["fired", "cleared"]
    assert stats.gauges == {lag: 0.0, breached: 0.0}
    assert stored_state(ctx)["breached"] is False
    assert table_status(pipeline.catalog, ctx.table).state == "caught-up"


def test_the_checks_dag_has_one_task_per_table_with_a_promise(pipeline):
    dag = build_freshness_dag(pipeline.config)
    assert dag is not None and [t.task_id for t in dag.tasks] == ["check__cdc__shop__orders"]
    unpromised = pipeline.config.model_copy(
        update={"tables": [pipeline.config.tables[0].model_copy(update={"freshness_slo": None})]}
    )
    assert build_freshness_dag(unpromised) is None


def test_a_mirror_that_falls_behind_fires_its_own_alert_once_and_clears_once(
    tmp_path, postgres_server, pg_schema
):
    """The changelog is fresh, the mirror's DAG is paused: the mirror's SLO fires (once), then clears when it applies."""
    CALLS.clear()
    table = {"freshness_slo": f"{SLO}s", "freshness_callback": f"{__name__}.record"}
    pipeline = MirrorPipeline(tmp_path, postgres_server.dsn, pg_schema, table=table)
    pipeline.create_source(SCHEMA).append(rows(range(20)))
    pipeline.sync()
    ctx = steps.Context.of(pipeline.config, SOURCE)
    stats = RecordingStats()
    gauge = f"{metric_prefix(SOURCE)}.mirror.pg.freshness"

    checked = run_checks(ctx, {}, stats)
    assert (checked["transition"], checked["mirrors"]["pg"]["transition"]) == (None, None)
    assert checked["mirrors"]["pg"]["lag_seconds"] == 0.0 and stats.gauges[f"{gauge}.breached"] == 0.0

    pipeline.source.append(rows(range(20, 25), "eu"))
    snapshot_id = pipeline.source.current_snapshot().snapshot_id
    pipeline.catch_up()  # the changelog holds it; the mirror does not
    time.sleep(SLO + 0.5)
    checked = run_checks(ctx, {}, stats)
    mirror = checked["mirrors"]["pg"]
    assert checked["transition"] is None and not checked["breached"], "the changelog is fresh"
    assert mirror["transition"] == "fired" and mirror["breached"] and mirror["lag_seconds"] > SLO
    assert mirror["oldest_pending"] == str(snapshot_id) and mirror["mirror"] == "pg"
    assert stats.gauges[f"{gauge}.breached"] == 1.0 and stats.gauges[f"{gauge}.lag_seconds"] > SLO
    assert run_checks(ctx, {}, stats)["mirrors"]["pg"]["transition"] is None  # still late: no second alert
    assert [(c["freshness"]["mirror"], c["freshness_transition"]) for c in CALLS] == [("pg", "fired")]
    assert "mirror pg" in Freshness(**{k: v for k, v in mirror.items() if k in FIELDS}).describe()
    assert (
        stored_state(ctx, "pg")["breached"] is True and stored_state(ctx) is None
    )  # the changelog never moved
    [shown] = table_status(pipeline.catalog, ctx.table, mirror_reader=default_reader(pipeline.config)).mirrors
    assert shown.state == "late" and shown.to_dict()["freshness"] == {"slo_seconds": SLO, "breached": True}

    pipeline.mirror()
    checked = run_checks(ctx, {}, stats)
    assert checked["mirrors"]["pg"]["transition"] == "cleared" and stats.gauges[f"{gauge}.breached"] == 0.0
    assert [c["freshness_transition"] for c in CALLS] == ["fired", "cleared"]
    [shown] = table_status(pipeline.catalog, ctx.table, mirror_reader=default_reader(pipeline.config)).mirrors
    assert shown.state == "caught-up"


def test_a_callback_that_raises_is_called_again_by_later_checks_until_it_returns(tmp_path):
    """At least once: the breach is stored when it fires, the alert only when the callback returned."""
    CALLS.clear()
    FAILURES[:] = [2]
    table = {"freshness_slo": f"{SLO}s", "freshness_callback": f"{__name__}.flaky"}
    pipeline = InlinePipeline(tmp_path, table=table)
    pipeline.create_source(SCHEMA).append(rows(range(5)))
    pipeline.catch_up()
    ctx = steps.Context.of(pipeline.config, SOURCE)
    stats = RecordingStats()
    pipeline.source.append(rows(range(5, 8), "eu"))
    time.sleep(SLO + 0.5)

    with pytest.raises(ConnectionError, match="alerting service is down"):  # the check's task fails
        run_check(ctx, {}, stats)
    assert stored_state(ctx)["breached"] is True and len(stored_state(ctx)["undelivered"]) == 1
    with pytest.raises(ConnectionError):  # still down: the next check tries again, and fails again
        run_check(ctx, {}, stats)
    measured, transition = run_check(ctx, {}, stats)  # up again: delivered, by a check that moved nothing
    assert transition is None and measured["breached"]
    assert [(c["freshness_transition"], c["raised"]) for c in CALLS] == [
        ("fired", True),
        ("fired", True),
        ("fired", False),
    ]
    first = CALLS[0]["freshness"]
    assert CALLS[-1]["freshness"] == first  # the measurement of the check that fired it
    assert stored_state(ctx)["undelivered"] == []
    run_check(ctx, {}, stats)
    assert len(CALLS) == 3, "delivered once it returned: never again"

    pipeline.catch_up()
    assert run_check(ctx, {}, stats)[1] == "cleared"
    assert [c["freshness_transition"] for c in CALLS][3:] == ["cleared"]


def test_a_raising_table_callback_does_not_keep_the_mirror_checks_from_running(
    tmp_path, postgres_server, pg_schema
):
    """The changelog's alert raises: the mirror is still measured and alerted, then the task fails."""
    CALLS.clear()
    FAILURES[:] = [1]
    table = {"freshness_slo": f"{SLO}s", "freshness_callback": f"{__name__}.flaky"}
    pipeline = MirrorPipeline(tmp_path, postgres_server.dsn, pg_schema, table=table)
    pipeline.create_source(SCHEMA).append(rows(range(5)))
    pipeline.sync()
    ctx = steps.Context.of(pipeline.config, SOURCE)
    stats = RecordingStats()
    pipeline.source.append(rows(range(5, 8), "eu"))  # neither the changelog nor the mirror takes it
    time.sleep(SLO + 0.5)

    with pytest.raises(ConnectionError):
        run_checks(ctx, {}, stats)
    assert [(c["freshness"]["mirror"], c["freshness_transition"], c["raised"]) for c in CALLS] == [
        (None, "fired", True),
        ("pg", "fired", False),
    ]
    assert stored_state(ctx, "pg")["breached"] is True and stored_state(ctx, "pg")["undelivered"] == []
    assert stats.gauges[f"{metric_prefix(SOURCE)}.mirror.pg.freshness.breached"] == 1.0

    checked = run_checks(
        ctx, {}, stats
    )  # the changelog's alert is delivered now; the mirror's is not repeated
    assert checked["mirrors"]["pg"]["transition"] is None
    assert [(c["freshness"]["mirror"], c["raised"]) for c in CALLS[2:]] == [(None, False)]

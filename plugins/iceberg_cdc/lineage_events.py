"""OpenLineage objects from :class:`~iceberg_cdc.lineage.DatasetRef`, and events sent outside Airflow.

Inside Airflow the provider sends the events (``airflow/operators/lineage.py``
hands it these datasets). Outside it -- ``make verify`` -- :func:`configured_client`
gives openlineage-python's client only when the user configured a transport
the way the client reads one (``OPENLINEAGE_URL``, ``OPENLINEAGE_CONFIG``, an
``openlineage.yml``, ``OPENLINEAGE__TRANSPORT__*``); otherwise nothing is
sent (the client's fallback would print every event to the console). The
client is imported only here and only then: it is no hard dependency.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from iceberg_cdc.lineage import DatasetRef

log = logging.getLogger("iceberg_cdc")

PRODUCER = "urn:iceberg-cdc"  # who sent an event sent outside Airflow (a URI, as the spec wants)
# A custom input facet (the spec's way to say more than its facets): the snapshots an input's changes
# were read across. The spec's ``version`` facet holds one version: the range's end.
SNAPSHOT_RANGE_FACET = "icebergCdc_snapshotRange"
# The facet's JSON schema ships with the project (no public home): its path, as a URI.
SNAPSHOT_RANGE_SCHEMA = (
    "urn:iceberg-cdc:docs/lineage/SnapshotRangeInputDatasetFacet.json#/$defs/SnapshotRangeInputDatasetFacet"
)


@functools.cache
def _snapshot_range_facet() -> type:
    """The facet's class (built on first use: openlineage-python is imported only when events are made)."""
    import attr
    from openlineage.client.facet_v2 import InputDatasetFacet

    @attr.define
    class SnapshotRangeInputDatasetFacet(InputDatasetFacet):
        """``(fromSnapshotId, toSnapshotId]``: no ``fromSnapshotId`` -- from the table's first snapshot."""

        toSnapshotId: str  # the spec's camelCase
        fromSnapshotId: str | None = attr.field(default=None)
        bridge: str | None = attr.field(default=None)  # a bridge over a gap: expired | rolled back

        @staticmethod
        def _get_schema() -> str:
            return SNAPSHOT_RANGE_SCHEMA

    return SnapshotRangeInputDatasetFacet


def _facets(ref: DatasetRef) -> dict[str, Any]:
    from openlineage.client.facet_v2 import catalog_dataset, dataset_version_dataset, symlinks_dataset

    facets: dict[str, Any] = {}
    if ref.version is not None:
        facets["version"] = dataset_version_dataset.DatasetVersionDatasetFacet(datasetVersion=ref.version)
    if ref.symlink is not None:
        facets["symlinks"] = symlinks_dataset.SymlinksDatasetFacet(
            identifiers=[
                symlinks_dataset.Identifier(namespace=ref.symlink[0], name=ref.symlink[1], type="TABLE")
            ]
        )
    if ref.catalog:
        facets["catalog"] = catalog_dataset.CatalogDatasetFacet(**ref.catalog)
    return facets


def input_dataset(ref: DatasetRef) -> Any:
    """An ``InputDataset``: version, symlink, catalog; data-quality assertions when the ref has some."""
    from openlineage.client.event_v2 import InputDataset

    extra: dict[str, Any] = {}
    if ref.assertions:
        from openlineage.client.facet_v2 import data_quality_assertions_dataset as quality

        checks = [
            quality.Assertion(assertion=name, success=ok, actual=actual)
            for name, ok, actual in ref.assertions
        ]
        extra["dataQualityAssertions"] = quality.DataQualityAssertionsDatasetFacet(assertions=checks)
    if ref.snapshot_range is not None:
        after, through = ref.snapshot_range
        extra[SNAPSHOT_RANGE_FACET] = _snapshot_range_facet()(
            toSnapshotId=through, fromSnapshotId=after, bridge=ref.bridge
        )
    return InputDataset(namespace=ref.namespace, name=ref.name, facets=_facets(ref), inputFacets=extra)


def output_dataset(ref: DatasetRef) -> Any:
    """An ``OutputDataset``: version, symlink, catalog, and the rows written (``outputStatistics``)."""
    from openlineage.client.event_v2 import OutputDataset
    from openlineage.client.facet_v2 import output_statistics_output_dataset

    extra: dict[str, Any] = {}
    if ref.rows is not None:
        extra["outputStatistics"] = output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
            rowCount=ref.rows
        )
    return OutputDataset(namespace=ref.namespace, name=ref.name, facets=_facets(ref), outputFacets=extra)


def transport_configured(environ: dict[str, str] | None = None, cwd: Path | None = None) -> bool:
    """Whether the user told openlineage-python where to send events (the places its client reads)."""
    env = os.environ if environ is None else environ
    if env.get("OPENLINEAGE_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OPENLINEAGE_URL") or env.get("OPENLINEAGE_CONFIG"):
        return True
    if any(key.startswith("OPENLINEAGE__TRANSPORT") for key in env):
        return True
    places = [(cwd or Path.cwd()) / "openlineage.yml", Path("~/.openlineage/openlineage.yml").expanduser()]
    return any(place.is_file() for place in places)


def configured_client() -> Any | None:
    """openlineage-python's client when a transport is configured and the package is installed; else None."""
    if not transport_configured():
        return None
    try:
        from openlineage.client import OpenLineageClient
    except ImportError:
        log.warning("OpenLineage is configured but openlineage-python is not installed: no lineage is sent")
        return None
    return OpenLineageClient()


def emit_complete(
    client: Any,
    job_name: str,
    inputs: Sequence[DatasetRef],
    outputs: Sequence[DatasetRef],
    started: datetime,
    ended: datetime | None = None,
) -> None:
    """A START and a COMPLETE event of one run of ``job_name`` (namespace ``OPENLINEAGE_NAMESPACE``).

    A transport that fails is logged, never raised: lineage must not fail the work it describes.
    """
    from openlineage.client.event_v2 import Job, Run, RunEvent, RunState
    from openlineage.client.uuid import generate_new_uuid

    namespace = os.environ.get("OPENLINEAGE_NAMESPACE") or "default"
    run = Run(runId=str(generate_new_uuid()))
    job = Job(namespace=namespace, name=job_name)
    ins = [input_dataset(ref) for ref in inputs]
    outs = [output_dataset(ref) for ref in outputs]
    done = ended or datetime.now(UTC)
    try:
        for state, at in ((RunState.START, started), (RunState.COMPLETE, done)):
            client.emit(
                RunEvent(
                    eventType=state,
                    eventTime=at.isoformat(),
                    run=run,
                    job=job,
                    producer=PRODUCER,
                    inputs=ins,
                    outputs=outs,
                )
            )
    except Exception:
        log.exception("OpenLineage: the events of %s could not be sent", job_name)


__all__ = [
    "SNAPSHOT_RANGE_FACET",
    "configured_client",
    "emit_complete",
    "input_dataset",
    "output_dataset",
    "transport_configured",
]

"""Every DAG of a config, for a DAG file of two lines.

A deployment that installs the distribution writes, in its DAGs folder::

    from iceberg_cdc.airflow.dags import dags_from_config

    globals().update(dags_from_config())

One DAG per table (``cdc__<ns>__<table>``) and one per mirror of a table
(``cdc_mirror__<ns>__<table>__<mirror name>``, scheduled on the table's
changelog asset), and ``cdc_freshness`` when a table has a ``freshness_slo``,
from the config named by ``CDC_CONFIG`` unless given.

**Hundreds of tables: several DAG files.** Airflow parses one DAG file in
one process, within ``[core] dagbag_import_timeout`` (30 s by default), and
a table's DAGs cost about 8 ms of CPU to build and serialize. Past a few
hundred tables, split them over ``parts`` files (about 500 tables each), each
the shipped ``dags/cdc_dags.py`` -- its ``airflow.*`` imports are imported by
the processor once, not at every parse -- with its own ``part``::

    globals().update(dags_from_config(part=0, parts=2))   # cdc_dags_0.py
    globals().update(dags_from_config(part=1, parts=2))   # cdc_dags_1.py

Each table goes to the part its DAG id hashes to (stable: adding a table
moves no other), with its mirrors' DAGs; ``cdc_freshness`` is in part 0. The
DAG processor's parsing processes (``[dag_processor] parsing_processes``)
then parse the parts side by side. DAG ids stay the same.
"""

from __future__ import annotations

import hashlib
import logging

from airflow.sdk import DAG

from iceberg_cdc.airflow.dag_factory import build_dags
from iceberg_cdc.airflow.events import capacity_warning, triggerer_capacity
from iceberg_cdc.airflow.freshness_dag import build_freshness_dag
from iceberg_cdc.airflow.mirror_dag import build_mirror_dags
from iceberg_cdc.config import CdcConfig, ConfigError, TableConfig, load_config

log = logging.getLogger("iceberg_cdc")


def part_of(dag_id: str, parts: int) -> int:
    """The DAG file (of ``parts``) a table's DAGs are built in: a hash of its DAG id, stable across configs."""
    return int.from_bytes(hashlib.sha256(dag_id.encode()).digest()[:8], "big") % parts


def dags_from_config(config_path: str | None = None, *, part: int = 0, parts: int = 1) -> dict[str, DAG]:
    """The tables' and the mirrors' DAGs by DAG id, from ``config_path`` (default: ``CDC_CONFIG``).

    ``part`` of ``parts``: only the tables whose DAG id hashes to ``part``
    (:func:`part_of`), for a config split over several DAG files.
    """
    if not (isinstance(parts, int) and isinstance(part, int) and parts >= 1 and 0 <= part < parts):
        raise ConfigError(
            f"dags_from_config(part={part!r}, parts={parts!r}): part must be 0 to parts - 1, one DAG file "
            "per part (e.g. part=0 ... part=3 with parts=4)"
        )
    config: CdcConfig = load_config(config_path)
    tables: list[TableConfig] = [t for t in config.tables if part_of(t.dag_id, parts) == part]
    extra: dict[str, DAG] = {}
    if part == 0:
        if (crowded := capacity_warning(config, triggerer_capacity())) is not None:
            log.warning("%s", crowded)
        freshness = build_freshness_dag(config)
        extra = {freshness.dag_id: freshness} if freshness is not None else {}
    if not tables:
        return extra
    return {**build_dags(config, config_path, tables), **build_mirror_dags(config, tables), **extra}

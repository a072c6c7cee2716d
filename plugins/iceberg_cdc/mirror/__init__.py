"""Mirrors: the source's current rows, one per key, kept equal to the source from its changelog.

A table's ``mirrors`` (config) are copies of the source table -- in PostgreSQL
or in another Iceberg table -- that hold exactly the source's rows at the
mirror's watermark. Each has its own DAG (``cdc_mirror__<ns>__<table>__<mirror
name>``), scheduled on the changelog's Airflow Asset, with its own lease and
watermark. A run applies every changelog snapshot after the watermark at once,
as net changes per key, in one atomic step with the new watermark.

This package is Airflow-free. Modules:

* :mod:`.net_changes` -- :class:`NetChanges`, :class:`ChangelogMark` and
  :func:`net_changes` (vectorized: the last version of a key wins; a key whose
  last change has no after-image is removed);
* :mod:`.changelog` -- the changelog's state as a mark, what is pending after
  a mirror's mark (reprocessed snapshots included), the net changes read;
* :mod:`.columns` -- the mirror's columns and key (whole-row tables refused);
* :mod:`.staging` -- net changes staged as Parquet, named by a JSON plan;
* :mod:`.steps` -- detect, plan_apply, apply, cleanup (the DAG's tasks);
* :mod:`.postgres` -- the PostgreSQL target (types, DDL, the one-transaction
  apply with its state table);
* :mod:`.rebuild` -- ``python -m iceberg_cdc.mirror.rebuild``;
* :mod:`.inline` -- one mirror run in process (tests, bench).

The Iceberg target plugs in as ``iceberg_cdc.mirror.iceberg`` (its own
package). **The interface both sides keep, exactly:**

``iceberg_cdc/mirror/net_changes.py``::

    @dataclass(frozen=True)
    class ChangelogMark:
        changelog_snapshot_id: int   # the changelog (sink) table's snapshot the mirror was computed from
        source_snapshot_id: int      # the changelog's watermark in that metadata: the mirrored source snapshot
        ordinal: int                 # that watermark's _change_ordinal

    @dataclass(frozen=True)
    class NetChanges:
        upserts: pa.Table            # mirror columns, one row per key, the key's last version
        deletes: pa.Table            # key columns only
        key_columns: tuple[str, ...]
        through: ChangelogMark       # the state the mirror holds once applied

    def net_changes(changes: pa.Table, key_columns) -> tuple[pa.Table, pa.Table]

**Staging.** plan_apply stages a run's net changes as Parquet in the shuffle
store, in the run's lease-epoch namespace, and writes a small JSON plan
(:class:`.staging.MirrorPlan`)::

    <shuffle uri>/<table>/mirror-<name>/epoch-<n>/plan.json
    <shuffle uri>/<table>/mirror-<name>/epoch-<n>/net/upserts.parquet
    <shuffle uri>/<table>/mirror-<name>/epoch-<n>/net/deletes.parquet
    <shuffle uri>/<table>/mirror-<name>/epoch-<n>/join/...      (the Iceberg target's own objects)

XCom carries only references. ``staged`` (the dict plan_apply hands on) holds
``plan`` (the plan's key), ``upserts`` / ``deletes`` (row counts),
``snapshots`` and ``through``; ``MirrorPlan.load(ctx.runtime.store(),
staged["plan"])`` and :func:`.staging.load_net_changes` give the rest.

**Calls into the Iceberg target** (module ``iceberg_cdc.mirror.iceberg.steps``),
``ctx`` being the table's run context (``Context``: config, table, runtime)
and ``mirror`` its :class:`~iceberg_cdc.config.MirrorConfig`:

* ``plan(ctx, mirror, staged) -> dict`` with key ``"join_args":
  list[list[str]]``: one ``application_args`` list per mapped Spark task
  ``mirror_join[]``, in the shuffle phases' form ``["--phase", "mirror_join",
  "--plan", <key>, "--group", <n>, "--label", <text>]``; other keys are its
  own and are passed back to it;
* ``commit(ctx, mirror, planned) -> dict``: one Iceberg commit of the new
  data files, the position deletes / deletion vectors and the watermark;
  exactly once by that watermark; ``planned`` is ``plan``'s result merged
  over ``staged``;
* ``watermark(ctx, mirror) -> ChangelogMark | None`` (for ``make sync``, the
  CDC view and detect; a mirror never applied has None);
* optionally ``rebuild(ctx, mirror, origin="changelog" | "source") -> dict``.

For a PostgreSQL mirror plan_apply returns ``join_args: []`` (the mapped task
expands to nothing) and apply commits.
"""

from __future__ import annotations

from iceberg_cdc.mirror.net_changes import ChangelogMark, NetChanges, net_changes

__all__ = ["ChangelogMark", "NetChanges", "net_changes"]

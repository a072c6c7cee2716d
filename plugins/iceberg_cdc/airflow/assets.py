"""Airflow Assets that cost the DAG processor one hash each, not one per dependency.

Airflow hashes a DAG each time a task dependency is set (``DAG.__hash__``
covers its ``schedule``), and an :class:`~airflow.sdk.Asset` hashes by JSON-
encoding all its fields, watchers and trigger included: about a third of a
table's DAG build went there (``bench/tables.py``). The assets this package
builds are never changed after they are made, so their hash is computed once.
They serialize exactly as an :class:`~airflow.sdk.Asset` does (Airflow's
serializer sees an ``Asset``; the class lives only in the parsing process).
"""

from __future__ import annotations

from airflow.sdk import Asset


class HashOnceAsset(Asset):
    """An :class:`~airflow.sdk.Asset` whose hash is computed on first use and kept.

    Do not change its fields after it is hashed (nothing here does: the
    assets are built whole, then handed to a DAG or a task).
    """

    __slots__ = ("_hash",)

    def __hash__(self) -> int:
        try:
            return self._hash
        except AttributeError:  # first use, or a copy (attrs' copy keeps only the Asset fields)
            value: int = super().__hash__()
            object.__setattr__(self, "_hash", value)
            return value

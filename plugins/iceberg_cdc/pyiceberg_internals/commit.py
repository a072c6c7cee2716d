"""Sink commits the way exactly-once needs them: no retry inside pyiceberg, property updates that assert the head.

**pyiceberg's own commit retry is switched off.** pyiceberg 0.12's
``Transaction.commit_transaction`` retries a commit that lost the race
(``CommitFailedException``) up to ``commit.retry.num-retries`` times
(default 4), rebuilding the append on the new branch head. For the sink that
retry is wrong: the sink's commit loop must look for the marker of the source
snapshot in the new head first (another run may have committed it), and
pyiceberg's rebuild skips that check -- a snapshot could land twice. So
:func:`table_without_commit_retry` returns a copy of the table object whose
metadata says ``commit.retry.num-retries=0``. Assumptions (each pinned by a test):

* ``commit_transaction`` reads the setting from ``transaction._table.metadata.properties``
  of the table object the transaction was opened on, not from the catalog;
* ``Table(identifier, metadata, metadata_location, io, catalog, config)``
  builds an equivalent table object (the copy commits through the same catalog);
* ``TableMetadata.model_copy(update={"properties": ...})`` changes only the
  copy: nothing of the setting is sent to the catalog, so the stored table is
  untouched.

**A property update that asserts the branch head.** ``Transaction.set_properties``
carries no requirement, so the catalog would apply it on top of whatever is
current; the watermark must only move together with the head it was decided
on. :func:`set_properties_at_head` stages the update through an
``UpdateTableMetadata`` subclass implementing its private ``_commit`` (which
returns the updates and the requirements to stage).
:func:`set_properties_for_schema` does the same for the current schema: the
sink's field-id mapping is only valid for the schema it was made for.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyiceberg.schema import Schema
from pyiceberg.table import Table, TableProperties, Transaction
from pyiceberg.table.update import (
    AddSchemaUpdate,
    AssertCurrentSchemaId,
    AssertRefSnapshotId,
    SetCurrentSchemaUpdate,
    SetPropertiesUpdate,
    UpdatesAndRequirements,
    UpdateTableMetadata,
)

MAIN_BRANCH = "main"


def table_without_commit_retry(table: Table) -> Table:
    """A copy of ``table`` whose transactions are committed once, never retried inside pyiceberg."""
    metadata = table.metadata.model_copy(
        update={"properties": {**table.metadata.properties, TableProperties.COMMIT_NUM_RETRIES: "0"}}
    )
    return Table(
        identifier=table.name(),
        metadata=metadata,
        metadata_location=table.metadata_location,
        io=table.io,
        catalog=table.catalog,
        config=table.config,
    )


def adopt(table: Table, committed: Table) -> None:
    """Give ``table`` the metadata the catalog answered ``committed``'s commit with."""
    table.metadata = committed.metadata
    table.metadata_location = committed.metadata_location


class _SetPropertiesAtHead(UpdateTableMetadata["_SetPropertiesAtHead"]):
    """Set table properties, asserting the branch head the decision was made on."""

    def __init__(
        self, transaction: Transaction, properties: Mapping[str, str], head: int | None, ref: str
    ) -> None:
        super().__init__(transaction)
        self._properties = dict(properties)
        self._head = head
        self._ref = ref

    def _commit(self) -> UpdatesAndRequirements:
        return (
            (SetPropertiesUpdate(updates=self._properties),),
            (AssertRefSnapshotId(snapshot_id=self._head, ref=self._ref),),
        )


def set_properties_at_head(
    transaction: Transaction, properties: Mapping[str, str], head: int | None, ref: str = MAIN_BRANCH
) -> None:
    """Stage ``properties`` in ``transaction``, with the requirement that branch ``ref`` is still at ``head``.

    ``head`` None asserts that the branch does not exist yet (an empty table).
    A concurrent commit then fails this one with ``CommitFailedException``
    instead of being overwritten by a decision made on an older head.
    """
    _SetPropertiesAtHead(transaction, properties, head, ref).commit()


class _SetPropertiesForSchema(UpdateTableMetadata["_SetPropertiesForSchema"]):
    """Set table properties, asserting the current schema the decision was made on."""

    def __init__(self, transaction: Transaction, properties: Mapping[str, str], schema_id: int) -> None:
        super().__init__(transaction)
        self._properties = dict(properties)
        self._schema_id = schema_id

    def _commit(self) -> UpdatesAndRequirements:
        return (
            (SetPropertiesUpdate(updates=self._properties),),
            (AssertCurrentSchemaId(current_schema_id=self._schema_id),),
        )


def set_properties_for_schema(transaction: Transaction, properties: Mapping[str, str]) -> None:
    """Stage ``properties`` in ``transaction``, requiring the schema the transaction started from.

    Alone, the update asserts the current schema id. After a schema change
    staged in the same transaction it asserts the staged schema (the only one
    that validates here), and pyiceberg then keeps the first requirement of that
    kind -- the schema change's own, the schema it started from. Either way a
    concurrent schema change fails the commit with ``CommitFailedException``.
    """
    _SetPropertiesForSchema(transaction, properties, transaction.table_metadata.current_schema_id).commit()


class _SetSchemaAt(UpdateTableMetadata["_SetSchemaAt"]):
    """Make ``schema`` current, asserting the schema it was computed from is still current."""

    def __init__(self, transaction: Transaction, schema: Schema, base_schema_id: int) -> None:
        super().__init__(transaction)
        self._schema = schema
        self._base = base_schema_id

    def _commit(self) -> UpdatesAndRequirements:
        next_id = 1 + max(s.schema_id for s in self._transaction.table_metadata.schemas)
        schema = Schema(
            *self._schema.fields, schema_id=next_id, identifier_field_ids=self._schema.identifier_field_ids
        )
        return (
            (AddSchemaUpdate(schema=schema), SetCurrentSchemaUpdate(schema_id=-1)),
            (AssertCurrentSchemaId(current_schema_id=self._base),),
        )


def set_schema_at(transaction: Transaction, schema: Schema, base_schema_id: int) -> None:
    """Stage ``schema`` as the table's current one in ``transaction`` (what ``UpdateSchema`` stages).

    A schema computed earlier (by an ``UpdateSchema`` staged in a transaction
    that was never committed) is committed exactly, with its field ids, so
    data files written with it meanwhile match; the requirement fails the
    commit if another writer changed the schema since.
    """
    _SetSchemaAt(transaction, schema, base_schema_id).commit()

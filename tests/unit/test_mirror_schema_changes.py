"""The rule every mirror follows the changelog's schema by: field ids, not names."""

from __future__ import annotations

import pytest
from pyiceberg.types import IntegerType, NestedField, StringType

from iceberg_cdc.errors import MirrorSchemaError
from iceberg_cdc.mirror.schema_changes import TEMPORARY_PREFIX, Rename, schema_changes


def f(field_id: int, name: str) -> NestedField:
    return NestedField(field_id, name, StringType() if field_id != 1 else IntegerType(), required=False)


def apply(present: list[str], renames: tuple[Rename, ...]) -> list[str]:
    """The column names after the renames, failing when one takes a name still in use."""
    names = list(present)
    for r in renames:
        assert r.new not in names, f"{r} takes a name in use: {names}"
        names[names.index(r.old)] = r.new
    return names


def test_a_rename_is_a_rename_not_an_add():
    changes = schema_changes({1: "id", 2: "status"}, ["id", "status"], [f(1, "id"), f(2, "label")], "m")
    assert changes.renames == (Rename("status", "label", 2),)
    assert changes.added == ()
    assert [x.name for x in changes.matched] == ["id", "label"]
    assert changes.mapping == {1: "id", 2: "label"}


def test_a_new_field_id_is_added_and_a_missing_one_kept():
    changes = schema_changes({1: "id", 2: "status"}, ["id", "status"], [f(1, "id"), f(3, "qty")], "m")
    assert [x.name for x in changes.added] == ["qty"]
    assert changes.kept == ("status",)
    assert changes.mapping == {1: "id", 2: "status", 3: "qty"}


def test_a_name_freed_by_a_rename_may_be_taken_by_a_new_column():
    changes = schema_changes(
        {1: "id", 2: "status"}, ["id", "status"], [f(1, "id"), f(2, "label"), f(3, "status")], "m"
    )
    assert changes.renames == (Rename("status", "label", 2),)
    assert [x.name for x in changes.added] == ["status"]
    assert changes.mapping == {1: "id", 2: "label", 3: "status"}


def test_swapped_names_go_through_a_temporary_name():
    changes = schema_changes({1: "a", 2: "b"}, ["a", "b"], [f(1, "b"), f(2, "a")], "m")
    assert any(r.new.startswith(TEMPORARY_PREFIX) for r in changes.renames)
    names = apply(["a", "b"], changes.renames)
    assert names == ["b", "a"]  # the column of field 1 (first) is now called b


def test_a_chain_of_renames_is_ordered_so_no_name_is_taken_twice():
    changes = schema_changes(
        {1: "a", 2: "b", 3: "c"}, ["a", "b", "c"], [f(1, "b"), f(2, "c"), f(3, "d")], "m"
    )
    assert apply(["a", "b", "c"], changes.renames) == ["b", "c", "d"]
    assert not any(r.new.startswith(TEMPORARY_PREFIX) for r in changes.renames)


def test_a_rename_onto_a_column_added_by_hand_is_refused_naming_both():
    with pytest.raises(
        MirrorSchemaError, match=r"'status' was renamed to 'label'.*field id 2.*rename or drop"
    ):
        schema_changes({1: "id", 2: "status"}, ["id", "status", "label"], [f(1, "id"), f(2, "label")], "m")


def test_an_add_onto_a_column_added_by_hand_is_refused():
    with pytest.raises(MirrorSchemaError, match=r"new column 'note' \(field id 3\).*added by hand"):
        schema_changes({1: "id"}, ["id", "note"], [f(1, "id"), f(3, "note")], "m")


def test_an_add_onto_a_kept_column_names_its_field_id():
    with pytest.raises(MirrorSchemaError, match=r"new column 'status' \(field id 5\).*field id 2"):
        schema_changes({1: "id", 2: "status"}, ["id", "status"], [f(1, "id"), f(5, "status")], "m")


def test_a_legacy_mirror_is_mapped_by_name_and_gains_what_it_lacks():
    changes = schema_changes(None, ["id", "status", "extra"], [f(1, "id"), f(2, "status"), f(3, "qty")], "m")
    assert changes.initialised
    assert changes.renames == ()
    assert [x.name for x in changes.added] == ["qty"]
    assert changes.mapping == {1: "id", 2: "status", 3: "qty"}  # the hand-made "extra" is not the mirror's


def test_a_mapped_column_dropped_by_hand_is_added_again():
    changes = schema_changes({1: "id", 2: "status"}, ["id"], [f(1, "id"), f(2, "label")], "m")
    assert changes.renames == ()
    assert [x.name for x in changes.added] == ["label"]

"""The conditional-write probe refuses every way a store can ignore S3 preconditions.

Each careless store below is a real file store (``LocalObjectStore``, which
honours the conditions) with one condition dropped, as an S3-compatible
server that ignores a header would. The probe must name the store, the
condition it ignored, and the fix; the honest store passes and leaves nothing.
"""

from __future__ import annotations

import pytest

from iceberg_cdc.coordination import probe_conditional_writes
from iceberg_cdc.errors import StorageError
from iceberg_cdc.storage import LocalObjectStore


class IgnoresIfNoneMatch(LocalObjectStore):
    """A create-if-absent that overwrites an existing object."""

    def put_if_absent(self, key, data):
        self.put(key, data)
        return self.get_with_version(key)[1]


class IgnoresIfMatchOnPut(LocalObjectStore):
    """A replace-if-version that writes whatever version it is given."""

    def put_if_version(self, key, data, version):
        self.put(key, data)
        return self.get_with_version(key)[1]


class IgnoresIfMatchOnDelete(LocalObjectStore):
    """A delete-if-version that deletes whatever version it is given."""

    def delete_if_version(self, key, version):
        existed = self.get_with_version(key) is not None
        self.delete_prefix(key)
        return existed


class NeverDeletesConditionally(LocalObjectStore):
    """A delete-if-version that refuses even the right version (If-Match on DELETE unsupported)."""

    def delete_if_version(self, key, version):
        return False


class RefusesEveryCreate(LocalObjectStore):
    """A create-if-absent that fails on a new key (the header refused outright)."""

    def put_if_absent(self, key, data):
        return None


CARELESS = [
    (IgnoresIfNoneMatch, r"create-if-absent \(If-None-Match: \*\) overwrote an existing object"),
    (IgnoresIfMatchOnPut, r"replace-if-version \(If-Match\) wrote despite a wrong version"),
    (IgnoresIfMatchOnDelete, r"delete-if-version \(DELETE If-Match\) deleted despite a wrong version"),
    (NeverDeletesConditionally, r"delete-if-version did not delete with the right version"),
    (RefusesEveryCreate, r"a create-if-absent \(If-None-Match: \*\) of a new key failed"),
]


@pytest.mark.parametrize(("careless", "problem"), CARELESS, ids=[c.__name__ for c, _ in CARELESS])
def test_a_store_that_ignores_a_condition_is_refused_naming_it_and_the_fix(tmp_path, careless, problem):
    store = careless(tmp_path / "shuffle")
    with pytest.raises(StorageError, match=problem) as refused:
        probe_conditional_writes(store)
    message = str(refused.value)
    assert str(tmp_path / "shuffle") in message, "the error names the store"
    assert "use AWS S3 or a store that supports S3 preconditions" in message, "and the fix"


def test_a_store_that_honours_the_conditions_passes_and_keeps_nothing(tmp_path):
    store = LocalObjectStore(tmp_path / "shuffle")
    probe_conditional_writes(store)
    assert store.list("_leases/") == []

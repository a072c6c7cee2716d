"""The commit-in-flight marker goes only when the commit's outcome is known.

A commit callable that raises an error naming a refusal (the catalog's
``CommitFailedException``, a check before the catalog call) removes the
marker; any other error -- a generic ``CdcError`` raised after the catalog
call may have landed -- leaves it, so no teardown or sweep deletes the files
that commit may reference.
"""

from __future__ import annotations

import pytest
from pyiceberg.exceptions import CommitFailedException

from iceberg_cdc.coordination.commit_in_flight import MarkerState, commit_in_flight, read_marker
from iceberg_cdc.errors import (
    CdcError,
    MirrorStateError,
    SinkSchemaError,
    SourceHistoryError,
    TransientStorageError,
)
from iceberg_cdc.mirror.iceberg.commit import NOT_COMMITTED as MIRROR_NOT_COMMITTED
from iceberg_cdc.sink.commit import NOT_COMMITTED as SINK_NOT_COMMITTED
from iceberg_cdc.storage import LocalObjectStore

KEY = "t/attempt/commit-pending.json"


def _commit_raising(store: LocalObjectStore, error: BaseException, refusals: tuple[type[BaseException], ...]):
    def commit():
        assert read_marker(store, KEY).state is MarkerState.PENDING, "the marker is up during the commit"
        raise error

    with pytest.raises(type(error)):
        commit_in_flight(
            store,
            KEY,
            run_id="r",
            epoch=1,
            confirm_lease=lambda: None,
            commit=commit,
            certainly_not_committed=refusals,
        )
    return read_marker(store, KEY).state


@pytest.mark.parametrize("refusals", [SINK_NOT_COMMITTED, MIRROR_NOT_COMMITTED], ids=["changelog", "mirror"])
@pytest.mark.parametrize(
    "error",
    [
        CdcError("the file IO failed while the catalog call was under way"),
        TransientStorageError("PUT of the new metadata kept failing", retry_safe=False),
        RuntimeError("CommitStateUnknownException"),
    ],
    ids=["cdc-error", "storage-error", "unknown"],
)
def test_an_error_that_may_follow_a_landed_commit_keeps_the_marker(tmp_path, refusals, error):
    store = LocalObjectStore(tmp_path)
    assert _commit_raising(store, error, refusals) is MarkerState.PENDING


@pytest.mark.parametrize(
    ("refusals", "error"),
    [
        (SINK_NOT_COMMITTED, CommitFailedException("requirement failed")),
        (SINK_NOT_COMMITTED, SinkSchemaError("a staged file does not fit")),
        (SINK_NOT_COMMITTED, SourceHistoryError("another incarnation")),
        (MIRROR_NOT_COMMITTED, CommitFailedException("requirement failed")),
        (MIRROR_NOT_COMMITTED, MirrorStateError("the mirror moved")),
    ],
    ids=["changelog-refused", "changelog-schema", "changelog-history", "mirror-refused", "mirror-moved"],
)
def test_an_error_that_proves_nothing_landed_removes_the_marker(tmp_path, refusals, error):
    store = LocalObjectStore(tmp_path)
    assert _commit_raising(store, error, refusals) is MarkerState.ABSENT


def test_the_refusals_are_named_by_each_caller():
    """No default: a caller that forgot to name its refusals must not get a broad one."""
    with pytest.raises(TypeError, match="certainly_not_committed"):
        commit_in_flight(  # type: ignore[call-arg]
            None, KEY, run_id="r", epoch=1, confirm_lease=lambda: None, commit=lambda: None
        )

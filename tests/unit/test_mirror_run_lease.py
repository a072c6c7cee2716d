"""The Iceberg mirror target takes its run's lease from what it is given, never a name of its own."""

from __future__ import annotations

import pytest

from iceberg_cdc.mirror.iceberg.inputs import RunLease


def test_the_lease_comes_from_staged_or_from_the_staged_document():
    given = RunLease.of({"run_id": "r1", "epoch": 3, "lease": "mirror.shop.m", "lease_ttl": 60}, "shop.m")
    assert given == RunLease("mirror.shop.m", "r1", 3, 60.0)
    from_plan = RunLease.of(
        {"lease_ttl": 60}, "shop.m", {"run_id": "r2", "epoch": 0, "lease": "_mirrors/shop.orders/m"}
    )
    assert from_plan == RunLease("_mirrors/shop.orders/m", "r2", 0, 60.0)


@pytest.mark.parametrize("absent", ["lease", "run_id", "epoch"])
def test_a_staged_reference_without_its_lease_is_refused_naming_what_is_missing(absent):
    staged = {"run_id": "r1", "epoch": 3, "lease": "mirror.shop.m", "lease_ttl": 60}
    del staged[absent]
    with pytest.raises(ValueError, match=rf"shop\.m lacks \['{absent}'\]"):
        RunLease.of(staged, "shop.m")

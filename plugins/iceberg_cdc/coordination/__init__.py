"""Coordination between DAG runs: the per-table lease that keeps runs of one table apart."""

from __future__ import annotations

from iceberg_cdc.coordination.lease import (
    LEASE_PREFIX,
    LeaseInfo,
    TableLease,
    lease_key,
    probe_conditional_writes,
)

__all__ = ["LEASE_PREFIX", "LeaseInfo", "TableLease", "lease_key", "probe_conditional_writes"]

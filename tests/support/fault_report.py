"""The fault suite's report: one line per case, rendered as the README's table.

Each case of :mod:`tests.integration.test_exactly_once` records its outcome
here as it finishes (and fails on its own when rows were lost or duplicated);
the table is written once the module is done, from the cases that ran. No
case reads the report, so the cases are independent of each other and of
any file left by an earlier session.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

HEADER = (
    "| fault or operator action | rows lost | rows duplicated | commits per snapshot | table blocked |",
    "|---|---:|---:|---:|---|",
)


@dataclass(frozen=True)
class CaseOutcome:
    case: str
    lost: int
    duplicated: int
    max_commits_per_snapshot: int
    blocked_seconds: float = 0.0


@dataclass
class FaultReport:
    """The outcomes recorded so far, in the order the cases ran."""

    ttl_seconds: float
    outcomes: list[CaseOutcome] = field(default_factory=list)

    def record(self, outcome: CaseOutcome) -> None:
        self.outcomes.append(outcome)

    def markdown(self) -> str:
        lines = list(HEADER)
        for c in self.outcomes:
            blocked = (
                f"{c.blocked_seconds:.1f} s (TTL {self.ttl_seconds:.0f} s)" if c.blocked_seconds else "no"
            )
            lines.append(
                f"| {c.case} | {c.lost} | {c.duplicated} | {c.max_commits_per_snapshot} | {blocked} |"
            )
        return "\n".join(lines) + "\n"

    def write(self, path: Path) -> None:
        """Write the table (nothing when no case ran, so a deselected module leaves the last one)."""
        if not self.outcomes:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.markdown())

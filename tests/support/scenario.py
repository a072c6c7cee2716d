"""One table history shared by a module's tests, each test's place in it declared and checked.

An end-to-end module pays for every DAG run (a JVM start, an Airflow task
process), so its tests continue one history in file order instead of each
building its own. That dependence must not stay implicit: a test run alone
(``-k``), after a failed predecessor, or out of order would otherwise fail
for a reason that is not its own, or pass on a state it did not expect.

:meth:`Scenario.step` marks a test as a step of the module's history that
continues after the named steps: the test runs only when each of them passed
earlier in the session, and otherwise fails at once saying which step it
needs and how to run it. A step is recorded as passed only when its test
returned without an error.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest


class Scenario:
    """The steps of one module's history that have passed so far in this session."""

    def __init__(self, module: str) -> None:
        self.module = module
        self.passed: list[str] = []

    def step(
        self, name: str, *, after: tuple[str, ...] = ()
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def decorate(test: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(test)  # keeps the signature: pytest still injects the fixtures
            def run(*args: Any, **kwargs: Any) -> Any:
                missing = [s for s in after if s not in self.passed]
                if missing:
                    pytest.fail(
                        f"step {name!r} of {self.module} continues the history after {missing}, which did "
                        f"not pass earlier in this session (steps passed: {self.passed}). Run the module "
                        "whole, in file order.",
                        pytrace=False,
                    )
                result = test(*args, **kwargs)
                self.passed.append(name)
                return result

            return run

        return decorate

"""The shared-history guard of end-to-end modules (``tests/support/scenario.py``)."""

from __future__ import annotations

import pytest

from tests.support.scenario import Scenario


def test_a_step_runs_only_after_the_steps_it_continues():
    history = Scenario("test_module")
    calls: list[str] = []

    @history.step("first")
    def first(fixture_value):
        calls.append(fixture_value)

    @history.step("second", after=("first",))
    def second():
        calls.append("second")

    with pytest.raises(pytest.fail.Exception, match=r"step 'second' of test_module continues .*\['first'\]"):
        second()
    assert calls == [] and history.passed == []
    first("given")
    second()
    assert calls == ["given", "second"] and history.passed == ["first", "second"]


def test_a_failed_step_is_not_recorded_and_stops_what_follows():
    history = Scenario("test_module")

    @history.step("broken")
    def broken():
        raise AssertionError("the step's own failure")

    @history.step("next", after=("broken",))
    def follows():
        raise AssertionError("must not run")

    with pytest.raises(AssertionError, match="the step's own failure"):
        broken()
    assert history.passed == []
    with pytest.raises(pytest.fail.Exception, match="did not pass earlier"):
        follows()


def test_the_wrapped_test_keeps_its_fixture_signature():
    import inspect

    history = Scenario("m")

    @history.step("s")
    def test_something(pipeline, tmp_path):
        pass

    assert list(inspect.signature(test_something).parameters) == ["pipeline", "tmp_path"]
    assert test_something.__name__ == "test_something"

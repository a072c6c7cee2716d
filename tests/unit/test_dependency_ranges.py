"""requirements.txt's ranges and the two tested sets: every requirement pinned in both, inside its range.

constraints.txt is the newest tested set (``make test``), constraints-min.txt
the oldest (``make test-compat``); a range that admits versions neither set
tests, or a set that drifts out of the range, is what these catch.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
SETS = ("constraints.txt", "constraints-min.txt")


def requirements(name: str) -> list[Requirement]:
    lines = [line.split("#", 1)[0].strip() for line in (REPO / name).read_text().splitlines()]
    return [Requirement(line) for line in lines if line and not line.startswith("-")]


def pins(name: str) -> dict[str, Version]:
    found = {}
    for line in (REPO / name).read_text().splitlines():
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==(\S+)", line.strip())
        if match:
            found[canonicalize_name(match[1])] = Version(match[2])
    return found


@pytest.mark.parametrize("constraints", SETS)
def test_every_requirement_is_pinned_inside_its_range(constraints):
    pinned = pins(constraints)
    for requirement in requirements("requirements.txt") + requirements("requirements-dev.txt"):
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{constraints} does not pin {requirement.name}"
        assert requirement.specifier.contains(pinned[name], prereleases=True), (
            f"{constraints} pins {requirement.name}=={pinned[name]}, outside {requirement}"
        )


def test_make_stacks_packages_are_pinned_in_the_newest_set_only():
    """make stack runs on the newest set; the oldest set and make test never install Celery."""
    newest, oldest = pins("constraints.txt"), pins("constraints-min.txt")
    for requirement in requirements("requirements-stack.txt"):
        name = canonicalize_name(requirement.name)
        assert name in newest and requirement.specifier.contains(newest[name], prereleases=True), requirement
        assert name not in oldest, f"constraints-min.txt pins {name}, which nothing installs there"
    dev = {canonicalize_name(r.name) for r in requirements("requirements-dev.txt")}
    assert not dev & {"celery", "apache-airflow-providers-celery"}, "Celery belongs to requirements-stack.txt"


def test_the_runtime_requirements_are_ranges_whose_floor_is_the_oldest_set():
    """A lower bound below the oldest tested set would promise versions nothing tests."""
    oldest = pins("constraints-min.txt")
    for requirement in requirements("requirements.txt"):
        floors = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
        assert floors, f"requirements.txt: {requirement} has no lower bound"
        assert max(floors) == oldest[canonicalize_name(requirement.name)], (
            f"{requirement}: the floor is not the version constraints-min.txt tests"
        )


def test_the_two_ends_differ_where_the_range_says_they_do():
    """The oldest set is Airflow 3.1 with Spark 3.5 and a provider without pyspark-client."""
    oldest, newest = pins("constraints-min.txt"), pins("constraints.txt")
    assert oldest["apache-airflow"].release[:2] == (3, 1)
    assert oldest["pyspark"].release[:2] == (3, 5)
    assert oldest["apache-airflow-providers-apache-spark"].major < 6  # 6.x pulls pyspark-client 4
    assert "pyspark-client" not in oldest
    assert newest["apache-airflow"] > oldest["apache-airflow"] and newest["pyspark"] > oldest["pyspark"]


def test_the_newest_set_pins_a_pandas_its_pyspark_supports():
    """pyspark 4's client warns on every run that it "does not yet fully support pandas >= 3.0.0"."""
    newest = pins("constraints.txt")
    # pyspark-client 4.2 asks for pandas>=2.2.0
    assert Version("2.2.0") <= newest["pandas"] < Version("3"), newest["pandas"]
    assert "pytz" in newest  # pandas 2 depends on it (pandas 3 does not): a clean install has it


def test_the_pyspark_range_stops_below_the_untested_4_3():
    """pyspark 4.3.0 is released; nothing here tests it until constraints.txt moves to it."""
    [pyspark] = [r for r in requirements("requirements.txt") if canonicalize_name(r.name) == "pyspark"]
    newest = pins("constraints.txt")["pyspark"]
    assert pyspark.specifier.contains(newest) and not pyspark.specifier.contains("4.3.0"), pyspark

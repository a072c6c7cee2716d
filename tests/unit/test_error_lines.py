"""The one error line: the pipeline's own error first, its fix kept, secrets out."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

import iceberg_cdc
from iceberg_cdc import errors
from iceberg_cdc.error_lines import (
    ELLIPSIS,
    ERROR_LIMIT,
    FailedTask,
    clip,
    error_name,
    is_final_line,
    line_in_log,
    line_in_text,
    line_of,
)
from iceberg_cdc.errors import SourceFileMissingError, is_final

FIX = "Set duplicate_keys: emit_unpaired for the table to emit them unpaired."


def test_a_long_line_loses_its_middle_never_its_fix():
    message = "key (7,) has 2 DELETE rows: " + "row " * 400 + FIX
    line = line_of(errors.AmbiguousUpdateError(message))
    assert len(line) == ERROR_LIMIT
    assert line.startswith("AmbiguousUpdateError: key (7,) has 2 DELETE rows")
    assert line.endswith(FIX), line[-120:]
    assert clip("short") == "short"
    assert clip("a" * 50 + "FIX", 20).endswith("FIX")


def test_wrappers_and_multi_line_messages():
    assert line_of("AirflowFailException", "LeaseHeldError: held by run r1\nmore") == (
        "LeaseHeldError: held by run r1"
    )
    assert line_of("AirflowException", "Cannot execute: spark-submit --master local") == (
        "AirflowException: Cannot execute: spark-submit --master local"
    )
    assert line_of("ValueError", "") == "ValueError"
    # A first line that only introduces a list keeps the list (a config's problems).
    bad = errors.ConfigError("cdc.yaml is invalid:\n  tables[0].lease_ttl: not a duration\n  spark.mode: bad")
    assert (
        line_of(bad)
        == "ConfigError: cdc.yaml is invalid: tables[0].lease_ttl: not a duration; spark.mode: bad"
    )


def test_the_pipelines_error_inside_a_spark_traceback():
    text = (
        "py4j.protocol.Py4JJavaError: An error occurred\n  File x\n"
        "iceberg_cdc.errors.AmbiguousUpdateError: key (7,) has 2 DELETE rows\n"
        "\tat org.apache.spark.api.python.PythonRunner"
    )
    assert line_in_text(RuntimeError(text)) == "AmbiguousUpdateError: key (7,) has 2 DELETE rows"
    other = "pyspark.errors.exceptions.connect.SparkConnectGrpcException: <_MultiThreadedRendezvous> sc://h/;token=t0k3n99"
    assert line_in_text(RuntimeError(other), secrets=["t0k3n99"]) == (
        "SparkConnectGrpcException: <_MultiThreadedRendezvous> sc://h/;token=***"
    )


def test_the_first_error_of_a_task_log():
    messages = [
        {"event": "starting", "level": "info"},
        {"event": "*** Could not read served logs", "level": "error"},
        {"event": "Task failed", "level": "error", "error_detail": [
            {"exc_type": "ValueError", "exc_value": "inner"},
            {"exc_type": "SourceHistoryError", "exc_value": "snapshot 1 is gone\ntraceback"},
        ]},
    ]  # fmt: skip
    assert line_in_log(messages) == "SourceHistoryError: snapshot 1 is gone"
    assert line_in_log([{"event": "boom password=hunter22", "level": "error"}]) == "boom password=***"
    assert line_in_log([{"event": "fine", "level": "info"}]) is None


def test_one_failed_task_type_and_one_extraction():
    assert FailedTask("shuffle_read", 2).name == "shuffle_read[2]"
    assert FailedTask("commit").to_dict()["map_index"] == -1
    package = Path(iceberg_cdc.__file__).parent
    for path in package.rglob("*.py"):
        if path.name == "error_lines.py":
            continue
        text = path.read_text()
        assert not re.search(
            r"class FailedTask\b|def first_error_line\(|def describe_error\(|_READER_NOISE", text
        ), path


def test_final_errors_are_one_flag():
    final = {
        name for name, cls in vars(errors).items() if isinstance(cls, type) and getattr(cls, "final", False)
    }
    assert {"ConfigError", "SourceHistoryError", "LeaseLostError", "SourceFileMissingError"} <= final
    assert not errors.TransientStorageError.final and not errors.LeaseHeldError.final
    assert is_final(errors.CorruptDeleteFileError("x")) and not is_final(ValueError("x"))
    assert is_final_line("AmbiguousUpdateError: key (7,)") and is_final_line(
        "iceberg_cdc.errors.ConfigError: x"
    )
    assert not is_final_line("TransientStorageError: 503") and not is_final_line("ValueError: x")
    assert not hasattr(errors, "FINAL_ERRORS")
    missing = SourceFileMissingError.for_file("s3://w/d/f.parquet", "shop.orders", 5200992516889735211)
    assert is_final(missing)
    assert "s3://w/d/f.parquet" in str(missing)
    assert (
        "restore the file, or roll the source back past snapshot 5200992516889735211" in str(missing).lower()
    )


def test_one_pattern_reads_the_error_a_line_names():
    assert error_name("LeaseHeldError: lease of t held by run 7") == "LeaseHeldError"
    assert error_name("  iceberg_cdc.errors.ConfigError : bad key") == "ConfigError"
    assert (
        error_name("airflow.sdk.exceptions.AirflowFailException: LeaseLostError: x") == "AirflowFailException"
    )
    assert error_name("Traceback (most recent call last):") is None
    assert error_name("lowercase: not an error") is None
    assert is_final_line("  iceberg_cdc.errors.MirrorKeyError: key column id missing")
    # errors.py keeps the classes and the flag; reading lines is error_lines' alone.
    assert "re.compile" not in Path(errors.__file__).read_text()
    assert not hasattr(errors, "is_final_line")


@given(
    st.text(min_size=0, max_size=300),
    st.integers(min_value=len(ELLIPSIS) + 3, max_value=400),
    st.one_of(st.none(), st.integers(min_value=-50, max_value=500)),
)
def test_clip_never_exceeds_its_limit_and_keeps_the_end(text, limit, keep_start):
    """Any text, room and requested start: within the limit, untouched when it fits, the last character kept."""
    clipped = clip(text, limit, keep_start=keep_start)
    assert len(clipped) <= limit
    if len(text) <= limit:
        assert clipped == text
    else:
        assert ELLIPSIS in clipped and clipped.endswith(text[-1])

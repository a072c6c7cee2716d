"""The C library's allocator controls, looked up once by name."""

from __future__ import annotations

import sys

import pytest

from iceberg_cdc.libc import libc_function


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator controls")
def test_glibc_allocator_controls_are_found_and_unknown_names_are_none():
    assert libc_function("malloc_trim")(0) in (0, 1)  # 1: memory was released
    assert callable(libc_function("mallopt"))
    assert libc_function("cdc_no_such_function") is None

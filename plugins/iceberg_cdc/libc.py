"""glibc's allocator controls, for the processes that decide when memory goes back to the OS."""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any


def libc_function(name: str) -> Any | None:
    """The C library's function ``name`` (e.g. ``malloc_trim``, ``mallopt``), or None where it has none."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None

"""Spark Python workers between tasks: the per-task garbage collection kept off what the imports
left alive, and the memory a task frees kept for the next task.

Shared by both ways a phase runs its units (``spark_app``'s RDD tasks under
spark-submit, ``connect_app``'s ``mapInArrow`` on a Spark Connect server):
both reuse Python workers, and both pay PySpark's collection after every task.
"""

from __future__ import annotations

import gc
import sys

from iceberg_cdc.libc import libc_function

_frozen_with_modules = 0  # on a Spark Python worker: len(sys.modules) at its last gc.freeze()


def settle_worker_heap() -> None:
    """On a Spark Python worker: hide what its imports left alive from the cyclic GC (``gc.freeze``).

    A reused PySpark worker runs a full ``gc.collect()`` after every task,
    before it takes the next one (``pyspark/daemon.py``). With pyarrow,
    pyiceberg and this package imported (~120 k objects) that collection takes
    0.1-0.2 s, more on a busy host -- on every task, while the task's core
    waits. Frozen objects are skipped by the cyclic GC (refcounting still frees
    them), so the collections after this see only the tasks' own objects:
    40 one-unit tasks on ``local[2]`` took 2.7-3.0 s instead of 7.6-7.9 s (a busy
    2-core host).

    It runs (a collection, then the freeze) only when a unit imported modules
    since the last freeze -- a few times in a worker's life -- so whatever
    cycles are alive then and die later stay uncollected only those few times.
    Outside a Spark task (tests, the in-process runner) it does nothing.
    """
    global _frozen_with_modules
    if len(sys.modules) == _frozen_with_modules:
        return
    from pyspark import TaskContext

    if TaskContext.get() is None:
        return
    gc.collect()
    gc.freeze()
    _frozen_with_modules = len(sys.modules)


# --- memory kept between tasks ----------------------------------------------------------------

# The Python workers' environment, set where the workers start (spark-submit's
# spark.executorEnv.*, the Spark Connect server's environment): Arrow's allocator
# (mimalloc) reads it once, when it loads. -1: never hand freed memory back.
WORKER_ENV = {"MIMALLOC_PURGE_DELAY": "-1"}
_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit
_TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int
_kept = False


def keep_worker_memory() -> None:
    """On a Spark Python worker: keep the memory a task frees for the worker's next task.

    A task's working set (hundreds of MB: decoded columns, the cancel buffer)
    is freed at its end, and by default the allocators hand it back to the
    OS; the worker's next task then faults every page in again, zeroed by the
    kernel. On this project's VMs, where the host takes back memory left free
    for a few seconds, that was 0.7 s of system time for each worker's first
    task of a run and 1-2 s per run in all (``docs/benchmarks.md``). A JVM
    executor keeps its heap; with this a Python worker keeps its peak, until
    Spark stops it after a minute idle.

    Here, for glibc's heap (NumPy arrays, Python objects): blocks up to 32 MB
    come from the heap and the heap is not trimmed (``mallopt``; an explicit
    ``malloc_trim`` after a spill still trims). Arrow's own allocator is kept
    by :data:`WORKER_ENV` in the workers' environment, which this process
    cannot change after the fact. Once per worker; outside a Spark task it
    does nothing.
    """
    global _kept
    if _kept:
        return
    from pyspark import TaskContext

    if TaskContext.get() is None:
        return
    _kept = True
    mallopt = libc_function("mallopt")
    if mallopt is not None:
        mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)
        mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)

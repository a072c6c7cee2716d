"""Spark Python workers: keep the per-task garbage collection off what the imports left alive.

Shared by both ways a phase runs its units (``spark_app``'s RDD tasks under
spark-submit, ``connect_app``'s ``mapInArrow`` on a Spark Connect server):
both reuse Python workers, and both pay PySpark's collection after every task.
"""

from __future__ import annotations

import gc
import sys

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

"""How long to wait before a retry: one policy type and the pipeline's named policies.

Every retry loop of the pipeline -- S3 requests of the shuffle store, reads
and writes of Iceberg files through the retrying FileIO, sink commits that
lost a race -- waits by :meth:`RetryPolicy.delay`: exponential backoff with
*full jitter*, retry ``n`` (0 for the first) waiting a uniform random time in
``[0, min(max_delay, base_delay * 2**n)]``. Full jitter because the waiting
parties are many and alike (Spark tasks of one phase hitting one S3 prefix,
DAG runs of one table): equal waits would retry in lockstep and collide
again, while a uniform spread from zero keeps the total work lowest (AWS
Architecture Blog, "Exponential Backoff And Jitter"). What is retried, and
when to give up, stays with each loop; only the timing lives here.

The named policies below are the defaults; a caller that takes its attempts
from configuration replaces them (``dataclasses.replace``).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries with exponential backoff and full jitter.

    ``attempts`` counts every call, the first included; ``base_delay`` and
    ``max_delay`` are seconds.
    """

    attempts: int
    base_delay: float
    max_delay: float

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.base_delay < 0 or self.max_delay < 0:
            raise ValueError(
                f"a retry policy needs attempts >= 1 and delays >= 0, got attempts={self.attempts}, "
                f"base_delay={self.base_delay}, max_delay={self.max_delay}"
            )

    @property
    def retries(self) -> int:
        """How many calls may follow the first."""
        return self.attempts - 1

    def ceiling(self, retry: int) -> float:
        """The longest wait before retry number ``retry`` (0 for the first retry)."""
        if retry < 0:
            raise ValueError(f"retry numbers start at 0, got {retry}")
        return min(self.max_delay, self.base_delay * 2.0 ** min(retry, 64))

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry``: uniform in ``[0, ceiling(retry)]``."""
        return random.uniform(0.0, self.ceiling(retry))

    def sleep(self, retry: int) -> None:
        """Wait :meth:`delay` seconds before retry number ``retry``."""
        time.sleep(self.delay(retry))


# Every S3 request of the shuffle store and the leases (:class:`iceberg_cdc.storage.s3.S3ObjectStore`),
# the only retry layer of its boto3 client (botocore makes one attempt): a 5xx or throttling answer,
# a dropped connection, a body cut mid-stream, keys a batch DELETE reported as failed. 8 attempts,
# waits of at most 0.2, 0.4 ... 5 s (16.2 s in all).
S3_REQUEST = RetryPolicy(attempts=8, base_delay=0.2, max_delay=5.0)
# Reads, uploads and deletes of the retrying FileIO (:mod:`iceberg_cdc.storage.retrying_io`); the
# catalog properties ``cdc.io.retry-*`` override them.
FILE_IO = RetryPolicy(attempts=8, base_delay=0.1, max_delay=3.0)
# A sink commit that lost the compare-and-swap (:mod:`iceberg_cdc.sink.commit`): reload, look for the
# marker again, then commit on the new head; waits of up to 0.2 s before the first retry, 3.2 s before the last.
SINK_COMMIT = RetryPolicy(attempts=6, base_delay=0.2, max_delay=4.0)
# A commit to an Iceberg mirror that lost the race (:mod:`iceberg_cdc.mirror.iceberg.commit`): the
# same waits, one attempt fewer (a mirror that moved under its plan is refused, not retried).
MIRROR_COMMIT = RetryPolicy(attempts=5, base_delay=0.2, max_delay=4.0)

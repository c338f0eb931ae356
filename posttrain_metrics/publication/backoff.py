"""One retry schedule for everything the publisher waits out: exponential, capped.

A tracker that is down, or a publisher process that keeps dying, is tried again after 1, 2, 4, 8, 16,
32, then every 60 seconds: a fault that clears within seconds costs seconds, and one that takes a
minute or more to clear (a tracking server being restarted, a tracker whose disk was full) is still
reached, at the cost of one attempt a minute meanwhile. Retrying at a fixed short interval instead
spends every attempt within seconds on a fault that lasts a minute (a crash-looping publisher once
spent its ten restarts in ten seconds).
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["FIRST", "LIMIT", "Backoff"]

FIRST = 1.0
"""Seconds before the first retry; each later one waits twice as long as the one before, up to LIMIT."""

LIMIT = 60.0
"""The longest wait between two attempts."""


class Backoff:
    """When the next attempt is due after ``failures`` failed ones: ``first * 2**(failures-1)``
    seconds after the last failure, at most ``limit``. ``clock`` (monotonic seconds) is injected so
    that a test walks the schedule without waiting it out.

    >>> now = [0.0]
    >>> b = Backoff(clock=lambda: now[0])
    >>> [b.failed() for _ in range(8)]
    [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    >>> b.due(), b.waited()
    (False, 0.0)
    """

    def __init__(self, *, first: float = FIRST, limit: float = LIMIT,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.first = first
        self.limit = limit
        self.clock = clock
        self.failures = 0
        self.since = clock()  # the first failure of this series
        self.next_at = self.since

    def delay(self, failures: int) -> float:
        """The wait after the ``failures``-th failure in a row."""
        return float(min(self.limit, self.first * 2 ** min(failures - 1, 62)))

    def failed(self) -> float:
        """Record a failed attempt; the seconds until the next one is due."""
        now = self.clock()
        if self.failures == 0:
            self.since = now
        self.failures += 1
        wait = self.delay(self.failures)
        self.next_at = now + wait
        return wait

    def due(self) -> bool:
        """Whether the next attempt may be made now."""
        return self.clock() >= self.next_at

    def hurry(self) -> None:
        """Make the next attempt due now (a last one, before giving up)."""
        self.next_at = self.clock()

    def waited(self) -> float:
        """Seconds since the first failure of this series."""
        return self.clock() - self.since if self.failures else 0.0

    def reset(self) -> None:
        """An attempt succeeded: the next failure starts a new series at ``first``."""
        self.failures = 0

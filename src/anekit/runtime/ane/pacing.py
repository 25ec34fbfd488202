"""Pacing compiles after a failure: a failed compile restarts the shared compile service; the next waits.

sbryngelson/ane-guide part-5-practice/19-pitfalls-and-limits.md, "Pacing compiles after a failure": a
compile that fails restarts the compile service, which takes a few seconds to come back; failures that
arrive faster than it restarts keep it from making progress and slow unrelated compiles down; failures
spaced past the restart interval cause no degradation. "On detecting a failed compile, wait at least one
restart interval, roughly 15 seconds, before the next compile"; no failure-count cap is needed.

So the process keeps one ``CompilePacer`` (``PACER``; the service is shared, a backend object is not the
unit): after a compile the engine refused, the next compile of the process starts no sooner than
``FAILED_COMPILE_PAUSE`` seconds later (rule process.failed-compile-pause). Compiles refused on the host
before anything reaches the framework (the rule book, missing weights) are not failures of the service
and are not paced. The clock and the sleep are injectable: tests give a virtual clock and never sleep.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

# Seconds between a failed compile and the next compile: one restart interval of the compile service,
# "roughly 15 seconds" (sbryngelson/ane-guide part-5-practice/19-pitfalls-and-limits.md).
FAILED_COMPILE_PAUSE = 15.0


class CompilePacer:
    """Holds the next compile back until ``pause`` seconds have passed since the last failed one.

    ``waits`` lists every pause taken (seconds), for ``anekit doctor`` and the tests.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        pause: float = FAILED_COMPILE_PAUSE,
    ) -> None:
        self.clock = clock
        self.sleep = sleep
        self.pause = pause
        self.waits: list[float] = []
        self._lock = threading.Lock()
        self._failed_at: float | None = None

    def before_compile(self) -> float:
        """Wait out what is left of the pause after the last failure; the seconds waited."""
        with self._lock:
            failed_at = self._failed_at
        if failed_at is None:
            return 0.0
        left = failed_at + self.pause - self.clock()
        if left <= 0:
            return 0.0
        self.waits.append(left)
        self.sleep(left)
        return left

    def failed(self) -> None:
        """The compile just sent was refused by the engine: pace the next one."""
        with self._lock:
            self._failed_at = self.clock()


PACER = CompilePacer()  # the process's: every backend object's compiles go through the one service

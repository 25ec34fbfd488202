"""Shared by the fuzz tests: a watchdog that turns a hang into a test failure."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def watchdog(seconds: int) -> Iterator[None]:
    """Fail with TimeoutError instead of hanging when one input takes longer than ``seconds``.

    Uses SIGALRM where the platform has it; elsewhere the body simply runs.
    """
    if sys.platform == "win32" or not hasattr(signal, "SIGALRM"):
        yield
        return

    def fire(signum: int, frame: object) -> None:
        raise TimeoutError(f"one fuzz input took more than {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)

"""What one process keeps loaded on the engine: the loaded-program ceiling and the periodic refresh.

The ceiling (rule process.loaded-program-ceiling): sbryngelson/ane-guide
part-4-workloads/14-llm-case-study.md, "The loaded-program cap is near 128 programs per process: the next
load fails with `GetANEFModel: must re-compile`". anekit keeps at most ``MAX_LOADED`` engine models loaded
per process — a margin under the published "near 128", as the compile budget of 100 sits under the
measured ~119 — counted over every backend object of the process. Loading one more first unloads the
least recently used loaded model; that model's kernel stays loaded as its user sees it and reloads itself
before its next run. Only when every other loaded model is busy in another thread (its kernel lock held)
is the load refused, with LoadFailed naming the ceiling.

The refresh (rule process.dual-die-throughput): ncdrone/rustane pull request #9 (M3 Ultra, macOS 26.3.1)
measured "ANE throughput degrades after ~100K cumulative doEvaluateDirectWithModel: calls" and added a
periodic kernel refresh to reset the firmware state. anekit counts the evaluations of the process; after
every ``REFRESH_EVALUATIONS`` of them, each loaded model unloads and reloads itself before its next
evaluation (no compile: the budget is untouched). The follow-up pull request #12 measured the onset at
~28K dispatches on one die and restarts the process every 40 steps; the trainer's compile-budget
re-execution restarts long runs as well. Both limits are attributes of ``RESIDENCY`` (tests make a small
one); ``reset`` is for tests.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Protocol

from anekit.errors import LoadFailed

LOADED_PROGRAM_CEILING = 128  # "near 128 programs per process" (ane-guide ch. 14)
MAX_LOADED = 120  # what anekit keeps loaded at most, under the ceiling
REFRESH_EVALUATIONS = 100_000  # "~100K cumulative" evaluations (ncdrone/rustane pull request #9)


class Resident(Protocol):
    """A loaded engine model as the residency sees it (``anekit.runtime.ane.lifecycle.EngineModel``)."""

    name: str

    @property
    def lock(self) -> threading.RLock: ...

    def evict(self) -> None: ...


class Residency:
    """The engine models loaded in this process, least recently used first, and its evaluation count."""

    def __init__(self, max_loaded: int = MAX_LOADED, refresh_every: int = REFRESH_EVALUATIONS) -> None:
        self.max_loaded = max_loaded
        self.refresh_every = refresh_every  # 0: never refresh
        self.evaluations = 0
        self.evictions = 0
        self.refreshes = 0
        self._lock = threading.Lock()
        self._loaded: OrderedDict[int, Resident] = OrderedDict()

    @property
    def loaded(self) -> int:
        return len(self._loaded)

    @property
    def epoch(self) -> int:
        """How many refresh intervals the process's evaluations have completed."""
        return self.evaluations // self.refresh_every if self.refresh_every > 0 else 0

    def make_room(self, model: Resident) -> None:
        """Before ``model`` loads: unload least recently used models until it fits under ``max_loaded``."""
        while True:
            with self._lock:
                if id(model) in self._loaded or len(self._loaded) < self.max_loaded:
                    return
                candidates = [m for m in self._loaded.values() if m is not model]
            for victim in candidates:  # least recently used first; a busy one (locked elsewhere) is skipped
                if victim.lock.acquire(blocking=False):
                    try:
                        victim.evict()
                    finally:
                        victim.lock.release()
                    with self._lock:
                        self.evictions += 1
                    break
            else:
                raise LoadFailed(
                    f"[ane] kernel '{model.name}': {len(candidates)} programs are loaded in this process, "
                    f"the most anekit keeps ({self.max_loaded}; the engine's ceiling is near "
                    f"{LOADED_PROGRAM_CEILING} per process, rule process.loaded-program-ceiling), and every "
                    "one is in use by another thread: unload or close a kernel first"
                )

    def entered(self, model: Resident) -> None:
        with self._lock:
            self._loaded[id(model)] = model
            self._loaded.move_to_end(id(model))

    def left(self, model: Resident) -> None:
        with self._lock:
            self._loaded.pop(id(model), None)

    def evaluated(self, model: Resident) -> None:
        """One evaluation of ``model``: it becomes the most recently used, and the process count grows."""
        with self._lock:
            self.evaluations += 1
            if id(model) in self._loaded:
                self._loaded.move_to_end(id(model))

    def reset(self) -> None:
        """For tests: nothing loaded, no evaluations, as in a fresh process."""
        with self._lock:
            self._loaded.clear()
            self.evaluations = self.evictions = self.refreshes = 0


RESIDENCY = Residency()  # the process's (rules process.loaded-program-ceiling, process.dual-die-throughput)

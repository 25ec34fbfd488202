"""The real-time evaluation variants, tried in the order of the evidence, the first that works kept.

``AneBackend(realtime=True)`` evaluates through ``_ANEClient``'s real-time call where it works (rule
process.realtime-eval). The public record has two ways of driving it:

``in-memory-model``  maderix/ANE commit 99ba013 (training/ane_runtime.h ``ane_eval_rt``,
    training/test_bench_paths.m, docs/ANE_CHAINING_RESEARCH.md): -[_ANEClient
    evaluateRealTimeWithModel:options:request:error:] handed the _ANEInMemoryModel itself, an empty
    options dictionary and the model's request, with no real-time load and no task bracket
    ("beginRealTimeTask returning NO does not prevent evaluateRealTimeWithModel: from working");
    measured 1.74x (50 iterations) and 1.88x (200) faster than the standard call at 64x32 on an M4 Max,
    no faster at 768x256. Tried first: it is the variant measured working.
``model-property``  bridge code (christopherkarani/Espresso Sources/ANEInterop/ane_interop.m): the
    model's ``model`` property (an _ANEModel) loaded with beginRealTimeTask +
    loadRealTimeModel:options:qos:error: after the normal load, evaluated with the same _ANEModel,
    unloadRealTimeModel + endRealTimeTask before the normal unload. Espresso AGENTS.md (M3 Max, macOS 15):
    "loadRealTimeModel: returns NO with no error. Silent entitlement gate." Tried second.
``standard``  -[_ANEInMemoryModel evaluateWithQoS:options:request:error:], what every project runs.

The process tries them in that order at its first real-time evaluation; a variant that fails (an NSError,
or NO without one) is not tried again — unless the standard call then fails as well, which makes it the
program's failure, not the variant's — and the first that works is kept for every kernel of the backend
and remembered per chip and macOS (``anekit.runtime.ane.memory``, trial id ``realtime``), so the next
process starts with it. This is not an ``anekit.engine.trials.Trial``: the standard call always works and
is the fallback, not a rival to rank, and the second variant has no hardware run to its name.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from anekit.runtime.ane.api import (
    CLIENT_BEGIN_REALTIME,
    CLIENT_END_REALTIME,
    CLIENT_EVALUATE_REALTIME,
    CLIENT_LOAD_REALTIME,
    CLIENT_SHARED,
    CLIENT_UNLOAD_REALTIME,
    MODEL_ANE_MODEL,
)
from anekit.runtime.ane.memory import Attempt
from anekit.runtime.ane.objc import Message

TRIAL = "realtime"  # the key of the outcome in the backend's memory
IN_MEMORY_MODEL = "in-memory-model"
MODEL_PROPERTY = "model-property"
STANDARD = "standard"
VARIANTS = (IN_MEMORY_MODEL, MODEL_PROPERTY)  # the evidence's order; the standard call comes last
NEEDS: dict[str, tuple[Message, ...]] = {
    IN_MEMORY_MODEL: (CLIENT_SHARED, CLIENT_EVALUATE_REALTIME),
    MODEL_PROPERTY: (
        CLIENT_SHARED,
        MODEL_ANE_MODEL,
        CLIENT_BEGIN_REALTIME,
        CLIENT_END_REALTIME,
        CLIENT_LOAD_REALTIME,
        CLIENT_UNLOAD_REALTIME,
        CLIENT_EVALUATE_REALTIME,
    ),
}


class RealtimePaths:
    """The variant this backend's kernels evaluate with: ``current()``, until one has worked (``chosen``).

    ``settle(value, attempts)`` is called once, when a variant first works, or when the standard call
    works after every variant failed.
    """

    def __init__(
        self,
        order: Sequence[str] = VARIANTS,
        settle: Callable[[str, tuple[Attempt, ...]], None] | None = None,
    ) -> None:
        self.order = tuple(order)
        self.chosen: str | None = STANDARD if not self.order else None
        self.attempts: list[Attempt] = []
        self._settle = settle
        self._settled_value: str | None = None
        self._lock = threading.Lock()

    def current(self) -> str:
        """The variant to evaluate with now: the chosen one, else the first not yet failed."""
        with self._lock:
            if self.chosen is not None:
                return self.chosen
            failed = {a.value for a in self.attempts}
            return next((v for v in self.order if v not in failed), STANDARD)

    def failed(self, variant: str, why: str) -> None:
        """``variant`` failed before any worked: the next is tried; the standard call once none is left."""
        with self._lock:
            if self.chosen is not None or any(a.value == variant for a in self.attempts):
                return
            self.attempts.append(Attempt(variant, why))
            if len(self.attempts) == len(self.order):
                self.chosen = STANDARD  # settled once the standard call has worked (``standard_worked``)

    def standard_worked(self) -> None:
        """The standard call worked after every variant failed: that is the outcome to remember."""
        if self.chosen == STANDARD and self.order:
            self._settled(STANDARD)

    def forgive(self, variants: Sequence[str]) -> None:
        """The standard call failed too: the failures of ``variants`` were the program's, not theirs, so
        they are tried again (and nothing is settled on their account)."""
        with self._lock:
            if self.chosen not in (None, STANDARD):
                return
            self.attempts = [a for a in self.attempts if a.value not in variants]
            self.chosen = None

    def worked(self, variant: str) -> None:
        with self._lock:
            if self.chosen is not None:
                return
            self.chosen = variant
        self._settled(variant)

    def _settled(self, value: str) -> None:
        if self._settle is not None and self._settled_value != value:
            self._settled_value = value
            self._settle(value, (*self.attempts, Attempt(value)))

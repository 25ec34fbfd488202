"""The backend class and its kernels: compile a program for the engine, then load / run / unload it.

Threads: each kernel has its own lock (``AneKernel.lock``, re-entrant) held for the whole of
``load``, ``run``, ``unload``, ``close`` and ``kernel(**arrays)``, so one kernel can be shared
between threads: calls on it are serialised, and its request is never rebuilt or released while an
evaluation is using it. Different kernels run concurrently (each owns its surfaces and request).
Surface reads and writes take the surface's own lock; writing a kernel's inputs from one thread while
another runs it is a data race the lock does not prevent — use ``kernel(**arrays)``, which holds the
kernel lock from the writes to the reads.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from anekit.engine.trials import DIALECT
from anekit.errors import CompilationFailed, EvalFailed, MilDialectError
from anekit.mil.dialect import dialect as mil_dialect
from anekit.mil.ir import Function, Program
from anekit.mil.printer import print_program
from anekit.rules import check_chip, check_surface_plan
from anekit.rules.checks import enforce
from anekit.runtime.ane.api import ANE_FRAMEWORK, CLIENT_SHARED, QOS, REALTIME, REQUIRED, first_missing
from anekit.runtime.ane.availability import chip_name, native_runtime
from anekit.runtime.ane.binding import Layout
from anekit.runtime.ane.lifecycle import EngineModel
from anekit.runtime.ane.memory import Attempt, Memory, Outcome, now
from anekit.runtime.ane.objc import Id, ObjCRuntime
from anekit.runtime.ane.surfaces import AneSurface, copy_surface
from anekit.runtime.ane.weights import check_weights, weight_files
from anekit.runtime.base import DEFAULT_COMPILE_BUDGET, Backend, Kernel, Surface, WeightSource, strict_default

if TYPE_CHECKING:
    from anekit.runtime.ane.chaining import Chain


class AneKernel(Kernel):
    """A kernel compiled for the engine: IOSurface-backed surfaces, and a request built on every load.

    ``inputs`` / ``outputs`` are in the program's order; ``engine_inputs`` / ``engine_outputs`` in the
    order the engine binds them (alphabetical by MIL name, ``anekit.runtime.ane.binding``).
    ``realtime_failure`` says why the real-time path (if asked for) is not used.
    """

    def __init__(self, backend: AneBackend, fn: Function, layout: Layout, engine: EngineModel) -> None:
        super().__init__(backend, fn)
        self.layout = layout
        self.lock = threading.RLock()
        self._engine = engine
        self._owned.append(engine)  # first: unloaded and released before its surfaces
        try:
            rt = backend.runtime
            self.inputs = [
                self._own(AneSurface(rt, s.shape, s.dtype.name, s.name, layout.input_alloc))
                for s in self.inputs
            ]
            self.outputs = [
                self._own(AneSurface(rt, s.shape, s.dtype.name, s.name, layout.output_alloc))
                for s in self.outputs
            ]
            engine.bind(self.engine_inputs, self.engine_outputs)
        except BaseException:
            self.close()
            raise

    def _own(self, surface: AneSurface) -> AneSurface:
        self._owned.append(surface)
        return surface

    @property
    def engine_inputs(self) -> list[AneSurface]:
        """The input surfaces in the order the engine binds them."""
        return [self.inputs[i] for i in self.layout.inputs]  # type: ignore[misc]

    @property
    def engine_outputs(self) -> list[AneSurface]:
        """The computed output surfaces in the order the engine binds them."""
        return [self.outputs[j] for j in self.layout.outputs]  # type: ignore[misc]

    @property
    def realtime_failure(self) -> str | None:
        return self._engine.realtime_failure

    # -- the kernel lock around the lifecycle -------------------------------------------------------

    def load(self) -> AneKernel:
        with self.lock:
            super().load()
        return self

    def unload(self) -> None:
        with self.lock:
            super().unload()

    def close(self) -> None:
        with self.lock:
            super().close()

    def run(self) -> None:
        with self.lock:
            super().run()

    def __call__(self, **arrays: Any) -> dict[str, np.ndarray]:
        with self.lock:
            return super().__call__(**arrays)

    # -- backend hooks ------------------------------------------------------------------------------

    def _load(self) -> None:
        self._engine.load()

    def _unload(self) -> None:
        self._engine.unload()

    def _run(self) -> None:
        engine = self._engine
        if engine.realtime and engine.realtime_failure is None:
            try:
                engine.evaluate_realtime()
            except EvalFailed as e:
                engine.realtime_failure = str(e)  # stay on the standard call from now on
                engine.evaluate()
        else:
            engine.evaluate()
        self.host_copies()

    def host_copies(self) -> None:
        """Fill the outputs that repeat an input or another output (never sent to the engine)."""
        for kind, src, dst in self.layout.host_copies:
            copy_surface(self.inputs[src] if kind == "input" else self.outputs[src], self.outputs[dst])


class AneBackend(Backend):
    """Compiles MIL for the Neural Engine and runs it there (macOS on Apple silicon).

    ``runtime``: the objc runtime to drive (default: the system's; tests pass a fake). ``realtime``:
    evaluate through ``_ANEClient``'s real-time calls where they exist (opt-in; any failure falls back
    to the standard call, see ``anekit.runtime.ane.lifecycle``). ``chaining``: let ``chain()`` try
    ``_ANEChainingRequest``. ``chip`` ("m1".."m5", "any"; default: this Mac's) is the chip whose rules
    the backend enforces before compiling; ``strict=False`` (or ``ANEKIT_STRICT=0``) sends anything to
    the compiler, to explore what the rule book does not yet know.

    The MIL dialect is a trial (``anekit.engine.trials.DIALECT``): the public record has M1 machines
    compiling program(1.3) / ios18 on macOS 15 and needing program(1.0) / ios16 on macOS 26, so the
    backend tries the dialects in the order with the most hardware runs for this chip and macOS, falls
    back on ``CompilationFailed``, and remembers what compiled (``memory``, default the per-user file of
    ``anekit.runtime.ane.memory``). ``dialect`` ("ios18" or "ios16") fixes it instead.
    """

    name = "ane"

    def __init__(
        self,
        compile_budget: int = DEFAULT_COMPILE_BUDGET,
        *,
        runtime: ObjCRuntime | None = None,
        qos: int = QOS,
        realtime: bool = False,
        chaining: bool = False,
        chip: str | None = None,
        strict: bool | None = None,
        dialect: str | None = None,
        memory: Memory | None = None,
    ) -> None:
        super().__init__(compile_budget)
        self.chip = check_chip(chip) if chip is not None else chip_name()
        self.fixed_dialect = mil_dialect(dialect).name if dialect is not None else None
        self.memory = memory if memory is not None else Memory()
        self.strict = strict_default() if strict is None else bool(strict)
        self.runtime = runtime if runtime is not None else native_runtime()
        self.runtime.load_framework(ANE_FRAMEWORK)
        for message in REQUIRED:
            self.runtime.bind(message)
        self.dialect: str | None = self.fixed_dialect  # the dialect of the last compile that succeeded
        self.qos = qos
        self.chaining = chaining
        self.realtime = False
        self.realtime_unavailable: str | None = None
        self._client: Id | None = None
        if realtime:
            missing = first_missing(self.runtime, REALTIME)
            if missing is not None:
                self.realtime_unavailable = f"{missing} is not available ({self.runtime.os_version})"
            else:
                with self.runtime.autorelease_pool():
                    self._client = self.runtime.send(CLIENT_SHARED)  # a process-wide singleton
                self.realtime = self._client is not None
                if not self.realtime:
                    self.realtime_unavailable = f"{CLIENT_SHARED} returned nil"

    def _compile(self, prog: Program, fn: Function, weights: dict[str, WeightSource]) -> Kernel:
        if self.strict:
            enforce(prog, fn, self.chip, weights, "ane backend")
        layout = Layout.of(fn)
        broken = check_surface_plan(*layout.plan(), chip=self.chip) if self.strict else []
        if broken:  # Layout sizes and orders surfaces by the rules: this would be a bug in Layout
            raise CompilationFailed(f"[compile] surface plan of '{fn.name}': {'; '.join(map(str, broken))}")
        files = weight_files(weights)
        check_weights(fn, files)
        engine_prog = Program({"main": layout.fn}, prog.version, dict(prog.attributes))
        macos = self.runtime.os_version
        recalled = None if self.fixed_dialect else self.memory.recall(DIALECT.id, self.chip, macos)
        attempts: list[Attempt] = []
        failures: list[CompilationFailed] = []
        for n, dialect in enumerate(self.dialect_order(recalled)):
            if n and self.compile_count >= self.compile_budget:  # each attempt is a compile on the engine
                attempts.append(Attempt(dialect, "not tried: the compile budget is used up"))
                break
            try:
                text = print_program(engine_prog, dialect=dialect)
            except MilDialectError as e:  # the program cannot be written in this dialect: nothing compiled
                attempts.append(Attempt(dialect, str(e).splitlines()[0]))
                failures.append(CompilationFailed(f"[compile] '{fn.name}' for {self.chip}: {e}"))
                continue
            self.compile_count += bool(n)
            engine = EngineModel(self.runtime, fn.name, self.qos, self._client if self.realtime else None)
            try:
                engine.compile(text, files)
            except CompilationFailed as e:
                engine.close()
                attempts.append(Attempt(dialect, str(e).splitlines()[0]))
                failures.append(e)
                continue
            except BaseException:
                engine.close()
                raise
            self.dialect = dialect
            if not self.fixed_dialect and (recalled is None or recalled.value != dialect):
                self.memory.remember(
                    Outcome(DIALECT.id, self.chip, macos, dialect, (*attempts, Attempt(dialect)), now())
                )
            try:
                return AneKernel(self, fn, layout, engine)
            except BaseException:
                engine.close()
                raise
        # Every dialect failed: the first (the likeliest) failure is raised, naming the other attempts.
        first = failures[0]
        if len(attempts) > 1:
            others = "; ".join(f"{a.value}: {a.error}" for a in attempts[1:])
            first.args = (f"{first.args[0] if first.args else first} (also tried {others})", *first.args[1:])
        raise first

    def preferred_dialect(self) -> str:
        """The dialect the next compile tries first."""
        recalled = (
            None if self.fixed_dialect else self.memory.recall(DIALECT.id, self.chip, self.runtime.os_version)
        )
        return self.dialect_order(recalled)[0]

    def dialect_order(self, recalled: Outcome | None = None) -> tuple[str, ...]:
        """The dialects to try: the fixed one; else what compiled last time on this chip and macOS, then
        the trial's order for them."""
        if self.fixed_dialect:
            return (self.fixed_dialect,)
        order = DIALECT.order(self.chip, self.runtime.os_version)
        if recalled is not None and recalled.value in order:
            order = (recalled.value, *(d for d in order if d != recalled.value))
        return order

    def chain(
        self, kernels: Sequence[Kernel], links: Sequence[tuple[Surface, Surface]] | None = None
    ) -> Chain:
        """Kernels that run back to back, outputs feeding later inputs (see ``Chain``)."""
        from anekit.runtime.ane.chaining import Chain

        return Chain(self, kernels, links)

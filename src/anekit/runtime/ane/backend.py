"""The macOS backend class: compile a program for the engine (rules, layout, weights, the MIL dialect
trial), hand back its kernel, and chain kernels."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from anekit.engine.trials import DIALECT
from anekit.errors import CompilationFailed, MilDialectError
from anekit.mil.dialect import dialect as mil_dialect
from anekit.mil.ir import Function, Program
from anekit.mil.printer import print_program
from anekit.rules import check_chip, check_surface_plan
from anekit.rules.checks import enforce
from anekit.runtime.ane.api import ANE_FRAMEWORK, CLIENT_SHARED, QOS, REQUIRED, first_missing
from anekit.runtime.ane.availability import chip_name, native_runtime
from anekit.runtime.ane.binding import Layout
from anekit.runtime.ane.chaining import Chain
from anekit.runtime.ane.kernel import AneKernel
from anekit.runtime.ane.lifecycle import EngineModel
from anekit.runtime.ane.memory import Attempt, Memory, Outcome, now
from anekit.runtime.ane.objc import Id, ObjCRuntime, macos_release
from anekit.runtime.ane.realtime import NEEDS, STANDARD, VARIANTS, RealtimePaths
from anekit.runtime.ane.realtime import TRIAL as REALTIME_TRIAL
from anekit.runtime.ane.weights import check_weights, content_names, weight_files, with_blob_paths
from anekit.runtime.base import (
    DEFAULT_COMPILE_BUDGET,
    PROCESS_COMPILES,
    Backend,
    Kernel,
    Surface,
    WeightSource,
    strict_default,
)


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

    What the backend runs on, for the trainer to pick a training route
    (``anekit.engine.training_routes.training_route(backend.chip, backend.macos)``): ``chip`` is the rule
    book's name of the chip ("m1".."m5", "any" when the brand string names none: what
    ``anekit.runtime.ane.availability.chip_name`` detects), ``macos`` the macOS release the runtime
    reports ("26.3"; "" off macOS).

    Compiles count against ``compile_budget`` on the process's one counter (``PROCESS_COMPILES``): every
    backend object of a process shares it, as the engine's limit of about 119 compiles does. Also per
    process: a compile after one the engine refused waits about 15 s (``anekit.runtime.ane.pacing``; the
    dialect trial's fallback pays it once per chip and macOS), at most 120 programs stay loaded (the least
    recently used is unloaded to load another, ``anekit.runtime.ane.residency``), and every loaded kernel
    is reloaded after each 100K evaluations. Weight files reach the engine named by their bytes
    (``anekit.runtime.ane.weights``), so kernels that differ only in weights never share a directory.
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
        # One budget per process (rule process.compile-budget).
        super().__init__(compile_budget, PROCESS_COMPILES)
        self.fixed_dialect = mil_dialect(dialect).name if dialect is not None else None
        self.memory = memory if memory is not None else Memory()
        self.strict = strict_default() if strict is None else bool(strict)
        self.runtime = runtime if runtime is not None else native_runtime()
        self.chip = check_chip(chip) if chip is not None else chip_name(self.runtime.chip_brand)
        self.macos = macos_release(self.runtime.os_version)
        self.runtime.load_framework(ANE_FRAMEWORK)
        for message in REQUIRED:
            self.runtime.bind(message)
        self.dialect: str | None = self.fixed_dialect  # the dialect of the last compile that succeeded
        self.qos = qos
        self.chaining = chaining
        self.realtime = False
        self.realtime_unavailable: str | None = None
        self.realtime_paths: RealtimePaths | None = None
        self._client: Id | None = None
        if realtime:
            self._open_realtime()

    def _open_realtime(self) -> None:
        """The real-time variants this framework implements, in the evidence's order, what worked last
        time on this chip and macOS first (``anekit.runtime.ane.realtime``)."""
        rt = self.runtime
        missing = {v: first_missing(rt, NEEDS[v]) for v in VARIANTS}
        usable = [v for v in VARIANTS if missing[v] is None]
        if not usable:
            self.realtime_unavailable = f"{missing[VARIANTS[0]]} is not available ({rt.os_version})"
            return
        recalled = self.memory.recall(REALTIME_TRIAL, self.chip, rt.os_version)
        if recalled is not None and recalled.value in (*usable, STANDARD):
            kept = [v for v in usable if v != recalled.value]
            usable = [] if recalled.value == STANDARD else [recalled.value, *kept]
        if not usable:
            self.realtime_unavailable = "no real-time variant worked here last time (remembered)"
            return
        with rt.autorelease_pool():
            self._client = rt.send(CLIENT_SHARED)  # a process-wide singleton
        if self._client is None:
            self.realtime_unavailable = f"{CLIENT_SHARED} returned nil"
            return

        def settle(value: str, attempts: tuple[Attempt, ...]) -> None:
            if recalled is None or recalled.value != value:
                self.memory.remember(
                    Outcome(REALTIME_TRIAL, self.chip, rt.os_version, value, attempts, now())
                )

        self.realtime = True
        self.realtime_paths = RealtimePaths(usable, settle)

    def _compile(self, prog: Program, fn: Function, weights: dict[str, WeightSource]) -> Kernel:
        if self.strict:
            enforce(prog, fn, self.chip, weights, "ane backend")
        layout = Layout.of(fn)
        broken = check_surface_plan(*layout.plan(), chip=self.chip) if self.strict else []
        if broken:  # Layout sizes and orders surfaces by the rules: this would be a bug in Layout
            raise CompilationFailed(f"[compile] surface plan of '{fn.name}': {'; '.join(map(str, broken))}")
        files = weight_files(weights)
        check_weights(fn, files)
        # Weight files named by their bytes, so a model's directory follows its weights (rule
        # descriptor.hex-id-weights, anekit.runtime.ane.weights).
        names = content_names(files)
        layout = replace(layout, fn=with_blob_paths(layout.fn, names))
        files = {names[rel]: blob for rel, blob in files.items()}
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
            if n:
                self.count_compile()
            engine = EngineModel(self.runtime, fn.name, self.qos, self._client, self.realtime_paths)
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
        return Chain(self, kernels, links)

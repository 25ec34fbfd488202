"""The simulator backend: its options (precision, numerics, chip, sanitizer, strictness); compile a plan."""

from __future__ import annotations

from anekit.engine.evidence import check_route
from anekit.errors import CompilationFailed, EvalFailed, OptionError
from anekit.mil.ir import Function, Program
from anekit.rules.checks import enforce
from anekit.runtime.base import Backend, Kernel, WeightSource, strict_default
from anekit.runtime.sim.chip import ChipNumerics, bind, check_chip
from anekit.runtime.sim.heap import keep_freed_memory
from anekit.runtime.sim.kernel import SimKernel
from anekit.runtime.sim.mac import ENGINE_MAC_PRODUCTS, EXACT_MAC_PRODUCTS
from anekit.runtime.sim.numerics import EngineNumerics
from anekit.runtime.sim.plan import Plan
from anekit.runtime.sim.sanitizer import Sanitizer

PRECISIONS = ("ane", "fp32")
NUMERICS = ("engine", "exact", "ieee")


class SimBackend(Backend):
    """Runs programs in the numerical simulator (``precision``: "ane" or "fp32").

    ``numerics`` "engine" (the default) computes with the numeric profile of ``chip``
    (``anekit.engine.numerics``: "any" is the conservative union of every chip), the MAC's 4-lane first
    stage modelled exactly for ops of up to 2^14 products (every published probe); "exact" models it up
    to 2^26 (every stories15M training kernel; 4-6x slower, ``runtime.sim.mac``); "ieee" is the ideal
    machine (fp16 storage, fp32 accumulation, exact functions). ``sanitize`` keeps a ``Sanitizer``
    (``self.sanitizer``, shared by every kernel this backend compiles) counting, per op, where the
    profile departs from the ideal machine. ``precision="fp32"`` has no profile: it is the float32
    comparison path.

    ``strict`` (default: on, unless ``ANEKIT_STRICT=0``) refuses programs that break an error rule of
    the rule book for ``chip`` and ``route`` ("direct": kernels for the in-memory framework; "e5rt": a
    program for the Espresso / e5rt runtime; "coreml": the program of a CoreML package, whose buffers
    CoreML allocates). ``route=None`` (the default) takes each program's own: a program that carries a
    ``route`` attribute (the one ``anekit.coreml.load_mlpackage`` returns says "coreml") is judged for
    it, any other for "direct".

    ``lazy_columns`` (default on; off under ``sanitize``, whose counts are of every column): a kernel told
    that its caller reads only its first output columns (``SimKernel.compute_columns``) runs narrowed to
    them when its program is column-separable and the narrowed run gives those columns' bits
    (``runtime.sim.columns``); off, every run computes every column.
    """

    name = "sim"

    def __init__(
        self,
        compile_budget: int = 100,
        precision: str = "ane",
        strict: bool | None = None,
        chip: str = "any",
        route: str | None = None,
        numerics: str = "engine",
        sanitize: bool = False,
        lazy_columns: bool = True,
    ) -> None:
        if precision not in PRECISIONS:
            raise OptionError(f"[sim] precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
        if numerics not in NUMERICS:
            raise OptionError(f"[sim] numerics must be one of {', '.join(NUMERICS)}, not {numerics!r}")
        if sanitize and (numerics not in ("engine", "exact") or precision != "ane"):
            raise OptionError(
                "[sim] sanitize compares a chip's numerics with the ideal machine: it needs numerics "
                f"'engine' and precision 'ane' (got numerics {numerics!r}, precision {precision!r})"
            )
        super().__init__(compile_budget)
        self.precision = precision
        self.strict = strict_default() if strict is None else bool(strict)
        self.chip = check_chip(chip)
        # whose rules strictness applies (direct, e5rt, coreml); None: the program's own
        self.route = None if route is None else check_route(route, "sim")
        self.numerics = numerics
        # what the chip computes (``runtime.sim.chip``); None: the ideal machine
        self.chip_numerics: ChipNumerics | None = bind(self.chip) if numerics != "ieee" else None
        self.profile = None if self.chip_numerics is None else self.chip_numerics.profile
        self.sanitizer = Sanitizer() if sanitize else None
        self.lazy_columns = bool(lazy_columns) and self.sanitizer is None
        keep_freed_memory()  # plans allocate all their values anew on each run (runtime.sim.heap)

    def _engine(self) -> EngineNumerics | None:
        if self.chip_numerics is None or self.precision != "ane":
            return None
        exact = EXACT_MAC_PRODUCTS if self.numerics == "exact" else ENGINE_MAC_PRODUCTS
        return EngineNumerics(self.chip_numerics, self.sanitizer, exact)

    def _compile(self, prog: Program, fn: Function, weights: dict[str, WeightSource]) -> Kernel:
        if self.strict:
            route = self.route or check_route(getattr(prog, "route", "direct"), "sim")  # a package's: coreml
            enforce(prog, fn, self.chip, weights, "strict simulator", route)
        # A decode-shaped program's sums are taken in order (``runtime.sim.ordered``) on every chip, whether
        # or not this backend narrows: the bits are the same (a ties-away chip rounds each ordered sum away).
        try:
            plan = Plan(fn, weights, self.precision, self._engine())
        except EvalFailed as e:
            raise CompilationFailed(f"[compile] folding constants failed: {e}") from e

        def rebuild(
            copy: Function,
            precision: str | None,
            files: dict[str, WeightSource] | None,
            like: Plan,
        ) -> Plan:
            """A plan of ``copy`` (this program, or a narrowed copy with its weight ``files``; None: this
            program's) compiled as this one was (``precision`` None) or in another precision, sharing the
            constants of ``like`` (the kernel's plan) and its ordering."""
            order = like.ordered
            source = weights if files is None else files
            if precision is None:
                return Plan(copy, source, self.precision, self._engine(), constants_of=like, ordered=order)
            return Plan(copy, source, precision, None, constants_of=like, ordered=order)

        return SimKernel(self, fn, plan, rebuild, self._wide_from(), lazy=self.lazy_columns, weights=weights)

    def _wide_from(self) -> int | None:
        """The fewest products from which this backend's numerics compute a MAC op as the BLAS product
        (``runtime.sim.columns``), then rounded as the chip rounds (ties even or away from zero)."""
        engine = self._engine()
        if engine is None:
            return 0
        return engine.exact_products + 1

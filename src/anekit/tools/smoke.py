"""The smoke ladder (``anekit doctor --smoke``, ``anekit.tools.doctor.smoke``): programs from the smallest
proven shape upward, each run on a backend and compared with the simulator.

Rungs, in order (each one adds one thing the engine must get right):

1. ``elementwise``: one input, one output, [1, 64, 1, 32] fp16, ``mul`` by a constant. 64 channels x
   32 spatial is the smallest shape with hardware precedent: maderix/ANE ``training/test_weight_reload.m``
   and ``training/test_ane_advanced.m`` run CH = 64, SP = 32 ("known to work on ANE").
2. ``conv1x1``: a 1x1 conv with baked fp16 BLOBFILE weights (offset 64, the metadata record), as
   maderix/ANE ``inmem_bench.m`` / ``test_weight_reload.m`` do.
3. ``multi_io``: three inputs and two outputs of one shape (surfaces of one direction must have equal
   allocation sizes: mechramc/Orion ``docs/ane_constraints.md``), with names declared out of
   alphabetical order and every output depending on its inputs asymmetrically, so a backend that binds
   surfaces in the wrong order (the engine binds by MIL name, alphabetically: Orion, same file) gives
   wrong numbers instead of passing by luck.
4. one small program per construct of the engine layer's vocabulary (``anekit.tools.smoke_constructs``:
   matmul of two activations, matmul by weights from the input, softmax over the keys, the RMSNorms,
   the two RoPE forms, the gates), each tagged with the construct ids it exercises;
5. the prefill and the decode kernel of generation (``smoke_constructs.GENERATION_RUNGS``: two fused
   layers over a cache input, with the inputs the host writes for a chunk past position 0);
6. every kernel of a preset (``anekit.kernels.catalog``: layer, head and dynamic-weight kernels), one
   at a time, with random llama2.c-style weights, tagged with the constructs found in it
   (``smoke_constructs.constructs_in``).

Every rung names the constructs it exercises (none for the first and third), so that a report of the
ladder on a Mac (``anekit doctor --smoke --report FILE``, ``anekit.engine.report``) is measured evidence
per construct.

Each rung is compiled, loaded and run on the backend under test and on the simulator ("ane"
precision, the executable spec); it passes when every output's largest absolute difference is within
``atol + rtol * max|reference|`` (TOLERANCE below). A compile / load / run failure is recorded with the
stage and the exception (type and message) and the ladder goes on: the report is what a user attaches
to a bug.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import numpy as np

from anekit.blob import fp16_blob
from anekit.kernels import catalog
from anekit.kernels.config import ModelConfig
from anekit.mil import Builder, Program, tensor
from anekit.mil.printer import print_program
from anekit.runtime.base import Backend
from anekit.runtime.sim import SimBackend
from anekit.tools import smoke_constructs

CHANNELS, SPATIAL = 64, 32  # the smallest shape with hardware precedent (maderix/ANE, see above)
WEIGHT_FILE = "@model_path/weights/weight.bin"
# Pass threshold: max |backend - simulator| <= ATOL + RTOL * max |simulator|. The simulator is not
# bit-exact with the silicon (DESIGN.md "Numerics"): fp16 storage (unit roundoff 2**-11 ~ 4.9e-4)
# with a different accumulation order leaves a few ulps per op; 1e-2 relative allows tens of ulps
# through a fused kernel while any binding, layout or weight mistake is off by O(1).
ATOL = 1e-2
RTOL = 1e-2
INPUT_SCALE = 0.5  # random inputs are N(0, 0.5^2): well inside fp16 through exp / softmax kernels


@dataclass(frozen=True)
class Rung:
    """One program of the ladder: its text (in the dialect the backend gets), weights and inputs."""

    name: str
    text: str
    weights: dict[str, bytes]
    inputs: dict[str, np.ndarray]  # by MIL input name, full shape, float32
    what: str  # what this rung exercises, for the report
    constructs: tuple[str, ...] = ()  # the construct ids of anekit.engine it exercises


@dataclass
class RungResult:
    """What happened on one rung: status "pass" / "fail", the failing stage and error, numbers."""

    name: str
    what: str
    sha256: str  # of the program text compiled
    inputs: dict[str, list[int]]
    constructs: list[str] = field(default_factory=list)  # the construct ids it exercises
    outputs: dict[str, list[int]] = field(default_factory=dict)
    status: str = "fail"
    stage: str | None = None  # "reference", "compile", "load", "run" or "compare" when failed
    error: str | None = None  # "ExceptionType: message"
    max_err: float | None = None
    tolerance: float | None = None
    ms: float = 0.0  # compile + load + run on the backend
    stage_ms: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        if self.max_err is not None and not np.isfinite(self.max_err):
            out["max_err"] = str(self.max_err)  # JSON has no inf / nan
        return out


def _shape(v: Any) -> list[int]:
    return [int(d) for d in v.type.shape]


def _random(shape: Iterable[int], rng: np.random.Generator) -> np.ndarray:
    return (rng.standard_normal(list(shape)) * INPUT_SCALE).astype(np.float32)


def _inputs_of(prog: Program, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {v.name: _random(_shape(v), rng) for v in prog.main.inputs}


# -- the rungs ------------------------------------------------------------------------------------


def elementwise_rung(dialect: str | None, rng: np.random.Generator) -> Rung:
    b = Builder()
    f = b.function("main")
    x = f.input("x", tensor("fp16", [1, CHANNELS, 1, SPATIAL]))  # (C, S)
    f.output(f.mul(x=x, y=1.5, name="y"))  # (C, S)
    prog = b.build()
    return Rung(
        "elementwise", print_program(prog, dialect), {}, _inputs_of(prog, rng), "1 in / 1 out, mul by a const"
    )


def conv_rung(dialect: str | None, rng: np.random.Generator) -> Rung:
    b = Builder()
    f = b.function("main")
    x = f.input("x", tensor("fp16", [1, CHANNELS, 1, SPATIAL]))  # (C, S)
    w = f.weight(tensor("fp16", [CHANNELS, CHANNELS, 1, 1]), WEIGHT_FILE, 64, name="W")  # (C_out, C_in)
    y = f.conv1x1(x, w, "y")  # (C, S)
    f.output(y)
    prog = b.build()
    weights = (rng.standard_normal((CHANNELS, CHANNELS, 1, 1)) / np.sqrt(CHANNELS)).astype(np.float32)
    return Rung(
        "conv1x1",
        print_program(prog, dialect),
        {WEIGHT_FILE: fp16_blob(weights)},
        _inputs_of(prog, rng),
        "1x1 conv, baked BLOBFILE weights",
        ("conv.baked",),
    )


def multi_io_rung(dialect: str | None, rng: np.random.Generator) -> Rung:
    shape: list[int | str] = [1, CHANNELS, 1, SPATIAL]
    b = Builder()
    f = b.function("main")
    # Declared z, a, m: alphabetical binding order (a, m, z) differs from declaration order.
    z = f.input("zeta", tensor("fp16", shape))
    a = f.input("alpha", tensor("fp16", shape))
    m = f.input("mid", tensor("fp16", shape))
    # Outputs declared y_sum, b_prod: again not alphabetical. Each weighs its inputs differently.
    y_sum = f.add(x=f.mul(x=z, y=2.0), y=f.mul(x=a, y=-0.5), name="y_sum")  # 2 zeta - alpha / 2
    b_prod = f.sub(x=f.mul(x=a, y=m), y=z, name="b_prod")  # alpha * mid - zeta
    f.output(y_sum, b_prod)
    prog = b.build()
    return Rung(
        "multi_io",
        print_program(prog, dialect),
        {},
        _inputs_of(prog, rng),
        "3 in / 2 out, names out of alphabetical order",
    )


def construct_rung(
    build: Callable[[np.random.Generator], smoke_constructs.ConstructProgram],
    dialect: str | None,
    rng: np.random.Generator,
) -> Rung:
    c = build(rng)
    text = print_program(c.program, dialect)
    inputs = _inputs_of(c.program, rng) if c.inputs is None else c.inputs
    return Rung(c.name, text, c.weights, inputs, c.what, c.constructs)


def kernel_rung(name: str, cfg: ModelConfig, weights: dict[str, Any], dialect: str | None, seed: int) -> Rung:
    spec = catalog.build(name, cfg, weights)
    rng = np.random.default_rng(seed)
    x = _random((1, spec.inputs.channels, 1, spec.inputs.spatial), rng)  # (1, C_in, 1, S)
    kind = "dynamic-weight kernel" if name in catalog.DYNAMIC_KERNELS else "kernel"
    text = print_program(spec.program, dialect)
    found = smoke_constructs.constructs_in(spec.program)
    return Rung(name, text, spec.weight_files(), {"x": x}, f"{cfg.name} {kind}", found)


FIRST_RUNGS = ("elementwise", "conv1x1", "multi_io")


def construct_names() -> list[str]:
    """The construct rungs, in ladder order (after the first three)."""
    return smoke_constructs.names()


def generation_names() -> list[str]:
    """The generation rungs, in ladder order (after the construct rungs)."""
    return smoke_constructs.generation_names()


def kernel_names() -> list[str]:
    return [*catalog.LAYER_KERNELS, *catalog.HEAD_KERNELS, *catalog.DYNAMIC_KERNELS]


def rung_names() -> list[str]:
    """Every rung of the ladder, in order."""
    return [*FIRST_RUNGS, *construct_names(), *generation_names(), *kernel_names()]


def ladder(cfg: ModelConfig, dialect: str | None = None, seed: int = 0) -> Iterable[Rung | tuple[str, str]]:
    """The rungs in order, built lazily; a rung that cannot even be generated yields (name, error)."""
    rng = np.random.default_rng(seed)
    builders: list[tuple[str, Callable[[], Rung]]] = [
        ("elementwise", lambda: elementwise_rung(dialect, rng)),
        ("conv1x1", lambda: conv_rung(dialect, rng)),
        ("multi_io", lambda: multi_io_rung(dialect, rng)),
    ]
    for program in (*smoke_constructs.RUNGS, *smoke_constructs.GENERATION_RUNGS):
        builders.append((program.__name__, partial(construct_rung, program, dialect, rng)))
    weights = catalog.random_weights(cfg, seed)
    for i, name in enumerate(kernel_names()):
        builders.append((name, partial(kernel_rung, name, cfg, weights, dialect, seed + 1 + i)))
    for name, build in builders:
        try:
            yield build()
        except Exception as e:  # a generator or dialect refusal is a finding on that rung, not a crash
            yield name, _error(e)


# -- running ----------------------------------------------------------------------------------------


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _execute(
    backend: Backend, rung: Rung, timings: dict[str, float] | None = None
) -> tuple[dict[str, np.ndarray] | None, str | None, str | None]:
    """Compile, load and run one rung: (outputs, None, None) or (None, failing stage, error)."""
    stage = "compile"
    kernel = None
    timings = {} if timings is None else timings
    t0 = time.perf_counter()
    try:
        kernel = backend.compile(rung.text, rung.weights)
        t1 = time.perf_counter()
        timings["compile"] = 1e3 * (t1 - t0)
        stage = "load"
        kernel.load()
        t2 = time.perf_counter()
        timings["load"] = 1e3 * (t2 - t1)
        stage = "run"
        outputs = kernel(**rung.inputs)
        timings["run"] = 1e3 * (time.perf_counter() - t2)
        return outputs, None, None
    except Exception as e:  # every failure of the backend is what the ladder reports; its stage is timed
        timings[stage] = 1e3 * (time.perf_counter() - t0) - sum(timings.values())
        return None, stage, _error(e)
    finally:
        if kernel is not None:
            with contextlib.suppress(Exception):  # an unload failure must not hide the recorded result
                kernel.close()


def max_error(got: np.ndarray, want: np.ndarray) -> float:
    """Largest |got - want|; equal infinities count 0, a non-finite value against another counts inf."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return float("inf")
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    with np.errstate(invalid="ignore"):  # inf - inf: decided by ``same`` above
        diff = np.where(same, 0.0, np.abs(got - want))
    diff = np.where(np.isnan(diff), np.inf, diff)
    return float(diff.max()) if diff.size else 0.0


def tolerance(reference: dict[str, np.ndarray]) -> float:
    """ATOL + RTOL * the largest finite |value| of the reference outputs."""
    peak = 0.0
    for v in reference.values():
        finite = np.abs(v[np.isfinite(v)])
        if finite.size:
            peak = max(peak, float(finite.max()))
    return ATOL + RTOL * peak


def run_rung(rung: Rung, backend: Backend, reference: Backend) -> RungResult:
    """One rung on the backend and on the reference simulator, compared."""
    result = RungResult(
        rung.name,
        rung.what,
        hashlib.sha256(rung.text.encode("utf-8")).hexdigest(),
        {k: list(v.shape) for k, v in rung.inputs.items()},
        list(rung.constructs),
    )
    want, stage, error = _execute(reference, rung)
    if want is None:
        result.stage, result.error = "reference", f"the simulator refused it at {stage}: {error}"
        return result
    result.outputs = {k: list(v.shape) for k, v in want.items()}
    result.tolerance = tolerance(want)
    got, stage, error = _execute(backend, rung, result.stage_ms)
    result.ms = sum(result.stage_ms.values())
    if got is None:
        result.stage, result.error = stage, error
        return result
    if got.keys() != want.keys():
        result.stage = "compare"
        result.error = f"outputs are {sorted(got)}, the simulator's are {sorted(want)}"
        return result
    result.max_err = max(max_error(got[k], want[k]) for k in want)
    if result.max_err <= result.tolerance:
        result.status = "pass"
    else:
        worst = max(want, key=lambda k: max_error(got[k], want[k]))
        result.stage = "compare"
        result.error = (
            f"output '{worst}' differs from the simulator by {result.max_err:.4g} > {result.tolerance:.4g}"
        )
    return result


def run_ladder(
    backend: Backend,
    rungs: Iterable[Rung | tuple[str, str]],
    reference: Backend | None = None,
    on_result: Callable[[int, RungResult], None] | None = None,
) -> list[RungResult]:
    """Every rung, in order, whatever fails; ``on_result(index, result)`` is called as each finishes."""
    reference = reference or SimBackend(compile_budget=10**6, precision="ane")
    results = []
    for i, rung in enumerate(rungs, 1):
        if isinstance(rung, tuple):
            name, error = rung
            result = RungResult(name, "could not be generated", "", {}, stage="generate", error=error)
        else:
            result = run_rung(rung, backend, reference)
        results.append(result)
        if on_result is not None:
            on_result(i, result)
    return results


def format_result(index: int, r: RungResult) -> str:
    """One line: index, name, shapes, status, max error against tolerance, time; then the error."""
    ins, outs = _fmt_shapes(list(r.inputs.values())), _fmt_shapes(list(r.outputs.values()))
    err = "-" if r.max_err is None else f"{r.max_err:.3g}"
    tol = "" if r.tolerance is None else f" (tol {r.tolerance:.3g})"
    line = (
        f"{index:>3} {r.name:<18} {ins} -> {outs}  {r.status.upper():<4}  max_err {err}{tol}  {r.ms:8.2f} ms"
    )
    if r.error:
        line += f"\n      {r.stage}: {r.error.splitlines()[0]}"
    return line


def _fmt_shapes(shapes: list[list[int]]) -> str:
    """``[1,64,1,32]``; ``3x[1,64,1,32]`` for several of one shape; ``-`` for none."""
    text = ["[" + ",".join(str(d) for d in s) + "]" for s in shapes]
    if len(text) > 1 and len(set(text)) == 1:
        return f"{len(text)}x{text[0]}"
    return " ".join(text) or "-"

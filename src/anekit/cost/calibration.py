"""Published engine timings, the least-squares fit of the model's two parameters, and its error table.

Only engine-only figures are compared with the model (the time of the kernel evaluations themselves).
Whole-step figures (ms/step) also hold the CPU's work — classifier, weight gradients, fp16 conversion —
which this model does not time; ``CONTEXT`` lists them next to the predicted engine part, never as an
error.

One published column needs care: the "ANE ms" of maderix/ANE's per-chip table is ``t_ane`` of
``training/train_large.m``, which accumulates around the two FORWARD evaluations of each layer only
(``fwdAttn``, ``fwdFFN``: lines 416-434; the backward evaluations are not timed). It is compared with the
predicted time of the 2 x 12 forward kernels of stories110M, not with a whole step.

Every figure is either fitted (``held_out=False``) or held out: the held-out figure checks the fit on
something it never saw (a dynamic-weight pipeline, forward and backward, on a chip generation whose
only other figure is a forward time).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache

import numpy as np

from anekit.cost.chips import BENCH_RESULTS, INTERNALS, M3_ULTRA, REPORT, Chip, chip
from anekit.cost.model import Params, predict
from anekit.cost.step import step_kernels
from anekit.cost.work import Work, count
from anekit.kernels.config import PRESETS
from anekit.mil import Builder, Program, tensor

ORION_API = (
    "mechramc/Orion docs/ane_api_reference.md: 'hello_mil.m: z = x + y on [1,256,1,64] (eval 0.223ms)'"
)
TRAIN_LARGE = " (t_ane: forward evaluations only, training/train_large.m)"


def conv_program(channels: int, spatial: int, depth: int = 1) -> Program:
    """``depth`` chained 1x1 convs channels -> channels on [1, channels, 1, spatial], weights in BLOBFILEs
    (the benchmark kernel of maderix/ANE training/test_bench_paths.m, gen_bench_conv)."""
    b = Builder()
    f = b.function("main")
    y = f.input("x", tensor("fp16", [1, channels, 1, spatial]))
    for i in range(depth):
        w = f.weight(tensor("fp16", [channels, channels, 1, 1]), f"@model_path/weights/w{i}.bin", 64)
        y = f.conv1x1(y, w)
    f.output(y)
    return b.build()


def add_program(channels: int, spatial: int) -> Program:
    """z = x + y on two [1, channels, 1, spatial] inputs."""
    b = Builder()
    f = b.function("main")
    shape = [1, channels, 1, spatial]
    f.output(f.add(x=f.input("x", tensor("fp16", shape)), y=f.input("y", tensor("fp16", shape))))
    return b.build()


Workload = list[tuple[Work, int]]  # (kernel work, evaluations)


@cache
def _forward_110m() -> tuple[tuple[Work, int], ...]:
    cfg = PRESETS["stories110M"]
    return tuple((k.work, k.calls) for k in step_kernels(cfg, "baked") if k.direction == "forward")


@cache
def _dynamic_step_110m() -> tuple[tuple[Work, int], ...]:
    return tuple((k.work, k.calls) for k in step_kernels(PRESETS["stories110M"], "dynamic"))


@cache
def _one(kind: str, channels: int, spatial: int) -> tuple[tuple[Work, int], ...]:
    prog = conv_program(channels, spatial) if kind == "conv" else add_program(channels, spatial)
    return ((count(prog, f"{kind} {channels}x{spatial}"), 1),)


@dataclass(frozen=True)
class Published:
    """One published engine timing and the workload it measured."""

    id: str
    what: str
    device: str  # a key of anekit.cost.chips.CHIPS
    ms: float
    low: float
    high: float
    source: str
    workload: Callable[[], tuple[tuple[Work, int], ...]] = field(repr=False)
    held_out: bool = False

    @property
    def chip(self) -> Chip:
        return chip(self.device)


def _fwd(device: str, ms: float, low: float, high: float) -> Published:
    label = chip(device).label
    return Published(
        f"fwd110m-{device}",
        f"stories110M static, 24 forward evals/step, {label}",
        device,
        ms,
        low,
        high,
        REPORT + TRAIN_LARGE,
        _forward_110m,
    )


PUBLISHED: tuple[Published, ...] = (
    Published(
        "conv64x32",
        "one 64-ch 1x1 conv, spatial 32, M4 Max",
        "m4-max",
        0.175,
        0.109,
        0.175,
        INTERNALS.replace("'Hardware Architecture'", "'Execution Paths' (standard eval)"),
        lambda: _one("conv", 64, 32),
    ),
    Published(
        "conv768x256",
        "one 768-ch 1x1 conv, spatial 256, M4 Max",
        "m4-max",
        0.205,
        0.177,
        0.226,
        INTERNALS.replace("'Hardware Architecture'", "'Execution Paths' (standard eval)"),
        lambda: _one("conv", 768, 256),
    ),
    Published(
        "add256x64",
        "one add [1,256,1,64], M4 Max",
        "m4-max",
        0.223,
        0.223,
        0.223,
        ORION_API,
        lambda: _one("add", 256, 64),
    ),
    _fwd("m1-pro", 33.5, 32, 35),
    _fwd("m1-max", 40.0, 35, 45),
    _fwd("m3-ultra", 10.0, 10, 10),
    _fwd("m4-pro", 8.9, 8.9, 8.9),
    _fwd("m4-max", 10.2, 10.2, 10.2),
    Published(
        "dyn110m-m3-ultra",
        "stories110M dynamic, whole step fwd+bwd engine time, M3 Ultra",
        "m3-ultra",
        69.7,
        69.3,
        69.7,
        M3_ULTRA.replace("README.md", "raw/train_dynamic.log") + " (ane_fwd 32.7 + ane_bwd 37.0 ms)",
        _dynamic_step_110m,
        held_out=True,
    ),
)

# Whole-step figures (engine + CPU + I/O): context only, never an error of this engine-only model.
CONTEXT: tuple[tuple[str, str, str, float, str], ...] = (
    ("stories110M static (train_large), ms/step", "m4", "baked", 106.7, "maderix/ANE training/README.md"),
    ("stories110M dynamic, ms/step", "m4", "dynamic", 111.0, "maderix/ANE training/README.md"),
    ("stories110M static, ms/step, M4 Pro", "m4-pro", "baked", 71.0, REPORT),
    ("stories110M static, ms/step, M1 Pro", "m1-pro", "baked", 155.5, REPORT),
    ("stories110M dynamic, ms/step, M3 Ultra", "m3-ultra", "dynamic", 115.4, M3_ULTRA),
)
NOT_USED = (
    "M5 rows of " + REPORT + ": no m5 chip in anekit.",
    "mechramc/Orion docs/m2_benchmarks.md: 'M2' is Orion's milestone, measured on an M4 Max; its ANE "
    "figures include 25 compiles per call, not engine time.",
    "Peak-rate kernels (128x conv 512ch sp64, 0.385 ms on M4 Max, "
    + BENCH_RESULTS
    + "): 64 MB of weights run at "
    "166 GB/s, above the engine's measured bandwidth; this model has no term for it.",
)


def predicted(fig: Published, params: Params) -> float:
    return sum(n * predict(w, fig.chip, params).ms for w, n in fig.workload())


def fit(figures: tuple[Published, ...] = PUBLISHED) -> Params:
    """Least squares on log(predicted / published) over the figures not held out, by a grid search over
    (efficiency, overhead) refined around the best point."""
    used = [f for f in figures if not f.held_out]
    zero = Params(1.0, 0.0)
    # Per figure: compute_ms at efficiency 1, memory_ms and evaluations of each kernel.
    parts = []
    for f in used:
        rows = [(predict(w, f.chip, zero), n) for w, n in f.workload()]
        parts.append(
            (
                np.array([r.compute_ms for r, _ in rows]),
                np.array([r.memory_ms for r, _ in rows]),
                np.array([n for _, n in rows], dtype=float),
                math.log(f.ms),
            )
        )
    eff = np.geomspace(0.01, 1.0, 240)
    over = np.linspace(0.0, 0.5, 251)
    for _ in range(3):
        e, o = np.meshgrid(eff, over, indexing="ij")
        loss = np.zeros_like(e)
        for compute, memory, calls, target in parts:
            t = np.zeros_like(e)
            for c, m, n in zip(compute, memory, calls):
                t += n * (o + np.maximum(c / e, m))
            loss += (np.log(t) - target) ** 2
        i, j = np.unravel_index(int(np.argmin(loss)), loss.shape)
        best = Params(float(eff[i]), float(over[j]))
        de, do = eff[min(i + 1, len(eff) - 1)] / eff[max(i - 1, 0)], over[1] - over[0]
        eff = np.geomspace(best.efficiency / de, min(best.efficiency * de, 1.0), 81)
        over = np.linspace(max(best.overhead_ms - do, 0.0), best.overhead_ms + do, 81)
    return best


@cache
def fitted() -> Params:
    return fit()


@dataclass(frozen=True)
class Row:
    figure: Published
    predicted_ms: float

    @property
    def error(self) -> float:
        """(predicted - published) / published."""
        return self.predicted_ms / self.figure.ms - 1.0


def error_table(params: Params | None = None) -> list[Row]:
    params = params or fitted()
    return [Row(f, predicted(f, params)) for f in PUBLISHED]

"""The cost model: predicted engine time of one kernel evaluation on one chip.

    time = overhead + max(compute, memory)
    compute = (FLOPs + element ops) / (efficiency x peak fp16 rate)
    memory  = bytes moved / bandwidth, x SPILL_PENALTY when the weights alone exceed the SRAM

Two free parameters, the same for every chip, fitted to published timings by
``anekit.cost.calibration.fit``: ``efficiency`` (the fraction of the peak rate the training kernels
achieve) and ``overhead_ms`` (the fixed cost of one evaluation: the host -> engine round trip and the
program's setup). Everything else is a sourced per-chip figure (``anekit.cost.chips``).

The bound of a kernel is what its time is mostly made of: ``dispatch`` when the overhead exceeds both
other terms, else ``compute`` or ``memory``, whichever is larger.
"""

from __future__ import annotations

from dataclasses import dataclass

from anekit.cost.chips import BENCH_RESULTS, Chip, Figure
from anekit.cost.work import Work

# How much slower memory traffic gets once the weights no longer fit in SRAM: sram_probe's efficiency
# drops from 162.1 GFLOPS/MB (24.5 MB of weights) to 59.2 (32 MB), a factor 2.74 (M4 Max).
SPILL_PENALTY = Figure(162.1 / 59.2, "x", "derived", BENCH_RESULTS, "GFLOPS/MB at 24.5 MB / at 32 MB")


@dataclass(frozen=True)
class Params:
    """The fitted parameters."""

    efficiency: float  # achieved fraction of the peak fp16 rate
    overhead_ms: float  # fixed cost per kernel evaluation


@dataclass(frozen=True)
class KernelTime:
    """The predicted time of one evaluation and its parts (ms)."""

    name: str
    ms: float
    compute_ms: float
    memory_ms: float
    overhead_ms: float
    spills: bool  # the weights exceed the SRAM

    @property
    def bound(self) -> str:
        if self.overhead_ms >= max(self.compute_ms, self.memory_ms):
            return "dispatch"
        return "compute" if self.compute_ms >= self.memory_ms else "memory"


def predict(work: Work, chip: Chip, params: Params) -> KernelTime:
    """The predicted engine time of one evaluation of ``work`` on ``chip``."""
    sram = chip.sram_mb.value * 1e6
    compute = (work.flops + work.element_ops) / (params.efficiency * chip.peak_tflops.value * 1e12) * 1e3
    memory = work.bytes_moved / (chip.bandwidth_gbs.value * 1e9) * 1e3
    spills = work.weight_bytes > sram
    if spills:
        memory *= SPILL_PENALTY.value
    total = params.overhead_ms + max(compute, memory)
    return KernelTime(work.name, total, compute, memory, params.overhead_ms, spills)

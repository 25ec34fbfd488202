"""The cost model: the predicted engine time of one evaluation of a program on one device and route.

    time = floor + surfaces + max(compute, weights + spills)

* floor: the device's dispatch floor, paid by every evaluation whatever it holds.
* compute: MAC work / (compute efficiency x the device's fp16 peak). The work follows the guide's
  measured structure: a 1x1 conv runs in output-channel-group passes of at most ``GROUP`` channels and
  pays for whole groups (sbryngelson/ane-guide part-6-silicon/20-datapath-mac.md: "a step from 20
  microseconds to 61 microseconds per layer" between 192 and 256 output channels at 32x32 on the M1);
  a dense 3x3 stride-1 conv takes the Winograd F(2x2, 3x3) path and does ``WINOGRAD`` times fewer
  multiplies (part-4-workloads/13-vision-conv-encoders.md: "replaces 36 direct multiplies per 2x2
  output tile with 16"). Element ops count one operation per element at the same rate.
* weights and spills: every BLOBFILE weight byte, streamed from DRAM each evaluation; an intermediate
  tensor stays on chip within the program while it is smaller than the device's working set; one that
  reaches it is written out and read back (the guide measured the M1's 2 MB threshold: a 96-layer chain with
  2 MB activations "moved 426 MB of DRAM per dispatch", part-3-performance/09-roofline.md). Both move
  at the DRAM efficiency x the device's weight-streaming rate (spills capped by the DRAM bandwidth): the
  engine's own traffic reaches a fraction of the streaming rate a benchmark measures, as the guide's
  own fit found (9 GB/s on the M1 against a measured 51 GB/s stream,
  part-5-practice/18-optimization-cost-model.md). They overlap the compute; the slower sets the time.
* surfaces: the program's inputs and outputs, before and after the work, not under it. On the direct
  route (anekit's backend: the engine's DMA reads and writes the IOSurfaces) like any other DRAM
  traffic; on the Espresso / e5rt route the runtime moves them to and from the host, at the surface
  efficiency x the device's measured e5rt stream rate.

Three parameters are fitted to published timings (``anekit.cost.fitting``): the compute, DRAM and
surface efficiencies. Everything else is a sourced per-device figure (``anekit.engine.performance``).

The bound of a kernel is what its time is mostly made of: ``dispatch`` when the floor is larger than the
rest, else ``compute`` or ``memory`` (weights, spills and surfaces), whichever is larger.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from anekit.cost.work import Layer, Work
from anekit.engine.evidence import ROUTES
from anekit.engine.performance import Performance
from anekit.errors import AnekitError

GROUP = 192  # output channels one pass of a 1x1 conv holds (one pass at 192, two at 256: measured, M1)
WINOGRAD = 2.25  # fewer multiplies of a Winograd F(2x2, 3x3) conv: 36 / 16
MODELLED_ROUTES = ("direct", "e5rt")
MB = 2**20  # the guide's megabyte: "A [1, 512, 32, 32] activation is exactly 1 MB" (part-6-silicon/21)


@dataclass(frozen=True)
class Params:
    """The fitted parameters: fractions of the device's rated figures that kernels reach."""

    compute_efficiency: float  # of the fp16 peak
    dram_efficiency: float  # of the weight-streaming rate, for everything the engine moves through DRAM
    surface_efficiency: float  # of the e5rt surface rate


@dataclass(frozen=True)
class Terms:
    """The parts of one evaluation's time in ms, each at efficiency 1 where a parameter scales it."""

    floor: float
    compute: float  # / compute_efficiency
    weights: float  # / dram_efficiency
    spills: float  # / dram_efficiency
    surfaces: float  # / surface_efficiency on the e5rt route, / dram_efficiency on the direct route
    e5rt: bool


@dataclass(frozen=True)
class KernelTime:
    """The predicted time of one evaluation and its parts (ms)."""

    name: str
    ms: float
    compute_ms: float
    memory_ms: float  # weights and spills
    surface_ms: float
    overhead_ms: float
    spills: bool  # an intermediate as large as the working set goes through DRAM

    @property
    def bound(self) -> str:
        memory = self.memory_ms + self.surface_ms
        if self.overhead_ms >= max(self.compute_ms, memory):
            return "dispatch"
        return "compute" if self.compute_ms >= memory else "memory"


def check_route(route: str) -> str:
    if route not in MODELLED_ROUTES:
        known = ", ".join(ROUTES)
        raise AnekitError(
            f"[cost] route '{route}' is not modelled (choose one of: {', '.join(MODELLED_ROUTES)}; "
            f"routes: {known})"
        )
    return route


def layer_macs(layer: Layer) -> float:
    """The FLOPs the engine spends on ``layer``: whole output-channel groups for a 1x1 conv, a Winograd
    conv's fewer multiplies."""
    flops = layer.flops
    if layer.winograd:
        flops /= WINOGRAD
    if layer.out_channels and layer.kernel and math.prod(layer.kernel) == 1:
        passes = math.ceil(layer.out_channels / GROUP)
        flops *= passes * GROUP / layer.out_channels
    return flops


def terms(work: Work, perf: Performance, route: str = "direct") -> Terms:
    """The parts of one evaluation of ``work`` on ``perf``'s device (ms, at efficiency 1)."""
    check_route(route)
    peak = perf.fp16_peak.value * 1e12
    stream = perf.weight_stream.value * 1e9
    dram = min(perf.dram.value, perf.weight_stream.value) * 1e9
    working_set = perf.working_set.value * MB
    compute = sum(layer_macs(layer) + layer.element_ops for layer in work.layers) / peak
    spilled = sum(b for layer in work.layers for b in layer.intermediates if b >= working_set)
    e5rt = route == "e5rt"
    surface_rate = perf.e5rt_surface.value * 1e9 if e5rt else stream
    return Terms(
        floor=perf.dispatch_floor.value,
        compute=compute * 1e3,
        weights=work.weight_bytes / stream * 1e3,
        spills=2 * spilled / dram * 1e3,
        surfaces=work.io_bytes / surface_rate * 1e3,
        e5rt=e5rt,
    )


def combine(t: Terms, params: Params, name: str = "") -> KernelTime:
    """The time of one evaluation from its parts and the fitted parameters."""
    compute = t.compute / params.compute_efficiency
    memory = (t.weights + t.spills) / params.dram_efficiency
    surfaces = t.surfaces / (params.surface_efficiency if t.e5rt else params.dram_efficiency)
    total = t.floor + surfaces + max(compute, memory)
    return KernelTime(name, total, compute, memory, surfaces, t.floor, t.spills > 0)


def predict(work: Work, perf: Performance, params: Params, route: str = "direct") -> KernelTime:
    """The predicted engine time of one evaluation of ``work`` on ``perf``'s device."""
    return combine(terms(work, perf, route), params, work.name)

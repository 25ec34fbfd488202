"""How fast the host CPU is, per device: the fp32 matrix rate (Accelerate's sgemm on the AMX / SME unit)
and the stream rate of its memory, each with its evidence (``anekit.engine.evidence``).

The training step's host work (the classifier, every weight gradient, the RMSNorm backwards, the
optimizer, the fp16 conversions at the surfaces) and generation's host steps are priced with these two
figures (``anekit.cost.host_step``, ``anekit.cost.generation``): one place for them.

What was measured, and where the figures stand in:

* matrix rate: the M1's 1.9 fp32 TFLOP/s (the guide's harness) and the M1 Max's 2.63 (philipturner/
  amx-benchmarks, Accelerate's SGEMM); the M4's 1.76 (Remke and Breuer's LIBXSMM SME kernel on a
  512-cube GEMM: not Accelerate's, which their kernels outperform on almost every small-matrix shape
  they tried). M2 and M3 take the
  M1's, M5 the M4's, as stand-ins (status ``assumed``). A Pro or Max may hold more matrix units than
  its base chip (Catalán et al. 2026 count two on "the M4 Pro, which integrates two matrix
  accelerators"), but only the M1 Max's rate is published: the others take their base chip's, which
  prices their host no faster than it is.
* stream rate: the M4 Max's CPU read its 124M fp32 GPT-2 weights once per token in 3.5 ms (Orion's CPU
  decode): about 142 GB/s; every other device takes it as a stand-in, at most its DRAM bandwidth
  (``anekit.engine.performance``: 68 GB/s on an M1, 100 on an M2 or M3, 120 on an M4, 154 on an M5).
* compile time (``compile_figure``): the time to compile one weight-bearing kernel, what a step with
  baked weights pays for every such kernel after each optimizer update: maderix's static pipeline's
  compile time per restart over the 72 kernels a restart compiles (M1 Pro, M1 Max, M3 Ultra, M4, M4 Pro,
  M4 Max, M5); the compiler runs on the host, so it is a host figure.
"""

from __future__ import annotations

from dataclasses import dataclass

from anekit.engine.evidence import Evidence
from anekit.engine.performance import Figure, Performance

FP32 = 4  # bytes

GUIDE_CPU = "sbryngelson/ane-guide part-3-performance/11-ane-vs-gpu-vs-cpu.md, 'Where the CPU leads'"
AMX_BENCH = "philipturner/amx-benchmarks README.md, 'Linear Algebra Benchmark: GFLOPS/k'"
HELLO_SME = "scalable.uni-jena.de/opt/sme (Remke and Breuer, 'Hello SME!', arXiv:2409.18779), LIBXSMM"
TWO_UNITS = (
    "Catalán et al., 'A comparative performance and efficiency analysis of Apple's M architectures: "
    "A GEMM case study' (Future Generation Computer Systems, 2026), abstract"
)
ORION_CPU = "mechramc/Orion RESULTS.md, 'Inference (GPT-2 124M, M4 Max)'"
GPT2_PARAMS = 124_439_808  # GPT-2 124M's parameters (wte 50257 x 768 tied, wpe 1024 x 768, 12 layers)
ORION_CPU_MS = 3.5  # its CPU decode, ms per token (p50)
HOST_STREAM_M4_MAX = GPT2_PARAMS * FP32 / (ORION_CPU_MS * 1e-3) / 1e9  # GB/s: every fp32 weight once a token


@dataclass(frozen=True)
class HostFigures:
    """The host CPU's rates: fp32 operands streamed from memory, and a saturated fp32 matmul."""

    stream: Figure  # GB/s
    gemm: Figure  # TFLOP/s

    def ms(self, flops: float, nbytes: float) -> float:
        """The time of ``flops`` of matrix arithmetic and ``nbytes`` of memory traffic, one after the
        other (ms): a part that does both does not overlap them in this model."""
        return (flops / (self.gemm.value * 1e12) + nbytes / (self.stream.value * 1e9)) * 1e3


def _ev(source: str, status: str, observed: str, gen: str) -> Evidence:
    return Evidence(source, status, observed, chips=(gen,))


_M1 = (1.9, GUIDE_CPU, "'reaching about 1.9 fp32 TFLOP/s on a saturated matrix multiply' (M1)")
_M1_MAX = (
    2.6256,
    AMX_BENCH,
    "'SGEMM | 2 | | 1312.8 / 896' GFLOPS/k with k = 2 (M1 Max, New Accelerate): 2625.6 GFLOP/s at n = 896",
)
_M4 = (
    1.75519,
    HELLO_SME,
    "'1755.189780 GFLOPS for libxsmm' on a 512 x 512 x 512 fp32 GEMM (M4); the paper's microbenchmarks "
    "'an achievable throughput of over 2.3 FP32 TFLOPS'",
)
CORSIX_PR3 = "corsix/amx pull request #3 (geohot, 2022-10-29)"
_M1_TORCH = "'PyTorch CPU on M1 is so fast at GEMMs (1.7 TFLOPS)' (Accelerate's sgemm under PyTorch)"
# (the figure, the device it was measured on) per generation
_GEMM = {"m1": (_M1, "m1"), "m2": (_M1, "m1"), "m3": (_M1, "m1"), "m4": (_M4, "m4"), "m5": (_M4, "m4")}


def _gemm(perf: Performance) -> Figure:
    d = perf.device
    if d.name in ("m1-max", "m1-pro"):
        value, source, observed = _M1_MAX
        if d.name == "m1-max":
            return Figure(value, "TFLOP/s", _ev(source, "measured", observed, "m1"))
        why = f"{observed}, standing in for the M1 Pro (the M1 Max's CPU: eight performance cores)"
        return Figure(value, "TFLOP/s", _ev(source, "assumed", why, "m1"))
    (value, source, observed), measured_on = _GEMM[d.generation]
    if d.name == measured_on:
        also = (_ev(CORSIX_PR3, "reported", _M1_TORCH, "m1"),) if d.name == "m1" else ()
        return Figure(value, "TFLOP/s", _ev(source, "measured", observed, d.generation), also)
    why = f"{observed}, standing in for the {d.label}"
    if d.variant != "base":
        why += f" (its second matrix unit unmeasured: {TWO_UNITS} counts two on the M4 Pro)"
    return Figure(value, "TFLOP/s", _ev(source, "assumed", why, d.generation))


def _stream(perf: Performance) -> Figure:
    gen = perf.device.generation
    here = perf.name == "m4-max"
    observed = (
        f"'CPU decode latency (p50) | 3.5 ms/token' for GPT-2 124M: {GPT2_PARAMS} fp32 weights read once a "
        f"token, {HOST_STREAM_M4_MAX:.0f} GB/s"
        + ("" if here else f" (M4 Max), standing in for the {perf.label}, at most its DRAM")
    )
    ev = _ev(ORION_CPU, "derived" if here else "assumed", observed, gen)
    return Figure(min(HOST_STREAM_M4_MAX, perf.dram.value), "GB/s", ev)


# -- compiling a kernel: the time a baked step pays after each optimizer update ------------------------------

MADERIX_TRAINING = "maderix/ANE training/README.md, 'Static Baseline (train_large)' (tested on M4)"
MADERIX_REPORT = "maderix/ANE benchmarks/ANE_BENCHMARK_REPORT.md, 'Training Performance (Static Pipeline)'"
BATCH_KERNELS = (
    72  # what one restart of maderix's static pipeline compiles: '60 weight-bearing + 12 weight-free'
)
# device: (seconds a restart compiles, the source, its words)
_COMPILE = {
    "m4": (7.6, MADERIX_TRAINING, "'7.6s compile per restart' of '72 per compile batch'"),
    "m1-pro": (8.2, MADERIX_REPORT, "'M1 Pro ... Compile/10 7.9-8.5s' (the middle), 72 kernels a restart"),
    "m1-max": (7.1, MADERIX_REPORT, "'M1 Max ... Compile/10 ~7.1s', 72 kernels a restart"),
    "m3-ultra": (3.7, MADERIX_REPORT, "'M3 Ultra* ... Compile/10 ~3.7s', 72 kernels a restart"),
    "m4-pro": (3.5, MADERIX_REPORT, "'M4 Pro ... Compile/10 ~3.5s', 72 kernels a restart"),
    "m4-max": (3.5, MADERIX_REPORT, "'M4 Max ... Compile/10 ~3.5s', 72 kernels a restart"),
    "m5": (3.3, MADERIX_REPORT, "'M5 ... Compile/10 3.2-3.4s' (the middle), 72 kernels a restart"),
}
_COMPILE_STAND_IN = {
    "m1": "m1-pro", "m1-ultra": "m1-max", "m2": "m1-pro", "m2-pro": "m1-pro", "m2-max": "m1-max",
    "m2-ultra": "m1-max", "m3": "m3-ultra", "m3-pro": "m3-ultra", "m3-max": "m3-ultra",
    "m5-pro": "m5", "m5-max": "m5",
}  # fmt: skip


def compile_figure(perf: Performance) -> Figure:
    """The time to compile one weight-bearing training kernel on ``perf``'s device (ms): a restart of
    maderix's static pipeline, its compile time over the 72 kernels it compiles. A device with no
    published figure takes the nearest one's (status assumed)."""
    name = perf.name
    seconds, source, observed = _COMPILE[_COMPILE_STAND_IN.get(name, name)]
    ms = seconds * 1e3 / BATCH_KERNELS
    gen = perf.device.generation
    if name in _COMPILE:
        return Figure(ms, "ms", _ev(source, "derived", f"{observed}: {ms:.0f} ms a kernel", gen))
    stand_in = _COMPILE_STAND_IN[name]
    why = f"{observed}: {ms:.0f} ms a kernel on the {stand_in}, standing in for the {perf.label}"
    return Figure(ms, "ms", _ev(source, "assumed", why, gen))


def host_figures(perf: Performance) -> HostFigures:
    """The host's figures on ``perf``'s device (the stream capped at its DRAM bandwidth)."""
    return HostFigures(_stream(perf), _gemm(perf))


__all__ = ["HOST_STREAM_M4_MAX", "HostFigures", "compile_figure", "host_figures"]

"""Published engine timings as data: what ran (as a MIL program anekit counts), on which device and route,
how long it took, where it is published, and whether the cost model is fitted on it.

The split (``role``):

* ``fit``: the M1 generation on the e5rt route: the guide's measured M1 convolutions, its conv ramp and
  its output-channel-group step, and ANEForge's M1 / M1 Max workload map, saturation sweep and surface
  streams. The three efficiencies of ``anekit.cost.model`` are fitted on these alone.
* ``figure``: a timing that sets one of the device figures the model reads (a peak rate, a dispatch
  floor), so it cannot check the model: shown, never counted as an error either way.
* ``held out``: everything else. Other generations on the same route (the M2 Pro and the M5 in the same
  ANEForge harness: other figures, other shapes), the other route (maderix/ANE and Orion: the direct
  in-memory route anekit's backend drives, on M1 Pro to M5) and whole pipelines (stories110M's 24
  forward kernels per step on six devices, its dynamic fwd + bwd step on an M3 Ultra).

Only engine time is compared: a call of the kernel, the dispatch included, averaged by the source. One
published column needs care: the "ANE ms" of maderix/ANE's per-chip table is ``t_ane`` of
``training/train_large.m``, which accumulates around the two FORWARD evaluations of each layer only
(``fwdAttn``, ``fwdFFN``, lines 416-434), so it is compared with stories110M's 2 x 12 forward kernels.
Whole-step figures (engine + CPU) are ``CONTEXT``; figures not used, and why, are ``NOT_USED``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from anekit.cost import gen_pipelines as gen
from anekit.cost import workloads as wl
from anekit.cost.model import Params
from anekit.cost.step import step_kernels
from anekit.cost.work import Work, count
from anekit.engine.chips import DEVICES
from anekit.kernels.config import PRESETS
from anekit.mil.ir import Program

FIT, FIGURE, HELD_OUT = "fit", "figure", "held out"
ROLES = (FIT, FIGURE, HELD_OUT)

GUIDE = "sbryngelson/ane-guide "
G10 = GUIDE + "part-3-performance/10-power-efficiency.md"
G11 = GUIDE + "part-3-performance/11-ane-vs-gpu-vs-cpu.md"
G18 = GUIDE + "part-5-practice/18-optimization-cost-model.md"
G20 = GUIDE + "part-6-silicon/20-datapath-mac.md"
FORGE = "sbryngelson/ANEForge bench/results/"
FORGE_MAP = FORGE + "device_compare_wattcomplete_results_{}.json"
FORGE_M1MAX = FORGE + "rooflines/roofline-apple-m1-max-MacBookPro18_2-8dc9588b5db6-85ebfafa.json"
FORGE_M5 = FORGE + "rooflines/roofline-apple-m5-Mac17_3-019d3ac27339-426ca052.json"
MADERIX = "maderix/ANE "
REPORT = MADERIX + "benchmarks/ANE_BENCHMARK_REPORT.md"
COMMUNITY = MADERIX + "benchmarks/community_results.json"
M3_ULTRA = MADERIX + "pull request #28 benchmarks/submissions/m3-ultra-mac-studio-2026-03-03/"
INTERNALS = MADERIX + "pull request #40 docs/ANE_INTERNALS.md, 'Execution Paths'"
ORION = "mechramc/Orion docs/ane_api_reference.md"

Workload = tuple[tuple[Work, int], ...]  # (kernel work, evaluations)


@dataclass(frozen=True)
class Measurement:
    """One published engine timing and the workload it measured."""

    id: str
    what: str
    device: str  # a key of anekit.engine.chips.DEVICES
    route: str  # direct / e5rt
    ms: float
    source: str  # repository, file and section
    quote: str  # the published words the number is read from
    workload: Callable[[], Workload]
    role: str = HELD_OUT
    baseline: Callable[[], Workload] | None = None  # a per-layer figure: the workload minus this one
    explanation: str = ""  # why the model misses it, where it does

    def __post_init__(self) -> None:
        if self.device not in DEVICES or self.role not in ROLES or not self.source or not self.quote:
            raise ValueError(f"[cost] measurement {self.id}: bad device, role, source or quote")


@cache
def _conv(channels: int, spatial: int, depth: int = 1, **kw: Any) -> Work:  # kw: conv_program's
    name = f"conv {channels}x{spatial}" + (f" x{depth}" if depth > 1 else "")
    return count(wl.conv_program(channels, spatial, depth, **kw), name)


@cache
def _named(kind: str, *args: int) -> Work:
    build: dict[str, Callable[..., Program]] = {
        "gemm": wl.gemm_program,
        "add": wl.add_program,
        "relu": wl.relu_program,
    }
    if kind == "attention":
        return count(wl.attention_program(*args), f"attention S={args[0]}")
    return count(build[kind](*args), f"{kind} {'x'.join(map(str, args))}")


def once(work: Callable[[], Work]) -> Callable[[], Workload]:
    return lambda: ((work(), 1),)


def conv(channels: int, spatial: int, depth: int = 1, **kw: Any) -> Callable[[], Workload]:
    return once(lambda: _conv(channels, spatial, depth, **kw))


def named(kind: str, *args: int) -> Callable[[], Workload]:
    return once(lambda: _named(kind, *args))


@cache
def forward_110m() -> Workload:
    cfg = PRESETS["stories110M"]
    return tuple((k.work, k.calls) for k in step_kernels(cfg, "baked") if k.direction == "forward")


@cache
def dynamic_step_110m() -> Workload:
    return tuple((k.work, k.calls) for k in step_kernels(PRESETS["stories110M"], "dynamic"))


def _guide_m1() -> list[Measurement]:
    out = []
    table = "'Coarse roofline, anchored estimate, and measured M1 latency for four convolutions'"
    for label, kw, us in (
        ("3x3 C256 to 256 at 28", dict(channels=256, spatial=28, height=28, kernel=3), 507),
        ("1x1 C512 to 512 at 32", dict(channels=512, spatial=32, height=32), 444),
        ("1x1 C1024 to 1024 at 16", dict(channels=1024, spatial=16, height=16), 686),
        ("1x1 C2048 to 2048 at 8", dict(channels=2048, spatial=8, height=8), 1047),
    ):
        k, c, s = kw.get("kernel", 1), kw["channels"], kw["spatial"]
        out.append(
            Measurement(
                f"guide-{k}x{k}-c{c}-{s}",
                f"one {k}x{k} conv C{c} at {s}x{s}",
                "m1",
                "e5rt",
                us / 1000,
                G18,
                f"{table}: '{label} | ... | {us} microseconds'",
                conv(**kw),
                FIT,
            )
        )
    for s, ms in ((16, 0.231), (32, 0.248), (64, 0.395), (128, 1.062), (256, 3.814)):
        out.append(
            Measurement(
                f"guide-3x3-c64-{s}",
                f"one 3x3 conv C64 at {s}x{s}",
                "m1",
                "e5rt",
                ms,
                G11 + ", 'A 3x3 convolution at 64 channels on the M1'",
                f"'{s}x{s} | {ms:.3f} ms'",
                conv(64, s, height=s, kernel=3),
                FIT,
            )
        )
    for c, us in ((192, 20), (256, 61)):
        out.append(
            Measurement(
                f"guide-1x1-c{c}-layer",
                f"one more 1x1 conv C{c} at 32x32 in a fused chain",
                "m1",
                "e5rt",
                us / 1000,
                G20 + ", 'Output-channel-group tiling'",
                "'the per-layer slope shows ... a step from 20 microseconds to 61 microseconds per layer' "
                "(output channels 192 and 256)",
                conv(c, 32, 2, height=32),
                FIT,
                conv(c, 32, 1, height=32),
            )
        )
    out.append(
        Measurement(
            "guide-matmul-chain8",
            "eight chained 1024x1024 matmuls, one program, 1024 rows",
            "m1",
            "e5rt",
            2.11,
            G10 + ", 'Sustained load holds one clock state'",
            "'a chain of eight 1024-square fp16 matrix multiplies run as one program ... at about 2.11 "
            "milliseconds per call'",
            conv(1024, 1024, 8),
            FIGURE,
            explanation="sets the M1's fp16 peak (8.1 TFLOP/s)",
        )
    )
    return out


_MAP = (  # ANEForge's watt-complete workload map: (name, workload)
    ("GEMM floor (M=64,K=256,N=256)", "gemm-floor", named("gemm", 64, 256, 256)),
    ("GEMM bandwidth (M=128,K=1024,N=1024)", "gemm-bw", named("gemm", 128, 1024, 1024)),
    ("GEMM compute (M=256,K=4096,N=4096)", "gemm-compute", named("gemm", 256, 4096, 4096)),
    ("conv single (C=64,32x32,k=3,depth=1)", "conv-single", conv(64, 32, height=32, kernel=3)),
    (
        "conv resnet-ish (C=256,32x32,k=3,depth=16)",
        "conv-stack16",
        conv(256, 32, 16, height=32, kernel=3, relu=1),
    ),
    ("attention vit (S=197,D=768,H=12)", "attention-197", named("attention", 197, 768, 12)),
    ("attention longseq (S=512,D=768,H=12)", "attention-512", named("attention", 512, 768, 12)),
)
_MAP_MS = {
    "M1": ("m1", (0.1644, 0.4055, 2.3944, 0.1914, 1.9184, 0.6128, 1.8146)),
    "M2": ("m2-pro", (0.1099, 0.1351, 2.0434, 0.1068, 1.2649, 0.5886, 1.2529)),
    "M5": ("m5", (0.0917, 0.0858, 1.2927, 0.1028, 0.7571, 0.2301, 0.8167)),
}
_MAP_WHY = {
    ("m2-pro", "gemm-bw"): "the M2 Pro runs this GEMM (2 MB of weights) in 0.135 ms where the M1 takes "
    "0.41 ms: it keeps the weight on chip, or reads it far faster than the model's M2 rate (its measured "
    "61.9 GB/s stream, about the M1's, at the DRAM efficiency fitted on the M1); no M2 figure for the "
    "weight path is published to tell which",
    ("m5", "attention-512"): "the 512x512 score matrices of 12 heads (6 MB) exceed the M5's 4.72 MB working "
    "set and the model spills them; the M5 appears to keep them on chip or split them per head",
}


def _aneforge() -> list[Measurement]:
    out = []
    for chip, (dev, times) in _MAP_MS.items():
        role = FIT if dev == "m1" else HELD_OUT
        for (label, key, work), ms in zip(_MAP, times):
            r = FIGURE if (dev, key) == ("m2-pro", "gemm-floor") else role
            out.append(
                Measurement(
                    f"forge-{key}-{dev}",
                    label,
                    dev,
                    "e5rt",
                    ms,
                    FORGE_MAP.format(chip),
                    f"'{label}': ANE 'latency_ms': {ms}",
                    work,
                    r,
                    explanation=_MAP_WHY.get(
                        (dev, key), "sets the M2's dispatch floor" if r == FIGURE else ""
                    ),
                )
            )
    sweeps = {
        "m1-max": (
            FORGE_M1MAX,
            (0.4877, 1.3323, 4.3726, 29.9651),
            (1.3563, 3.0480, 4.0695, 5.6446),
            (0.9531, 4.9937, 18.0325),
        ),
        "m5": (
            FORGE_M5,
            (0.1373, 0.4369, 1.9730, 19.1185),
            (0.5063, 1.1120, 1.5357, 2.2991),
            (0.2644, 1.7398, 6.6366),
        ),
    }
    for dev, (src, gemm, convs, relu) in sweeps.items():
        role = FIT if dev == "m1-max" else HELD_OUT
        for n, ms in zip((512, 1024, 2048, 4096), gemm):
            out.append(
                Measurement(
                    f"forge-gemm{n}-{dev}",
                    f"GEMM {n}x{n}x{n}, weights constant",
                    dev,
                    "e5rt",
                    ms,
                    src + ", device_saturation_sweep 'gemm'",
                    f"'N': {n}, ANE 'lat_ms': {ms}",
                    named("gemm", n, n, n),
                    role,
                )
            )
        for (c, batch), ms in zip(((64, 8), (128, 8), (256, 4), (512, 2)), convs):
            out.append(
                Measurement(
                    f"forge-conv{c}x{batch}-{dev}",
                    f"3x3 conv C{c}, batch {batch}, 64x64",
                    dev,
                    "e5rt",
                    ms,
                    src + ", device_saturation_sweep 'conv'",
                    f"'C': {c}, 'B': {batch}, ANE 'lat_ms': {ms}",
                    conv(c, 64, height=64, kernel=3, batch=batch),
                    role,
                )
            )
        for rows, ms in zip((256, 2048, 8192), relu):
            out.append(
                Measurement(
                    f"forge-relu{rows}-{dev}",
                    f"relu on {rows}x4096 (a surface in and out)",
                    dev,
                    "e5rt",
                    ms,
                    src + ", device_bandwidth_roofline 'streaming (relu / x*2)'",
                    f"'shape': [{rows}, 4096], 'ane_lat_ms': {ms}",
                    named("relu", rows, 4096),
                    role,
                )
            )
    return out


_T_ANE = " ('ANE ms': t_ane, the forward evaluations of training/train_large.m)"
_FWD_WHY = {
    "m5": "",
    "m1-max": "the M1 Max's forward time varies 35-45 ms between runs (the report's range); the model's "
    "M1 efficiencies come from the e5rt route, and on the direct route the M1 runs these weight-heavy "
    "kernels slower than that DRAM efficiency gives (no direct-route M1 figure is published)",
}


def _direct() -> list[Measurement]:
    out = []
    fwd = (
        ("m1-pro", 33.5, COMMUNITY, "'chip': 'M1 Pro', 'ane_ms': [32, 35]"),
        ("m1-max", 40.0, COMMUNITY, "'chip': 'M1 Max', 'ane_ms': [35, 45]"),
        ("m3-ultra", 10.0, REPORT, "'M3 Ultra* | 91 | ~10' (ms/step, ANE ms)"),
        ("m4-pro", 8.9, COMMUNITY, "'chip': 'M4 Pro', 'ane_ms': [8.9, 8.9]"),
        ("m4-max", 10.2, COMMUNITY, "'chip': 'M4 Max', 'ane_ms': [10.2, 10.2]"),
        ("m5", 9.45, COMMUNITY, "'chip': 'M5', 'ane_ms': [9.1, 9.8]"),
    )
    for dev, ms, src, quote in fwd:
        out.append(
            Measurement(
                f"maderix-fwd110m-{dev}",
                "stories110M baked, 24 forward kernels per step",
                dev,
                "direct",
                ms,
                src + _T_ANE,
                quote,
                forward_110m,
                explanation=_FWD_WHY.get(dev, ""),
            )
        )
    out += [
        Measurement(
            "maderix-dyn110m-m3-ultra",
            "stories110M dynamic, fwd + bwd kernels per step",
            "m3-ultra",
            "direct",
            69.7,
            M3_ULTRA + "raw/train_dynamic.log",
            "'timing: ane_fwd=32.7 ... ane_bwd=37.0'",
            dynamic_step_110m,
            explanation="maderix's dynamic pipeline splits the step into 9 kernels per layer, anekit's "
            "into 8: the same weights and FLOPs, other surfaces",
        ),
        Measurement(
            "maderix-128x512-sp4096-m4",
            "128 chained 1x1 convs C512 over 4096 columns",
            "m4",
            "direct",
            14.8,
            MADERIX + "README.md, 'ANE peak throughput (M4, H16G)'",
            "'FP16 | 18.6 TOPS, 14.8ms' (128x conv 512ch 64x64)",
            conv(512, 4096, 128),
            FIGURE,
            explanation="sets the M4's fp16 peak",
        ),
        Measurement(
            "maderix-64x512-sp4096-m4",
            "64 chained 1x1 convs C512 over 4096 columns",
            "m4",
            "direct",
            7.5,
            MADERIX + "README.md, 'INT8 W8A8 quantization'",
            "'64x conv 512ch 64x64 | 18.4 TOPS, 7.5ms'",
            conv(512, 4096, 64),
            explanation="a 64-layer fused chain of 1x1 convs over 4096 columns runs at the peak rate "
            "(18.4 TFLOP/s), while the compute efficiency (about 0.58) is fitted on M1 kernels of one to "
            "sixteen layers: the model has no term that lets a long chain reach the peak",
        ),
        Measurement(
            "maderix-128x512-sp2048-m3-pro",
            "128 chained 1x1 convs C512 over 2048 columns",
            "m3-pro",
            "direct",
            8.19,
            COMMUNITY,
            "'chip': 'M3 Pro', 'peak_tflops': 16.77, 'Peak at 128x conv 512ch sp2048' (137.4 GFLOP / "
            "16.77 TFLOP/s)",
            conv(512, 2048, 128),
            FIGURE,
            explanation="sets the M3's fp16 peak; its 2 MB intermediates reach the M3's decompiled 2 MB "
            "working set, so the model spills them, where the chain ran at the peak: the M3 keeps them",
        ),
        Measurement(
            "maderix-conv256-sp64-m5",
            "one 1x1 conv C256 over 64 columns",
            "m5",
            "direct",
            0.07,
            MADERIX + "training/m5result.md, 'test_qos_sweep'",
            "'256x256 conv, spatial=64 (8.4 MFLOPS)' 'eval ~0.07ms avg'",
            conv(256, 64),
            FIGURE,
            explanation="sets the M5's dispatch floor",
        ),
        Measurement(
            "maderix-conv64x32-m4-max",
            "one 1x1 conv C64 over 32 columns",
            "m4-max",
            "direct",
            0.175,
            INTERNALS,
            "'Standard | model.evaluateWithQoS:options:request:error: | 0.175 ms | 0.205 ms' "
            "(64x32, 768x256)",
            conv(64, 32),
            explanation="a kernel this small is the dispatch floor alone: 0.175 ms here against rustane's "
            "0.095 ms on the same chip, two measurements of the floor that disagree",
        ),
        Measurement(
            "maderix-conv768x256-m4-max",
            "one 1x1 conv C768 over 256 columns",
            "m4-max",
            "direct",
            0.205,
            INTERNALS,
            "'Standard | ... | 0.175 ms | 0.205 ms' (64x32, 768x256)",
            conv(768, 256),
        ),
        Measurement(
            "orion-add-m4-max",
            "z = x + y on [1, 256, 1, 64]",
            "m4-max",
            "direct",
            0.223,
            ORION,
            "'hello_mil.m: z = x + y on [1,256,1,64] — PASS (compile 17.1ms, eval 0.223ms)'",
            named("add", 256, 64),
            explanation="a one-op kernel is the dispatch floor alone: Orion's eval call takes 0.223 ms "
            "against rustane's 0.095 ms dispatch overhead on the same chip",
        ),
    ]
    return out


PUBLISHED: tuple[Measurement, ...] = (*_guide_m1(), *_aneforge(), *_direct())

# Whole-step figures (engine + CPU + I/O): context only, never an error of this engine-only model.
CONTEXT: tuple[tuple[str, str, str, float, str], ...] = (
    ("stories110M static (train_large), ms/step", "m4", "baked", 106.7, MADERIX + "training/README.md"),
    ("stories110M dynamic, ms/step", "m4", "dynamic", 111.0, MADERIX + "training/README.md"),
    ("stories110M static, ms/step, M4 Pro", "m4-pro", "baked", 71.0, REPORT),
    ("stories110M static, ms/step, M1 Pro", "m1-pro", "baked", 155.5, REPORT),
    ("stories110M static, ms/step, M5", "m5", "baked", 110.5, REPORT),
    ("stories110M dynamic, ms/step, M3 Ultra", "m3-ultra", "dynamic", 115.4, M3_ULTRA + "README.md"),
)
NOT_USED = (
    "Best-of peak runs (128x conv 512ch sp64: M3 Pro 9.98, M4 Pro 12.57, M4 Max 10.93, M5 12.17-12.44 "
    f"TFLOP/s, {REPORT}; M3 Ultra 0.531 ms, {M3_ULTRA}raw/inmem_peak.log): their sweeps are not monotonic "
    "in work (32 layers 0.497 ms, 64 layers 0.355 ms on the M3 Ultra; 0.408 and 0.244 ms on the M4 Max, "
    "maderix/ANE pull request #25), and on the M5 the 64 MB of weights would move at 184 GB/s, above its "
    "154 GB/s DRAM: not a clean engine time.",
    "Single-conv sweeps on the M4 Max (inmem_bench, sram_probe, maderix/ANE pull request #25 "
    "docs/BENCHMARK_RESULTS.md): 2048 channels in 0.218 ms, 256 channels in 0.378 ms: noise above the work.",
    "Anemll/anemll-bench Results.MD llama_lm_head latencies (M5 Max 7.08 ms): the weight-streaming "
    "figures are computed from them, so they cannot check the model.",
    "mechramc/Orion docs/m2_benchmarks.md: 'M2' is Orion's milestone, measured on an M4 Max; its ANE figures "
    "include 25 compiles per call, not engine time.",
    "The guide's M1 per-class table (part-3-performance/11-ane-vs-gpu-vs-cpu.md, 'M1 per-class "
    "measurement') is ANEForge's workload map: used above from its JSON, latencies rather than GFLOP/s.",
)


# -- text generation: published decode and prefill figures --------------------------------------------------
#
# Every one was measured on a pipeline other than anekit's generation kernels: the guide's hybrid decoder,
# maderix/ANE pull request #26's one-projection-per-kernel Qwen 2.5, Orion's two kernels per GPT-2 layer.
# Each is priced by the same per-kernel model over that pipeline's own kernels and host work
# (``anekit.cost.gen_pipelines``), so the comparison checks the model, not anekit's layout.
# None is fitted: the three efficiencies stay those fitted on the training kernels' M1 timings above.

G14 = GUIDE + "part-4-workloads/14-llm-case-study.md"
PR26 = MADERIX + "pull request #26 inference/README.md"
ORION_RESULTS = "mechramc/Orion RESULTS.md, 'Inference (GPT-2 124M, M4 Max)'"
TOLERANCE = 0.30  # the training calibration's: a held-out figure within 30% counts as met


@dataclass(frozen=True)
class GenMeasurement:
    """One published generation figure: a rate, a time, a count or a ratio (``low``..``high`` when the
    source gives a range), with the pipeline it measured and the model's prediction of it."""

    id: str
    what: str
    device: str  # the device it is priced on (``chip`` says what the source names)
    chip: str  # the chip as the source names it
    unit: str  # "tok/s", "ms", "dispatches", "x"
    low: float
    high: float
    source: str
    quote: str
    predict: Callable[[Params], float]
    role: str = HELD_OUT
    explanation: str = ""

    def __post_init__(self) -> None:
        if self.device not in DEVICES or self.role not in ROLES or not self.source or not self.quote:
            raise ValueError(f"[cost] generation figure {self.id}: bad device, role, source or quote")


@dataclass(frozen=True)
class GenRow:
    measurement: GenMeasurement
    predicted: float

    @property
    def ratio(self) -> float:
        """predicted / measured (the nearer end of a range; 1 inside it)."""
        m = self.measurement
        if m.low <= self.predicted <= m.high:
            return 1.0
        return self.predicted / (m.low if self.predicted < m.low else m.high)

    @property
    def within(self) -> bool:
        return abs(self.ratio - 1.0) <= TOLERANCE

    def doc(self) -> dict[str, Any]:
        m = self.measurement
        return {
            "id": m.id,
            "what": m.what,
            "chip": m.chip,
            "priced_on": m.device,
            "unit": m.unit,
            "measured": m.low if m.low == m.high else [m.low, m.high],
            "predicted": self.predicted,
            "ratio": self.ratio,
            "within_tolerance": self.within,
            "tolerance": TOLERANCE,
            "role": m.role,
            "source": m.source,
            "quote": m.quote,
            "explanation": m.explanation,
        }


def _gen_figures() -> tuple[GenMeasurement, ...]:
    tiny, qwen, gpt2 = gen.TINYLLAMA, gen.QWEN25_05B, gen.GPT2_124M
    return (
        GenMeasurement(
            "guide-tinyllama-hybrid-decode",
            "TinyLlama hybrid decode (q, k and gate, up on the engine per layer; v, o, down, attention "
            "and the residual on the host in fp32)",
            "m1",
            "not named (the chapter's floor is the M1's)",
            "tok/s",
            35.0,
            35.0,
            G14 + ", 'Speculative decoding and batched prefill'",
            "'On a TinyLlama decoder this lifts the rate from 35 tokens per second to as high as 128'",
            lambda p: gen.hybrid_tokens_per_s(tiny, "m1", p, gen.TINYLLAMA_HYBRID),
            explanation="the engine's 1.3 GB of fp16 projections a token stream at the DRAM efficiency "
            "fitted on the M1's e5rt timings (about 18 GB/s): the model is weight-bound at about a quarter "
            "of the measured rate; the chip is not named, and a Max's engine streams no faster",
        ),
        GenMeasurement(
            "guide-dispatch-floor",
            "per-eval dispatch floor",
            "m1",
            "M1",
            "ms",
            0.23,
            0.23,
            G14 + ", 'Why decode is not a compute problem'",
            "'every one paying the per-eval floor of about 0.23 ms measured on the M1'",
            lambda p: gen.floor_ms("m1", p),
            FIGURE,
            "sets the M1's dispatch floor (engine.performance)",
        ),
        GenMeasurement(
            "guide-dispatches-per-stack",
            "dispatches per token through the hybrid TinyLlama's layer stack",
            "m1",
            "not named",
            "dispatches",
            40.0,
            50.0,
            G14 + ", 'Why decode is not a compute problem'",
            "'A token through a transformer layer stack issues on the order of forty to fifty small "
            "dispatches'",
            lambda p: float(gen.hybrid_dispatches(tiny, gen.TINYLLAMA_HYBRID)),
            FIGURE,
            "sets the hybrid's kernel split (two per layer + the head); anekit's own routes run TinyLlama "
            "in 67 dispatches a token on the M1 (conv-host-attention) and 2 on the M4 (baked-fused)",
        ),
        GenMeasurement(
            "guide-batched-prefill",
            "prefill latency, token by token over batched (TinyLlama hybrid, 128 tokens in chunks of 128)",
            "m1",
            "not named",
            "x",
            2.3,
            5.9,
            G14 + ", 'Speculative decoding and batched prefill'",
            "'prefill latency collapses by about 2.3 to 5.9 times, bit-equal to serial prefill'",
            lambda p: gen.hybrid_prefill_speedup(tiny, "m1", p, gen.TINYLLAMA_HYBRID, 128, 128),
            explanation="the model's serial prefill streams every engine weight once a token and the batched "
            "one once a chunk, so its ratio nears the chunk width; the published 2.3-5.9x says the hybrid's "
            "step is set by the host and the dispatches, as the chapter reads its int8 result (0.99x), which "
            "this model's host share (no per-call overhead) does not hold; prompt and chunk not published: "
            "priced at 128 tokens in one chunk of 128",
        ),
        GenMeasurement(
            "maderix-pr26-qwen25-decode-m4-pro",
            "Qwen2.5-0.5B decode, every projection its own baked conv kernel (7 a layer + the LM head), "
            "norms, RoPE, attention and SiLU on the host",
            "m4-pro",
            "M4 Pro",
            "tok/s",
            82.0,
            82.0,
            PR26 + " (first version)",
            "'169 ANE kernels compiled at startup via _ANEInMemoryModel', '82 tokens/sec decode on M4 Pro'",
            lambda p: gen.hybrid_tokens_per_s(qwen, "m4-pro", p, gen.QWEN25_SPLIT),
            explanation="the model streams the 0.99 GB of fp16 weights at the M1-fitted DRAM efficiency "
            "(0.29 of the M4 Pro's 126 GB/s stream); the direct route on the M4 Pro reads them about "
            "twice as fast",
        ),
        GenMeasurement(
            "maderix-pr26-qwen25-decode-m4-max",
            "the same Qwen2.5-0.5B decode, server mode",
            "m4-max",
            "M4 Max",
            "tok/s",
            57.3,
            60.0,
            PR26 + " (server version)",
            "'~60 tokens/sec decode on M4 Max'; a response's '\"decode_tps\": 57.3'",
            lambda p: gen.hybrid_tokens_per_s(qwen, "m4-max", p, gen.QWEN25_SPLIT),
        ),
        GenMeasurement(
            "maderix-pr26-qwen25-prefill-m4-max",
            "the same pipeline's prefill of a 29-token prompt, token by token through the decode kernels",
            "m4-max",
            "M4 Max",
            "tok/s",
            66.2,
            66.2,
            PR26 + " (server version)",
            "'\"prompt_tokens\": 29', '\"prefill_tps\": 66.2'",
            lambda p: gen.hybrid_tokens_per_s(qwen, "m4-max", p, gen.QWEN25_SPLIT, pos=14),
            explanation="priced as 29 decode steps (prefill at about the decode rate says it runs token "
            "by token), at the prompt's middle position",
        ),
        GenMeasurement(
            "orion-gpt2-decode-m4-max",
            "GPT-2 124M decode: per layer a LayerNorm + QKV kernel and a LayerNorm + FFN kernel (24 a "
            "token, width 16); attention, Wo and the logits on the host",
            "m4-max",
            "M4 Max",
            "ms",
            5.78,
            5.78,
            ORION_RESULTS,
            "'ANE decode latency | 5.78 ms/token'",
            lambda p: gen.hybrid_ms(gpt2, "m4-max", p, gen.GPT2_SPLIT, pos=11),
            explanation="the 20-step benchmark (tests/test_bench_decode.m) after a 1-token prompt: priced "
            "at position 11",
        ),
        GenMeasurement(
            "orion-gpt2-cpu-decode-m4-max",
            "GPT-2 124M decode on the CPU",
            "m4-max",
            "M4 Max",
            "ms",
            3.5,
            3.5,
            ORION_RESULTS,
            "'CPU decode latency (p50) | 3.5 ms/token'",
            lambda p: gen.host_weights_ms(gen.GPT2_PARAMS, "m4-max"),
            FIGURE,
            "sets the host's stream rate (fp32 weights read once a token)",
        ),
    )


def time_ratio(row: GenRow) -> float:
    """The prediction over the measurement as a time: the inverse of a rate's ratio (tok/s, x)."""
    return 1.0 / row.ratio if row.measurement.unit in ("tok/s", "x") else row.ratio


def generation_summary(rows: list[GenRow]) -> dict[str, Any]:
    """The held-out figures: how many the model meets within TOLERANCE, and the median of its time ratio
    (above 1: the model predicts generation slower than measured)."""
    held = sorted(time_ratio(r) for r in rows if r.measurement.role == HELD_OUT)
    mid = len(held) // 2
    median = held[mid] if len(held) % 2 else (held[mid - 1] + held[mid]) / 2
    return {
        "held_out": len(held),
        "within_tolerance": sum(r.within for r in rows if r.measurement.role == HELD_OUT),
        "tolerance": TOLERANCE,
        "median_time_ratio": median,
    }


def generation_rows(params: Params) -> list[GenRow]:
    """Every published generation figure with the model's prediction beside it."""
    return [GenRow(m, m.predict(params)) for m in _gen_figures()]


GEN_NOT_USED = (
    "mechramc/Orion RESULTS.md 'Single-token dispatch latency | ~0.03 ms': the scheduling call alone, below "
    "every measured evaluation floor (rustane's 0.095 ms on the same M4 Max): not an evaluation time.",
    "mechramc/Orion RESULTS.md 'ANE prefill (cached) | sub-100 ms': a bound, no prompt length.",
    "Anemll/anemll-bench and ANEMLL chat figures: CoreML packages (LUT-quantized weights), not the direct "
    "route this model prices.",
)

"""How fast the Neural Engine is, per device: the performance figures the cost model reads, each with its
evidence (``anekit.engine.evidence``).

A figure without a source does not go in. Where nothing is published for a device, another device's figure
stands in with status ``assumed`` and the observation names which. What is per generation and what is per
device follows what was measured to differ:

* per generation (the engine): the fp16 peak rate, the on-chip working set, the dispatch floor and the
  rate at which the Espresso / e5rt route moves a surface to and from the host. The Pro / Max / Ultra of
  a generation run one engine as fast as the base chip: sbryngelson/ANEForge measured an fp16 GEMM peak
  of 4.33 TFLOP/s on an M1 and 4.59 on an M1 Max, 8.71 on an M5 and 10.04 on an M5 Pro
  (bench/results/ROOFLINES.md), though the compiler's core field doubles or quadruples;
* per device (the memory system): the rate at which the engine streams weights from DRAM and the
  system's DRAM bandwidth, which differ between a base chip and its Max;
* per device, for the record: the compiler's core count (``num_nes``; Apple's product pages count 16 on
  every chip: another quantity) and the clock where it is published. The cost model does not scale by
  either, for the reason above.

An Ultra is two dies; one program runs on one die, so an Ultra's figures are its Max's unless measured.
"""

from __future__ import annotations

from dataclasses import dataclass

from anekit.engine.chips import DEVICES, Device, UnknownChip, device
from anekit.engine.evidence import COMPILED, DIRECT, E5RT, Evidence

# Sources, by short name (repository and file; the section and the words quoted go in each Evidence).
GUIDE = "sbryngelson/ane-guide "
G09 = GUIDE + "part-3-performance/09-roofline.md"
G10 = GUIDE + "part-3-performance/10-power-efficiency.md"
G12 = GUIDE + "part-3-performance/12-cross-chip.md"
G18 = GUIDE + "part-5-practice/18-optimization-cost-model.md"
G21 = GUIDE + "part-6-silicon/21-memory-hierarchy.md"
G24 = GUIDE + "part-7-toolchain/24-hal-gates.md"
G34 = GUIDE + "part-9-cross-silicon/34-the-28-targets.md"
ANEMLL = "Anemll/anemll-bench Results.MD"
MADERIX_README = "maderix/ANE README.md"
COMMUNITY = "maderix/ANE benchmarks/community_results.json"
M5_PROBES = "maderix/ANE training/m5result.md"
PR25 = "maderix/ANE pull request #25 docs/BENCHMARK_RESULTS.md (M4 Max)"
RUSTANE = "jackzampolin/rustane README.md"
ORION = "mechramc/Orion RESULTS.md, 'Hardware: Apple Neural Engine (M4 Max)'"
ANEFORGE_M2 = "sbryngelson/ANEForge bench/results/device_compare_wattcomplete_results_M2.json"


@dataclass(frozen=True)
class Figure:
    """One number about a device, with the evidence it rests on (``also``: more evidence, for or against)."""

    value: float
    unit: str
    evidence: Evidence
    also: tuple[Evidence, ...] = ()

    def __post_init__(self) -> None:
        if not self.value > 0:
            raise ValueError(f"[engine] a figure must be positive, got {self.value} {self.unit}")

    @property
    def status(self) -> str:
        return self.evidence.status

    @property
    def source(self) -> str:
        return self.evidence.source


@dataclass(frozen=True)
class Performance:
    """The performance figures of one device."""

    device: Device
    fp16_peak: Figure  # TFLOP/s: the rate of a long fused chain of matmuls or 1x1 convs, one program
    working_set: Figure  # MB: the largest tensor that stays on chip
    dispatch_floor: Figure  # ms: the fixed cost of one evaluation
    e5rt_surface: Figure  # GB/s: a surface to or from the host on the Espresso / e5rt route
    weight_stream: Figure  # GB/s: the rate the engine streams weights from DRAM
    dram: Figure  # GB/s: the system's DRAM bandwidth, the ceiling of any engine traffic
    cores: Figure  # the compiler's NE-core count of one die
    clock: Figure | None = None  # GHz, where published

    @property
    def name(self) -> str:
        return self.device.name

    @property
    def label(self) -> str:
        return self.device.label

    def figures(self) -> dict[str, Figure]:
        out = {
            "fp16 peak": self.fp16_peak,
            "working set": self.working_set,
            "dispatch floor": self.dispatch_floor,
            "e5rt surface rate": self.e5rt_surface,
            "weight stream": self.weight_stream,
            "DRAM": self.dram,
            "NE cores": self.cores,
        }
        if self.clock is not None:
            out["clock"] = self.clock
        return out


def _ev(source: str, status: str, observed: str, gen: str, routes: tuple[str, ...] = COMPILED) -> Evidence:
    return Evidence(source, status, observed, chips=(gen,), routes=routes)


def _stand_in(fig: Figure, gen: str, why: str) -> Figure:
    """``fig`` standing in where nothing is published: status assumed, the observation says whose it is."""
    ev = fig.evidence
    return Figure(fig.value, fig.unit, Evidence(ev.source, "assumed", why, chips=(gen,), routes=ev.routes))


# -- per generation: the engine ----------------------------------------------------------------------------

_PEAK = {
    "m1": Figure(
        8.1,
        "TFLOP/s",
        _ev(
            G10,
            "measured",
            "'Sustained load holds one clock state': a chain of eight 1024-square fp16 matmuls run as "
            "one program, 2.11 ms per call; 'Flat at about 8.1 TFLOP/s' (hosts: Apple M1; M1 Max)",
            "m1",
            E5RT,
        ),
        also=(
            _ev(
                G09,
                "measured",
                "'overhead-isolated matmul slope is about 12 fp16 TFLOP/s': a marginal rate "
                "from the hardware counters, not the time of a call",
                "m1",
                E5RT,
            ),
        ),
    ),
    "m3": Figure(
        16.77,
        "TFLOP/s",
        _ev(
            COMMUNITY,
            "measured",
            "M3 Pro: 'peak_tflops': 16.77, 'Peak at 128x conv 512ch sp2048'",
            "m3",
            DIRECT,
        ),
    ),
    "m4": Figure(
        18.6,
        "TFLOP/s",
        _ev(
            MADERIX_README,
            "measured",
            "'ANE peak throughput (M4, H16G)': FP16 18.6 TOPS, '128x conv 512ch 64x64' (14.8 ms)",
            "m4",
            DIRECT,
        ),
        also=(
            _ev(
                COMMUNITY,
                "rated",
                "M4: 'rated_tops': 38, 'INT8/mixed-precision spec': not an fp16 rate",
                "m4",
                DIRECT,
            ),
        ),
    ),
    "m5": Figure(
        19.6,
        "TFLOP/s",
        _ev(
            G12,
            "measured",
            "'about 19.6 fp16 TFLOP/s on the matmul slope ... from the fused-chain probe' (M5)",
            "m5",
            E5RT,
        ),
    ),
}
_PEAK["m2"] = Figure(
    round(8.1 * 15.8 / 11.0, 2),
    "TFLOP/s",
    _ev(
        COMMUNITY,
        "derived",
        "no fp16 rate measured on an M2: the M1's measured 8.1 TFLOP/s scaled by Apple's "
        "rated M2 / M1 ratio ('M2': 15.8, 'M1': 11 rated_tops)",
        "m2",
    ),
)

_WS_HAL = "'max_operand_bytes (0x1b8) | 2 MB | 2 MB | 2 MB | 2 MB | 2 MB' (M1, A14, A15, A16 (M4), A17 (M5))"
_WORKING_SET = {
    "m1": Figure(
        2.0,
        "MB",
        _ev(
            G09,
            "measured",
            "'the on-chip working set, 2 MB on the M1 ... at a batch where "
            "the activation is exactly 2 MB, a 96-layer matmul chain moved 426 MB of DRAM per dispatch'",
            "m1",
            E5RT,
        ),
        also=(
            _ev(
                G21,
                "measured",
                "'The measured throughput threshold is slightly above the table value, near 2.28 to 2.34 MB'",
                "m1",
                E5RT,
            ),
        ),
    ),
    "m2": Figure(2.0, "MB", _ev(G24, "decompile-derived", _WS_HAL, "m2")),
    "m3": Figure(2.0, "MB", _ev(G24, "decompile-derived", _WS_HAL, "m3")),
    "m4": Figure(
        32.0,
        "MB",
        _ev(
            PR25,
            "measured",
            "'SRAM Probe Results': 'First spill at ~32 MB' (M4 Max); "
            "128 chained 1x1 convs with 4 MB intermediates run at the 18.6 TFLOP/s peak "
            "(maderix/ANE README.md)",
            "m4",
            DIRECT,
        ),
        also=(
            _ev(
                ORION,
                "reported",
                "'On-chip SRAM | 32 MB (30% perf drop when exceeded)' (M4 Max)",
                "m4",
                DIRECT,
            ),
            _ev(
                G24,
                "decompile-derived",
                _WS_HAL + ": the matmul operand threshold, below what the M4 was measured to keep on chip",
                "m4",
                COMPILED,
            ),
        ),
    ),
    "m5": Figure(
        4.72,
        "MB",
        _ev(
            G12,
            "measured",
            "'The working-set threshold moves with the silicon, from near "
            "2 MB on the M1 to a measured 4.72 MB on the M5'",
            "m5",
            E5RT,
        ),
    ),
}

_FLOOR = {
    "m1": Figure(
        0.23,
        "ms",
        _ev(
            G09,
            "measured",
            "'On the M1 that floor is about 0.23 ms per evaluation. A relu, "
            "sigmoid, average pool, and small convolution are all at 0.23 to 0.26 ms'",
            "m1",
            E5RT,
        ),
        also=(
            _ev(
                G09,
                "measured",
                "'A live decomposition of a tiny model puts the full-call floor near 0.19 ms'",
                "m1",
                E5RT,
            ),
        ),
    ),
    "m2": Figure(
        0.11,
        "ms",
        _ev(
            ANEFORGE_M2,
            "measured",
            "'GEMM floor (M=64,K=256,N=256)': ANE 'latency_ms': 0.1099 (8.4 MFLOP: the call is the floor)",
            "m2",
            E5RT,
        ),
    ),
    "m4": Figure(
        0.095,
        "ms",
        _ev(
            RUSTANE,
            "measured",
            "'ANE Gotchas': 'Per-ANE-dispatch overhead: ~0.095ms (XPC "
            "+ IOKit round-trip)'; 'All on M4 Max 128GB'",
            "m4",
            DIRECT,
        ),
    ),
    "m5": Figure(
        0.07,
        "ms",
        _ev(
            M5_PROBES,
            "measured",
            "'test_qos_sweep': '256x256 conv, spatial=64 (8.4 MFLOPS)' 'eval ~0.07ms avg' (M5)",
            "m5",
            DIRECT,
        ),
        also=(
            Evidence(
                G18,
                "derived",
                "'Dispatch floor | silicon anchor | 0.23 ms | 0.11 ms': the guide's cost-model "
                "fit on the M5, above the 0.086 ms its own harness measured for a 2 MB GEMM there",
                chips=("m5",),
                routes=E5RT,
                refutes=True,
            ),
        ),
    ),
}
_FLOOR["m3"] = _stand_in(_FLOOR["m4"], "m3", "no dispatch floor published for an M3: the M4 Max's 0.095 ms")

_E5RT = {
    "m1": Figure(
        10.0,
        "GB/s",
        _ev(G09, "measured", "'Single-relu effective stream | | 10 GB/s' (M1 constants)", "m1", E5RT),
    ),
    "m5": Figure(
        24.1,
        "GB/s",
        _ev(
            G09,
            "measured",
            "'Engine | 10191 (matmul) / 18771 (conv) | 24.1 (standalone)': "
            "'the activation path measured on a relu or a reduction in isolation' (M5)",
            "m5",
            E5RT,
        ),
    ),
}
for _gen in ("m2", "m3", "m4"):
    _E5RT[_gen] = _stand_in(
        _E5RT["m1"], _gen, f"no e5rt stream rate published for an {_gen.upper()}: the M1's"
    )

_CLOCK = {
    "m1": Figure(1.14, "GHz", _ev(G12, "measured", "'Operating clock | ~1.14 GHz | M1/H13'", "m1")),
    "m5": Figure(1.89, "GHz", _ev(G12, "measured", "'Operating clock | ~1.89 GHz | M5/H17s'", "m5")),
}


# -- per device: the memory system -------------------------------------------------------------------------

_ANEMLL_STREAM = "'llama_lm_head Model (Standard)': Memory Bandwidth (GB/s) on the {label}"
_ANEMLL_DRAM = "'ANE Bandwidth vs System Memory Bandwidth': System Mem BW of the {label}"
_STREAM = {
    "m1": 60.87,
    "m1-pro": 54.90,
    "m1-max": 54.62,
    "m1-ultra": 54.72,
    "m2": 60.45,
    "m2-pro": 61.93,
    "m2-max": 62.01,
    "m2-ultra": 61.68,
    "m3": 63.10,
    "m3-max": 120.22,
    "m4": 64.18,
    "m4-pro": 126.36,
    "m4-max": 118.88,
    "m5-max": 148.39,
}
_DRAM = {
    "m1": 68,
    "m1-pro": 200,
    "m1-max": 400,
    "m1-ultra": 800,
    "m2": 100,
    "m2-pro": 200,
    "m2-max": 400,
    "m2-ultra": 800,
    "m3": 100,
    "m3-max": 400,
    "m4": 120,
    "m4-pro": 273,
    "m4-max": 546,
    "m5": 154,
    "m5-max": 614,
}


def _stream(name: str) -> Figure:
    d = DEVICES[name]
    if name == "m5":
        return Figure(
            145.0,
            "GB/s",
            _ev(
                G12,
                "measured",
                "'the engine streams weights at about 145 GB/s over two "
                "DRAM read channels, near three times the M1's 51 GB/s' (M5)",
                "m5",
                E5RT,
            ),
            also=(
                Evidence(
                    ANEMLL,
                    "measured",
                    "llama_lm_head on an M5: 70.21 GB/s (a CoreML model)",
                    chips=("m5",),
                    routes=("coreml",),
                    refutes=True,
                ),
            ),
        )
    if name in _STREAM:
        also: tuple[Evidence, ...] = ()
        if d.generation == "m1":
            also = (
                _ev(
                    G09,
                    "measured",
                    "'a large matrix multiply with one output row reads each weight once and "
                    "saturates at about 51 GB/s' (M1)",
                    "m1",
                    E5RT,
                ),
            )
        ev = Evidence(
            ANEMLL,
            "measured",
            _ANEMLL_STREAM.format(label=d.label),
            chips=(d.generation,),
            routes=("coreml",),
        )
        return Figure(_STREAM[name], "GB/s", ev, also)
    stand_in = {"m3-pro": "m3", "m3-ultra": "m3-max", "m5-pro": "m5"}[name]
    fig = _stream(stand_in)
    return _stand_in(
        fig, d.generation, f"no streaming rate published for the {d.label}: the {DEVICES[stand_in].label}'s"
    )


def _dram(name: str) -> Figure:
    d = DEVICES[name]
    if name in _DRAM:
        ev = Evidence(ANEMLL, "reported", _ANEMLL_DRAM.format(label=d.label), chips=(d.generation,))
        return Figure(float(_DRAM[name]), "GB/s", ev)
    stand_in = {"m3-pro": "m3", "m3-ultra": "m3-max", "m5-pro": "m5"}[name]
    return _stand_in(
        _dram(stand_in), d.generation, f"no DRAM figure for the {d.label}: the {DEVICES[stand_in].label}'s"
    )


_H = {  # compiler target, its row in the guide's target table, cores of one die
    "m1": ("H13", "A13, M1 base", 4),
    "m1g": ("H13g", "M1 Pro, Max, Ultra", 8),
    "m2": ("H14", "A14, M2 base", 4),
    "m2g": ("H14g", "M2 Pro, Max", 8),
    "m3": ("H15", "A15, M3 base", 4),
    "m3g": ("H15g", "M3 Pro, Max", 8),
    "m4": ("H16", "A16, M4 base", 4),
    "m4g": ("H16g", "M4 Pro, Max", 8),
    "m5": ("H17", "A17, M5 base", 4),
    "m5g": ("H17s", "A17 Pro-class, the M5", 16),
}
_UNLISTED = {"m2-ultra", "m3-ultra"}  # not in the target table: the generation's Max row stands in


def _cores(name: str) -> Figure:
    d = DEVICES[name]
    target, row, n = _H[d.generation if d.variant == "base" else d.generation + "g"]
    observed = f"'The 28 compiler targets': '{target} | {row} | {n}' (NE cores of one die)"
    if name == "m5-pro" or name == "m5-max":
        observed += "; 'T605x | M5 Pro, Max | h17s | H17s'"
    if name in _UNLISTED:
        ev = Evidence(
            G34,
            "assumed",
            f"the {d.label} is not in the target table: the {row} row ({target}, {n} per die) stands in",
            chips=(d.generation,),
        )
    else:
        ev = Evidence(G34, "decompile-derived", observed, chips=(d.generation,))
    return Figure(float(n), "NE cores", ev)


def _performance(d: Device) -> Performance:
    gen = d.generation
    return Performance(
        device=d,
        fp16_peak=_PEAK[gen],
        working_set=_WORKING_SET[gen],
        dispatch_floor=_FLOOR[gen],
        e5rt_surface=_E5RT[gen],
        weight_stream=_stream(d.name),
        dram=_dram(d.name),
        cores=_cores(d.name),
        clock=_CLOCK.get(gen),
    )


PERFORMANCE: dict[str, Performance] = {name: _performance(d) for name, d in DEVICES.items()}


def performance(name: str) -> Performance:
    """The figures of device ``name`` ("m4", "m4-max", "M4 Max" ...); UnknownChip naming the known ones."""
    return PERFORMANCE[device(name).name]


__all__ = ["PERFORMANCE", "Figure", "Performance", "UnknownChip", "performance"]

"""Per-chip figures of the Neural Engine, as data: each figure with its public source and status.

Like the rule book, a figure without a source does not go in. ``status`` says what kind of number it is:
``measured`` (run on hardware by the source), ``rated`` (Apple's marketing figure as reported by the
source), ``reported`` (stated by a hardware-run project without the measurement behind it), ``derived``
(computed from sourced figures; the note says how) or ``assumed`` (no source for this chip; the note says
which figure stands in).

Devices are named ``m1`` ... ``m4`` (the base chip, what ``anekit cost --chip`` and the rule book's
chips mean) and ``m1-pro``, ``m4-max``, ... for the variants the published timings were measured on.
Every variant of one generation has the same 16-core engine (maderix/ANE
benchmarks/ANE_BENCHMARK_REPORT.md: "Max variants share the same 16-core NE as Pro"; Ultra variants are
two dies); what differs between them, as far as the engine sees, is memory bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass

from anekit.errors import AnekitError

STATUSES = ("measured", "rated", "reported", "derived", "assumed")

# Sources, by short name.
REPORT = "maderix/ANE benchmarks/ANE_BENCHMARK_REPORT.md"
COMMUNITY = "maderix/ANE benchmarks/community_results.json (neural_engine_specs)"
MADERIX_README = "maderix/ANE README.md, 'ANE peak throughput (M4, H16G)' (FP16 128x conv 512ch 64x64)"
INTERNALS = "maderix/ANE docs/ANE_INTERNALS.md (pull request #40), 'Hardware Architecture'"
BENCH_RESULTS = "maderix/ANE docs/BENCHMARK_RESULTS.md (M4 Max), 'SRAM Probe Results'"
ANEMLL = "Anemll/anemll-bench Results.MD, 'ANE Bandwidth vs System Memory Bandwidth' (llama_lm_head)"
RUSTANE = "ncdrone/rustane README.md: 'Per-ANE-dispatch overhead: ~0.095ms (XPC + IOKit round-trip)' (M4 Max)"
M3_ULTRA = "maderix/ANE pull request #28 benchmarks/submissions/m3-ultra-mac-studio-2026-03-03/README.md"


class UnknownChip(AnekitError, KeyError):
    """A chip name anekit has no figures for."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Figure:
    """One number about a chip, with where it comes from."""

    value: float
    unit: str
    status: str
    source: str
    note: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"[cost] figure status {self.status!r} not in {STATUSES}")
        if not self.source.strip():
            raise ValueError("[cost] a figure without a source does not go in")


@dataclass(frozen=True)
class Chip:
    """The engine of one device: peak fp16 rate, memory bandwidth seen by the engine, SRAM size, and the
    published per-dispatch overhead where there is one (the model uses its own fitted overhead)."""

    name: str
    family: str  # m1 .. m4: the chip generation the rule book and the dialects key on
    label: str
    peak_tflops: Figure
    bandwidth_gbs: Figure
    sram_mb: Figure
    dispatch_ms: Figure | None = None

    def figures(self) -> dict[str, Figure]:
        out = {"peak fp16": self.peak_tflops, "bandwidth": self.bandwidth_gbs, "SRAM": self.sram_mb}
        if self.dispatch_ms is not None:
            out["dispatch"] = self.dispatch_ms
        return out


def _tf(value: float, status: str, source: str, note: str = "") -> Figure:
    return Figure(value, "TFLOPS", status, source, note)


def _bw(value: float) -> Figure:
    return Figure(value, "GB/s", "measured", ANEMLL)


# Peak fp16: the best published rate of the engine (one die). Measured where a hardware run exists.
_M1_PEAK = _tf(
    11.0, "rated", COMMUNITY, "M1 11 TOPS, fp16 per the report; inmem_peak FAILs on M1 (MIL compat)"
)
_M2_PEAK = _tf(15.8, "rated", COMMUNITY, "M2 15.8 TOPS (fp16, like M1/M3 per the report)")
_M3_PEAK = _tf(15.8, "rated", COMMUNITY, "M3 15.8 TOPS; M3 Pro measured 16.77 at sp2048 (report)")
_M4_PEAK = _tf(18.6, "measured", MADERIX_README, "M4, 128x conv 512ch 64x64")
_M4X_PEAK = _tf(
    19.0,
    "derived",
    INTERNALS,
    "Apple's 38 TOPS is INT8: ~19 TFLOPS fp16 (the M4's engine; M4 measured 18.6)",
)
# SRAM: measured on M4 Max only (sram_probe: efficiency peaks at 12.5 MB of weights, first spill at 32 MB).
_M4_SRAM = Figure(32.0, "MB", "measured", BENCH_RESULTS, "M4 Max: first spill at 32 MB of weights")
_M1_SRAM = Figure(16.0, "MB", "reported", INTERNALS, "table value '~16 MB', not stated as measured")
_M2_SRAM = Figure(24.0, "MB", "reported", INTERNALS, "table value '~24 MB', not stated as measured")
_M3_SRAM = Figure(24.0, "MB", "assumed", INTERNALS, "no M3 figure: the M2 value ('~24 MB') stands in")

CHIPS: dict[str, Chip] = {
    c.name: c
    for c in (
        Chip("m1", "m1", "M1", _M1_PEAK, _bw(60.87), _M1_SRAM),
        Chip("m1-pro", "m1", "M1 Pro", _M1_PEAK, _bw(54.90), _M1_SRAM),
        Chip("m1-max", "m1", "M1 Max", _M1_PEAK, _bw(54.62), _M1_SRAM),
        Chip("m2", "m2", "M2", _M2_PEAK, _bw(60.45), _M2_SRAM),
        Chip("m2-pro", "m2", "M2 Pro", _M2_PEAK, _bw(61.93), _M2_SRAM),
        Chip("m2-max", "m2", "M2 Max", _M2_PEAK, _bw(62.01), _M2_SRAM),
        Chip("m3", "m3", "M3", _M3_PEAK, _bw(63.10), _M3_SRAM),
        Chip("m3-max", "m3", "M3 Max", _M3_PEAK, _bw(120.22), _M3_SRAM),
        Chip(
            "m3-ultra",
            "m3",
            "M3 Ultra",
            _tf(15.8, "derived", REPORT, "rated 31.6 for two dies; one program runs on one die (8.08 "
                "measured at sp64 in " + M3_ULTRA + ", below M3 Pro's 9.98)"),
            Figure(120.22, "GB/s", "assumed", ANEMLL, "no M3 Ultra entry: the M3 Max value stands in"),
            _M3_SRAM,
        ),
        Chip("m4", "m4", "M4", _M4_PEAK, _bw(64.18), _M4_SRAM),
        Chip("m4-pro", "m4", "M4 Pro", _M4X_PEAK, _bw(126.36), _M4_SRAM),
        Chip(
            "m4-max",
            "m4",
            "M4 Max",
            _M4X_PEAK,
            _bw(118.88),
            _M4_SRAM,
            Figure(0.095, "ms", "measured", RUSTANE),
        ),
    )
}  # fmt: skip


def chip(name: str) -> Chip:
    """The figures of a device ("m4", "m4-max", "M4 Max" ...); UnknownChip naming the known ones otherwise."""
    key = name.strip().lower().replace(" ", "-")
    if key not in CHIPS:
        raise UnknownChip(f"[cost] unknown chip '{name}' (known: {', '.join(CHIPS)})")
    return CHIPS[key]

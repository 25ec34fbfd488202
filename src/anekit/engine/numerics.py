"""What the Neural Engine computes, per chip: numeric behaviours as data, each with its evidence.

The engine is fp16 end to end with a wide accumulator, but it is not an IEEE machine. This module holds
every numeric behaviour anekit models, in the evidence form of the rule book (``anekit.rules.book``):
per chip a ``Finding`` (value, status, source, note), an ``evidence`` line recording where sources
disagree and what was decided, and a ``conservative`` value that chips without data (and the ``any``
profile) take. ``profile(chip)`` resolves one value per behaviour; the simulator computes with it
(``anekit.runtime.sim.numerics``) and the sanitizer reports where it departs from IEEE.

Statuses: ``measured`` (run on hardware by the source), ``decompile-derived`` (read out of Apple's
compiled tables or code), ``predicted`` (stated or modelled by a source without a measurement for that
chip), ``unknown`` (no data for the chip: the conservative value stands in, and says so).

Sources, in the order of weight (DESIGN.md "Evidence"): hardware measurements — the book "Apple Neural
Engine: Architecture, Programming, and Performance" (sbryngelson/ane-guide, CC BY 4.0; chapter 3
"Numerics", measured on M1/H13 unless it says otherwise) and ANEForge's committed numeric-cliff bench
(sbryngelson/ANEForge bench/numeric_cliffs.py, raw results per machine in bench/results/rooflines/,
summarised in bench/results/ROOFLINES.md) — then reports (issues, pull requests).

A chip without data for a behaviour takes the conservative side — the value that loses information or
saturates earlier — unless a source states the behaviour is uniform across chips, which the note says.
``any`` is the conservative union: per behaviour the most hazardous value of m1 ... m5.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from anekit.engine.chips import GENERATIONS
from anekit.engine.evidence import ROUTES, Evidence
from anekit.errors import AnekitError

CHIPS = GENERATIONS  # the one chip table (anekit.engine.chips)
# The statuses a numeric finding takes: a subset of the one evidence record's (anekit.engine.evidence).
STATUSES = ("measured", "decompile-derived", "predicted", "unknown")

GUIDE = "sbryngelson/ane-guide part-1-machine/03-numerics.md"
CLIFFS = (
    "sbryngelson/ANEForge bench/numeric_cliffs.py (results: bench/results/ROOFLINES.md, rooflines/*.json)"
)
FORGE_DOCS = "sbryngelson/ANEForge docs/numeric-cliffs.md"
DATAPATH = "sbryngelson/ane-guide part-6-silicon/20-datapath-mac.md"

FP16_MAX = 65504.0
FP16_MIN_NORMAL = 2.0**-14


class UnknownNumerics(AnekitError, KeyError):
    """An unknown chip or behaviour name, or a finding asked for a chip the record has no data for."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Finding:
    """One chip's value of a behaviour and where it comes from."""

    value: Any
    status: str
    source: str
    note: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"[numerics] status {self.status!r} not in {STATUSES}")
        if self.status != "unknown" and not self.source.strip():
            raise ValueError("[numerics] a finding without a source does not go in")

    def evidence(self, chip: str) -> Evidence:
        """This finding as the engine layer's one evidence record (numeric behaviours hold on every
        route: the arithmetic is the engine's, whoever dispatches it)."""
        observed = f"value {self.value!r}" + (f": {self.note}" if self.note else "")
        return Evidence(self.source, self.status, observed, (chip,), ROUTES)


@dataclass(frozen=True)
class Behaviour:
    """One numeric behaviour of the engine: per-chip findings, the conservative value, the evidence."""

    id: str
    statement: str
    findings: Mapping[str, Finding]
    conservative: Any  # what chips without data and the "any" profile take
    evidence: str = ""  # disagreements between sources and the decision taken
    applied_by: str = "anekit.runtime.sim.numerics"

    def __post_init__(self) -> None:
        unknown = set(self.findings) - set(CHIPS)
        if unknown:
            raise ValueError(f"[numerics] behaviour '{self.id}': unknown chips {sorted(unknown)}")
        if not self.findings:
            raise ValueError(f"[numerics] behaviour '{self.id}' has no finding on any chip")

    def finding(self, chip: str) -> Finding:
        """The finding for ``chip``; an error when the record has no data for it."""
        check_chip(chip)
        if chip not in self.findings:
            have = ", ".join(self.findings)
            raise UnknownNumerics(
                f"[numerics] no data for behaviour '{self.id}' on {chip} (data for: {have}); "
                f"the {chip} profile takes the conservative value {self.conservative!r}"
            )
        return self.findings[chip]

    def resolve(self, chip: str) -> Finding:
        """The value a profile uses for ``chip``: its finding, or the conservative value marked unknown."""
        check_chip(chip)
        if chip == "any":
            return Finding(self.conservative, "predicted", "conservative union of m1 ... m5", self._why())
        found = self.findings.get(chip)
        if found is not None:
            return found
        return Finding(self.conservative, "unknown", "", f"no data for {chip}: the conservative value")

    def _why(self) -> str:
        return "; ".join(f"{c}: {f.value!r} ({f.status})" for c, f in self.findings.items())


def check_chip(chip: str) -> str:
    """``chip`` if it names a chip with a numeric profile or "any"; an error naming the choices otherwise."""
    if chip != "any" and chip not in CHIPS:
        raise UnknownNumerics(f"[numerics] unknown chip '{chip}' (choose one of: any, {', '.join(CHIPS)})")
    return chip


def _all(value: Any, status: str, source: str, note: str = "", chips: tuple[str, ...] = CHIPS) -> dict:
    return {c: Finding(value, status, source, note) for c in chips}


@dataclass(frozen=True)
class Table:
    """An activation evaluated through a piecewise-linear table: its domain (inputs outside are clamped
    to the end knots), its value at exactly 0 where the table is biased there, its worst measured absolute
    error against the fp16-rounded exact function, and values it returns for special inputs."""

    domain: tuple[float, float] | None = None
    origin: float | None = None
    max_error: float | None = None
    special: Mapping[float, float] = field(default_factory=dict)


_SIGMOID_DOMAIN = (-9.938, 8.320)
# softplus collapses to +0 where exp(x) reaches the MAC ceiling 2^15: x >= ln(32768) = 10.397.
SOFTPLUS_COLLAPSE = math.log(32768.0)

TABLES: dict[str, Table] = {
    "sigmoid": Table(domain=_SIGMOID_DOMAIN, max_error=0.0034),
    "tanh": Table(max_error=0.0017),
    "gelu": Table(origin=-0.000543, max_error=0.0059),
    "silu": Table(origin=-0.001259),
    "softplus": Table(special={math.inf: 0.0}),
    "softsign": Table(special={math.inf: 0.0}),
    "log": Table(special={0.0: -45440.0}),
    "sin": Table(max_error=0.12),
    "cos": Table(max_error=0.12),
    "atan": Table(max_error=0.12),
}

_BEHAVIOURS: tuple[Behaviour, ...] = (
    Behaviour(
        "mac.output-ceiling",
        "The multiply-accumulate output port saturates at 2^15: a matmul, linear, einsum or a conv that "
        "accumulates two or more taps returns +/-inf where its fp16 output would reach 32768 (32752 passes), "
        "whatever the number of terms. A dedicated reduction, an elementwise op and a one-input-channel 1x1 "
        "conv keep the full fp16 range (65504).",
        {
            "m1": Finding(
                32768.0,
                "measured",
                f"{GUIDE} 'Saturation hazard'; {CLIFFS} matmul_saturation "
                "(MacBookPro17,1: 32752 finite, 32768 inf, K = 4 ... 128)",
            ),
            "m2": Finding(
                32768.0,
                "measured",
                f"{CLIFFS} matmul_saturation (Mac14,6 M2 Max; M2 Pro in ANEForge PR #145)",
            ),
            "m4": Finding(
                32768.0, "measured", f"{CLIFFS} matmul_saturation (Mac16,7 M4 Pro, Mac16,6 M4 Max)"
            ),
            "m5": Finding(
                32768.0,
                "measured",
                f"{CLIFFS} matmul_saturation (Mac17,3 M5, Mac17,8 M5 Pro); "
                "ANEForge issue #115 (K=32 sum 32000 exact, K=33 sum 33000 inf)",
            ),
        },
        32768.0,
        "ANEForge measured matmul only (the same ceiling on M1 through M6: 'architecture-wide', PR #145); "
        "the guide measured linear (K = 1, 2) and a two-channel conv on M1. The sign of a negative overflow "
        "was not measured: -inf is predicted by symmetry (ANEForge docs/numeric-cliffs.md says '+/-inf').",
    ),
    Behaviour(
        "mac.interior-partials",
        "A running partial sum inside a MAC reduction that reaches 2^15 overflows to inf even when later "
        "terms would cancel it back into range.",
        {"m1": Finding(True, "measured", f"{GUIDE} 'Saturation hazard'")},
        True,
        "Not measured by ANEForge (its fuzzer avoids it by bounding |x| @ |W|). The order of the partials is "
        "the reduction's index order in tiles of four lanes (mac.first-stage), the guide's lane lattice.",
    ),
    Behaviour(
        "mac.first-stage",
        "The first reduction stage of a MAC works in tiles of 4 consecutive lanes: within a tile the "
        "products are added in lane order, each partial rounded (ties to even) one bit below fp16's spacing "
        "at the larger operand's exponent; the tile leaves the stage rounded to fp16 (the value: how), and "
        "the wide accumulator sums the tiles. [4096] + [1] x 1024 against ones gives 5116; [b, -b, 1] x 16 "
        "keeps its 16 ones up to b = 4090 and exactly 4 from 4096 to 30000, in either order of the one.",
        {
            "m1": Finding(
                "truncate",
                "measured",
                f"{GUIDE} 'Wide accumulator' (5116; tbl:c3-cancel-sweep; 16000 ones exact) and "
                f"{DATAPATH} 'Radix-4 reduction and wide accumulator' (layout independence; 16 ones next to "
                "a partial of 8192)",
                "in-tile guard bit and truncated tile: a model fitted to every published probe",
            ),
            "m5": Finding(
                "away",
                "predicted",
                f"{GUIDE} 'Edge behavior' (M5 returns 2050 for the 2049 case)",
                "tiles round as the M5 output does",
            ),
        },
        "truncate",
        "ANEForge docs/developer/numerics.md: 'a wide, fp32-class accumulator fed by radix-4 fp16-rounded "
        "input tiles' (no chip named). The adder inside a tile is not published; anekit fitted it to the "
        "guide's M1 probes. Reproduced exactly: every row of tbl:c3-cancel-sweep for the orders [b, -b, 1], "
        "[b, 1, -b] and [1, b, -b] (16, 16, 16, 4, 4, 4, 4), 5116, sixteen thousand ones, the listing's 16 "
        "at 4000, sixteen ones after a partial of 8192, and the M1 2049 -> 2048 of a matmul. What decides "
        "it: a one next to a magnitude in [2048, 4096) sits on the guard bit and survives; from 4096 the "
        "guard grid is 2 and a one is a tie that goes to even; the grid is the larger operand's, so 1 - 4096 "
        "loses the one as 4096 + 1 does (the layout independence); the tile truncated to fp16 keeps 2049 at "
        "2048 and leaves 4091 - 4089 = 2 per pair. Rejected: tile sums exact then rounded (any rule: a floor "
        "of 8 or more, 16, 24, 44, 84 with truncation), a sequential fp16 sum (4 survivors at 3000 and "
        "4000), a partial rounded on its own magnitude (8 for [b, 1, -b] at 4096), pair trees. Applied "
        "exactly to MAC ops of at most EXACT_MAC_PRODUCTS (2^26) products, which holds every stories15M "
        "training kernel's matmuls and convs; larger ones (stories110M's projections and FFN, the "
        "classifier) accumulate in float32 (within a few fp16 ulps of the model, the published probes' "
        "absorption and floor not reproduced there).",
    ),
    Behaviour(
        "mac.subnormal-flush",
        "Subnormal fp16 operands, products and results inside a MAC become +0 (two subnormals summed in a "
        "matmul give +0); the elementwise path keeps subnormals (x + 0 and x * 1 echo them).",
        {
            "m1": Finding(True, "measured", f"{GUIDE} 'Edge behavior a correctness oracle must model'"),
            "m5": Finding(False, "measured", f"{GUIDE} (the M5 accumulator preserves denormals)"),
        },
        True,
        "The guide: 'the M2 through M4 parts between them were not measured' — they take the flush. maderix/"
        "ANE reports small gradient products flushed in training.",
    ),
    Behaviour(
        "table.subnormal-input",
        "sqrt and rsqrt read a subnormal input as the nearer of 0 and the smallest normal 2^-14 "
        "(sqrt(1.192e-7) = 0, sqrt(6.002e-5) = 2^-7).",
        {
            c: Finding(
                True,
                "measured",
                "sbryngelson/ANEForge pull request #263 review (adds -> sqrt table; chip not stated)",
                "model derived from the five published points",
            )
            for c in ("m5",)
        },
        True,
        "ANEForge: 'the ANE flushes subnormals. Everything below fp16's smallest normal comes back as "
        "exactly zero', but its own table shows 6.002e-05 -> 7.8125e-03 = sqrt(2^-14); rounding a "
        "subnormal to the nearer of {0, 2^-14} fits all five points. The guide measured subnormals kept "
        "on the elementwise add/mul path (M1), so the flush is placed at the table's input. Chip not "
        "stated: recorded on m5 (the author's other probes ran there); the rest take it.",
    ),
    Behaviour(
        "input.nan-coercion",
        "A NaN is coerced to +inf at an op's input: NaN + 0, relu(NaN), exp(NaN), maximum(NaN, 0) give +inf; "
        "sigmoid, tanh and erf of NaN give 1; a softmax row holding NaN puts all its mass on that lane.",
        {"m1": Finding("+inf", "measured", f"{GUIDE} 'Edge behavior a correctness oracle must model'")},
        "+inf",
        "ANEForge docs/onnx.md: 'fp16 NaN payloads do not survive the datapath, so x != x reads false' (no "
        "value, chip not stated): consistent.",
    ),
    Behaviour(
        "indeterminate.plus-zero",
        "The engine never emits NaN: inf - inf, 0 * inf, sqrt(-1), rsqrt(-1), log(-1) give +0.",
        {"m1": Finding("+0", "measured", f"{GUIDE} 'Edge behavior a correctness oracle must model'")},
        "+0",
        "No other source covers indeterminate forms.",
    ),
    Behaviour(
        "recip.signed-zero",
        "A zero loses its sign before a reciprocal or reciprocal square root: the reciprocal and rsqrt of -0 "
        "give +inf (IEEE: -inf); sqrt(-0) is +0. Applied to inverse, rsqrt and real_div's divisor.",
        {"m1": Finding(True, "measured", f"{GUIDE} 'Edge behavior a correctness oracle must model'")},
        True,
        "MIL's inverse and rsqrt add an epsilon first (-0 + eps is never -0), so the sign shows through "
        "real_div(x, -0): that the divide goes through the reciprocal path is predicted (the guide's "
        "appendix A lists real_div as a 'General divide').",
    ),
    Behaviour(
        "slice.width-offset-gain",
        "A slice with a nonzero begin offset on the width (last) axis goes through a crop DMA with a fixed "
        "x16 gain: an element with |value| above 4094 (65504 / 16) becomes +/-inf; 0 = no gain.",
        {
            "m1": Finding(
                16,
                "measured",
                f"{CLIFFS} slice_saturation (MacBookPro17,1: 4094 finite, 4096 "
                f"inf); {GUIDE} 'Saturation hazard'",
            ),
            "m2": Finding(
                16,
                "measured",
                f"{CLIFFS} slice_saturation (Mac14,6 M2 Max; M2 Pro, ANEForge PR "
                "#145: 4094 finite, 4100 inf)",
            ),
            "m4": Finding(0, "measured", f"{CLIFFS} slice_saturation (M4 Pro, M4 Max: finite at 60000)"),
            "m5": Finding(0, "measured", f"{CLIFFS} slice_saturation (M5, M5 Pro: finite at 60000)"),
        },
        16,
        "Where it stops: the guide says 'the non-saturating route arrives on the A15 generation'; ANEForge's "
        "docs/cross-chip.md says M1 only, its aneforge/_targets.py says M1 and M2 ('A15 pending M3 data'), "
        "its docs/numeric-cliffs.md says every chip before A16. The measurements (clamp on M1, M1 Air, M1 "
        "Max, M2 Pro, M2 Max; none on M4, M4 Pro, M4 Max, M5, M5 Pro, M6) decide m1, m2, m4, m5; m3 has no "
        "data and takes the clamp.",
    ),
    Behaviour(
        "reduce.tie-rounding",
        "A dedicated reduction (reduce_sum, reduce_mean) rounds an fp16 tie away from zero at its output: "
        "eight integers summing to 2049 read back 2050.",
        {
            c: Finding("away", "measured", f"{CLIFFS} reduce_exactness (8 terms [257, 256 x 7] -> 2050)")
            for c in ("m1", "m2", "m4", "m5")
        },
        "away",
        "The guide says 'a partial of 2049 ... rounds to 2048' on M1 and 2050 on M5 without naming the op; "
        "ANEForge's bench measured reduce_sum -> 2050 on M1 (MacBookPro17,1), M2, M4, M5 and M6 with its "
        "inputs published. Decision: reductions round ties away on every chip (ANEForge, the same "
        "'architecture-wide' result on every machine); the guide's case is kept for MAC ops "
        "(mac.tie-rounding).",
    ),
    Behaviour(
        "mac.tie-rounding",
        "A MAC op's output rounds an fp16 tie to even on M1 (2049 -> 2048) and away from zero on M5 (2050).",
        {
            "m1": Finding("even", "measured", f"{GUIDE} 'Edge behavior a correctness oracle must model'"),
            "m5": Finding("away", "measured", f"{GUIDE} ('The M5 returns 2050 for this case')"),
        },
        "even",
        "The guide leaves open 'whether the wide accumulator presents a value just above 2049 rather than an "
        "exact tie, or the rounding differs by generation'. m2 ... m4 have no data and take M1's "
        "(IEEE's) rounding.",
    ),
    Behaviour(
        "reduce.accumulator",
        "reduce_sum accumulates wide (fp32-class) and rounds once; it keeps the full fp16 range (a sum over "
        "65504 is inf, not the MAC's 2^15).",
        _all(
            "wide",
            "measured",
            f"{GUIDE} 'Wide accumulator', 'Saturation hazard' (a reduce-sum rounds to "
            "65504 first and then overflows)",
            chips=("m1",),
        ),
        "wide",
        "ANEForge docs/developer/numerics.md says both 'reductions and matmuls accumulate in a wide ... "
        "accumulator' (a sum of 16384 ones is bit-exact) and, in 'The reduce_sum trap', that reduce_sum "
        "accumulates narrow (fp16), with no chip or probe; its docs/cross-chip.md says the accumulator width "
        "is uniform across chips. Decision: wide on every chip (the narrow claim has no published probe).",
    ),
    Behaviour(
        "round.half-away",
        "round(x) adds 0.5 in fp16 (ties away) and truncates: ties go away from zero and values from 1024 "
        "on move up by one (round(1024) = 1025, round(-2047) = -2048).",
        {
            "m5": Finding(
                True,
                "measured",
                "sbryngelson/ANEForge pull request #116 (round(1024)=1025, "
                "round(1025)=1026, round(-2047)=-2048; 'ANE round is half-away-from-zero')",
            )
        },
        True,
        "Only M5 was probed; the op is the same native round on every family ANEForge targets.",
    ),
    Behaviour(
        "activation.tables",
        "Nonlinear activations are 33-knot piecewise-linear tables: inputs outside a table's domain take the "
        "end knot, some tables are biased at 0 (gelu -0.000543, swish -0.001259), special inputs collapse "
        "(softplus and softsign of +inf give +0, log(+0) gives -45440), and elsewhere the value is within "
        "the measured error of the fp16-rounded exact function. softplus gives +0 from x = ln(2^15).",
        {
            "m1": Finding(
                TABLES,
                "decompile-derived",
                f"{GUIDE} 'Activation functions', 'Edge behavior', 'Reference: fp16 numeric constants'",
            ),
            "m4": Finding(
                TABLES, "predicted", "apple/coremltools issue #2687 (softplus collapses at x ~ 10.4)"
            ),
            "m5": Finding(
                TABLES,
                "predicted",
                "sbryngelson/ANEForge issue #113 (softplus [5, 10, 11, 12, 88, "
                "1000] -> [5.008, 10, 0, 0, 0, 0])",
            ),
        },
        TABLES,
        "The knots themselves are not public: anekit computes the exact function rounded to fp16, with the "
        "domain clamps, origin biases and special values; tests hold the table's error envelope. softplus: "
        "ANEForge blames ln(65504) = 11.09, but its own data gives 0 at 11.0, and coremltools #2687 reports "
        "~10.4 = ln(2^15): the collapse is modelled where exp(x) reaches the MAC ceiling.",
    ),
    Behaviour(
        "int8.reconstruction",
        "A compressed weight is reconstructed to fp16 before the multiply: "
        "w = fp16(scale * (q - zero_point)), scale scalar or per output channel; the multiply that follows "
        "is the fp16 one.",
        {"m1": Finding(True, "measured", f"{GUIDE} 'fp16 datapath' (symmetric on M1: zero point 0)")},
        True,
        "The rounding order on device is not published beyond one rounding to fp16 (ANEForge's int8 packing "
        "is host-side: int8 * scale).",
    ),
    Behaviour(
        "exp.overflow",
        "exp(x) overflows to +inf from x = 11.094 (the first fp16 above ln(65504)); a square from 256.",
        {"m1": Finding(11.09375, "measured", f"{GUIDE} 'Reference: fp16 numeric constants'")},
        11.09375,
        "Ordinary fp16 overflow of the exact value: no special handling beyond the store's rounding.",
        applied_by="fp16 rounding of every stored value",
    ),
)

BEHAVIOURS: Mapping[str, Behaviour] = MappingProxyType({b.id: b for b in _BEHAVIOURS})


def behaviour(behaviour_id: str) -> Behaviour:
    """One behaviour by id; an error naming the known ids otherwise."""
    try:
        return BEHAVIOURS[behaviour_id]
    except KeyError:
        raise UnknownNumerics(
            f"[numerics] unknown behaviour '{behaviour_id}' (known: {', '.join(BEHAVIOURS)})"
        ) from None


@dataclass(frozen=True)
class Profile:
    """The numeric behaviours of one chip (or "any"), resolved: what the simulator computes with."""

    chip: str
    findings: Mapping[str, Finding]

    def __getitem__(self, behaviour_id: str) -> Any:
        behaviour(behaviour_id)  # a clear error for an unknown id
        return self.findings[behaviour_id].value

    @property
    def mac_ceiling(self) -> float:
        return float(self["mac.output-ceiling"])

    @property
    def flushes_mac_subnormals(self) -> bool:
        return bool(self["mac.subnormal-flush"])

    @property
    def slice_gain(self) -> int:
        return int(self["slice.width-offset-gain"])

    @property
    def mac_ties(self) -> str:
        return str(self["mac.tie-rounding"])

    def describe(self) -> list[str]:
        """One line per behaviour: id, value, status and source (or why the conservative value stands)."""
        lines = []
        for bid, f in self.findings.items():
            value = "tables" if isinstance(f.value, dict) else f.value
            where = f.source or f.note
            lines.append(f"{bid}: {value} [{f.status}] {where}")
        return lines


def _hazard(bid: str, values: list[Any]) -> Any:
    """The most hazardous of several chips' values of one behaviour (the "any" profile's)."""
    if bid == "slice.width-offset-gain":
        return max(values)
    if bid == "mac.output-ceiling":
        return min(values)
    return None


def profile(chip: str = "any") -> Profile:
    """The resolved profile of ``chip`` ("any": the conservative union of every chip)."""
    check_chip(chip)
    resolved = {bid: b.resolve(chip) for bid, b in BEHAVIOURS.items()}
    if chip == "any":  # where the chips' own values are ordered, the most hazardous of them
        for bid, b in BEHAVIOURS.items():
            worst = _hazard(bid, [b.resolve(c).value for c in CHIPS])
            if worst is not None:
                resolved[bid] = Finding(worst, "predicted", "conservative union of m1 ... m5", b._why())
    return Profile(chip, MappingProxyType(resolved))

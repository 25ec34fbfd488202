"""The constructs of the training kernels, each with the hardware runs behind it, and the precedent policy.

A *construct* is one way of writing a piece of the transformer step for the engine — a 1x1 conv with
baked weights, a matmul of two activations, RoPE written as slices and a concat — that a hardware-run
project either ran, saw refused, or never tried. The training routes (``anekit.engine.training_routes``)
are chosen from these records: a route is taken on a chip and macOS only when every construct its
kernels use has a precedent there. Work the host does (the attention core, RMSNorm and RoPE on the CPU)
needs none.

``precedent(construct_id, chip, macos="", extra=None)`` answers one of four words, with the evidence
behind the answer:

- ``ran``: a program with the construct ran on hardware on this generation (under this macOS major,
  where the evidence states its macOS), and no measured failure there;
- ``refused``: a measured failure on this generation and macOS (or, where the generation has no
  measurement of its own, on its family: below);
- ``nearest``: no measurement on this generation and macOS, but one of its family ran it under this
  macOS, or the generation itself ran it under another macOS major;
- ``none``: no hardware run to lean on.

The policy, in the order it is applied:

1. Only measurements count (``status == "measured"``) and only on the in-memory route (``direct``),
   the route anekit's backend drives. Reports (a failure nobody attributed to one construct, code that
   avoids a construct) are kept and shown but decide nothing: DESIGN.md "Evidence", measurements outrank
   reports. Measurements through the e5rt runtime (the ane-guide's op matrix) are kept at their own
   route: a program that compiled there is not a program that ran on the in-memory route (maderix
   commit 709b602 saw matmul fail on the in-memory route on an M1 under macOS 26.3 where the guide
   measured matmul native through e5rt).
2. Evidence that states no macOS version holds for every major; evidence that states one holds for
   that major only (``26.3.1`` is major 26).
3. This generation first. A measured failure there decides over a run there: a route is chosen to run
   at first contact, and a construct measured failing on this chip and macOS is avoided even where
   another program form of it ran (the rule book, which only warns, weighs such a conflict the other
   way: ``anekit.engine.evidence.POLICY``).
4. ``extra`` — what a Mac's own report adds (``anekit.engine.report``), by construct id — is a tier
   above the record at every step (this generation, its family, its other majors): where it speaks it
   decides alone, so the first user's report moves a construct without a code change.
5. Nearest. A generation with no measurement of its own under this macOS takes its *family's* (both
   its runs and its failures: "M2 takes M1's evidence"), then its own runs under the other macOS
   majors. The families are ``m1, m2`` and ``m3, m4, m5``: the ane-guide's per-chip limits
   (appendices/a-op-device-matrix.md, 'Per-chip numeric limits') divide M1/M2 from M3 on by two lines
   at once (the reduction-to-transpose threshold 192 -> 384 and native trigonometry), while within a
   family the op status differs only in the texture-engine ops (M2) and the tensor-size caps (M4 on),
   which the training kernels do not use; the hardware-run projects group them the same way (maderix
   709b602: "fail on M1/M2"; maderix benchmarks/community_results.json: "M5: H16 ANE family (same as
   M4)"). A run on the other family is not a precedent: the one time a construct measured on M4 was
   tried on an M3 (rustane's RoPE, pull request #9), it was refused. A construct's ``own_only`` evidence
   is not carried to the family: the M3's 512-channel convs under macOS 15 are the rule book's limit of
   the M3 alone (conv.channels-512-m3), and the M4 and M5 took other widths.
6. For ``macos=""`` (a route that runs under every major the engine layer knows) the answer is the
   weakest over ``MACOS_MAJORS`` (refused < none < nearest < ran); for chip ``any``, the weakest over
   every generation too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from anekit.engine.book import PR6, RULES
from anekit.engine.chips import ANY, GENERATIONS, UnknownChip, generation
from anekit.engine.evidence import DIRECT, E5RT, Evidence
from anekit.engine.sources import (
    GUIDE_MATRIX,
    GUIDE_METHODS,
    MADERIX,
    MADERIX_COMMUNITY,
    MADERIX_DYNAMIC,
    MADERIX_PR28,
    MADERIX_PR35,
    MADERIX_REPORT,
    MADERIX_STORIES,
    ORION_TRAIN,
    RUSTANE_ISSUE11,
    RUSTANE_ISSUE16,
    RUSTANE_PR9,
    RUSTANE_README,
    RUSTANE_SDPA,
)
from anekit.errors import AnekitError

MACOS_MAJORS = ("15", "26")  # the macOS majors the engine layer has evidence for (Sequoia, Tahoe)
FAMILIES = (("m1", "m2"), ("m3", "m4", "m5"))  # the nearest-evidence families (module docstring, 5.)
ANSWERS = ("refused", "none", "nearest", "ran")  # weakest first


class UnknownConstruct(AnekitError, KeyError):
    """A construct id the engine layer does not have."""

    def __str__(self) -> str:
        return str(self.args[0])


class UnknownMacOS(AnekitError, KeyError):
    """A macOS version whose major the engine layer has no evidence for."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Construct:
    """One way of writing a piece of the training step, with the hardware runs (and refusals) behind it."""

    id: str
    what: str
    evidence: tuple[Evidence, ...]
    used_by: str  # the routes and kernels that use it
    note: str = ""  # for a construct with no precedent: what hardware-run code does instead
    # evidence (also in ``evidence``) that speaks for the generations it names only, never for their family:
    # a limit measured as one chip's own, which the rule book applies to that chip alone (policy, 5.)
    own_only: tuple[Evidence, ...] = ()

    def __post_init__(self) -> None:
        if not any(not e.refutes for e in self.evidence) and not self.note.strip():
            raise ValueError(
                f"[engine] construct '{self.id}': no supporting evidence and no 'no precedent' note"
            )
        if not set(self.own_only) <= set(self.evidence):
            raise ValueError(f"[engine] construct '{self.id}': own_only evidence missing from its evidence")

    @property
    def has_precedent(self) -> bool:
        """Whether any program with it ran on hardware on the in-memory route."""
        return any(_counts(e) and not e.refutes for e in self.evidence)

    def sources(self) -> tuple[str, ...]:
        """The sources of its evidence, each once, in the order recorded."""
        return tuple(dict.fromkeys(e.source for e in self.evidence))


@dataclass(frozen=True)
class Precedent:
    """The answer of ``precedent``: one of ANSWERS, the evidence behind it and a one-line reason."""

    construct: str
    chip: str
    macos: str
    answer: str
    evidence: tuple[Evidence, ...]
    reason: str

    @property
    def usable(self) -> bool:
        """Whether a route may use the construct here ("ran" or "nearest")."""
        return self.answer in ("ran", "nearest")

    def __str__(self) -> str:
        return f"{self.construct} {self.answer} on {_where(self.chip, self.macos)}: {self.reason}"


# -- the record ------------------------------------------------------------------------------------


def _book(rule_id: str, source: str, *, refutes: bool, routes: tuple[str, ...] | None = None) -> Evidence:
    """The rule book's record of an observation from ``source`` under ``rule_id``, restated for a construct:
    ``refutes`` relative to the construct (a rule that says "matmul fails" is supported by what refutes
    the construct), ``routes`` where the construct layer counts the observation at its own route. One
    fact lives once: the source, the observation, the chips and the macOS stay the book's."""
    for e in RULES[rule_id].evidence:
        if e.source.startswith(source):
            return replace(e, refutes=refutes, routes=routes or e.routes)
    raise ValueError(f"[engine] rule '{rule_id}' holds no evidence from '{source}' (the constructs cite it)")


M1_STORIES_15 = _book("op.matmul-sdpa-m1", MADERIX_COMMUNITY, refutes=False)  # M1 Pro 15.0, M1 Max 15.6.1
M1_MATMUL_26 = _book("op.matmul-sdpa-m1", PR6, refutes=True)  # M1 Pro, macOS 26.3
GUIDE_MATMUL = _book("op.matmul-sdpa-m1", GUIDE_MATRIX, refutes=False, routes=E5RT)
GUIDE_GELU = _book("op.gelu-mode", GUIDE_MATRIX, refutes=False, routes=E5RT)
PR40_GELU = _book("op.gelu-mode", f"{MADERIX} pull request #40", refutes=False)  # M4 Max, e5rt
M3_DYNAMIC_26 = _book("conv.channels-512-m3", MADERIX_PR28, refutes=False)  # M3 Ultra, macOS 26.3
# M3 Pro and M3 Ultra, macOS 15.7.4: only 512-channel convs compiled, so a kernel set with the model's widths
# is refused there (the 512-channel run, M3_PEAK_15, stays on record beside it)
M3_CONV_512_15 = _book("conv.channels-512-m3", MADERIX_COMMUNITY, refutes=True)

M1_CONV_26 = Evidence(
    PR6,
    "measured",
    "'Conv-based kernels (training, QKV projections, FFN) work on all generations' (the fused FFN of "
    "training/test_full_fused.m, 'Test 2': 1x1 convs, sigmoid, mul), while matmul failed",
    ("m1",),
    DIRECT,
    "26.3",
)
M3_STATIC_26 = Evidence(
    f"{MADERIX_PR28} raw/train_large.log",
    "measured",
    "train_large (stories_mil.h: 1x1 convs with BLOBFILE weights, in-kernel RMSNorm, matmul attention, "
    "softmax, SiLU gate) trained 20 steps on the M3 Ultra (81.2 ms/step)",
    ("m3",),
    DIRECT,
    "26.3",
)
M3_PEAK_15 = Evidence(
    f"{MADERIX_COMMUNITY} (M3 Pro, macOS 15.7.4) and {MADERIX_REPORT}",
    "measured",
    "inmem_peak: 128 x 1x1 conv 512ch sp2048 at 16.77 TFLOPS; only ch = 512 compiled (the channel limit "
    "is the rule book's conv.channels-512-m3, not a refusal of the construct)",
    ("m3",),
    DIRECT,
    "15.7.4",
)
M4_TRAIN = Evidence(
    f"{MADERIX_COMMUNITY} (M4 Pro, M4 Max: 'inmem_peak and training work') and README.md ('tested on M4')",
    "measured",
    "the stories_mil.h training kernels (1x1 convs, in-kernel RMSNorm, matmul attention, softmax, SiLU "
    "gate) train at 64-73 ms/step",
    ("m4",),
    DIRECT,
)
ORION_M4_15 = Evidence(
    ORION_TRAIN,
    "measured",
    "Stories110M trains 1000 steps with baked weights: 1x1 conv projections, in-kernel RMSNorm "
    "(reduce_sum of x*x, pow -0.5), matmul attention with softmax, SiLU gate (M4 Max)",
    ("m4",),
    DIRECT,
    "15",
)
M5_STORIES_26 = Evidence(
    f"{MADERIX_COMMUNITY} (M5: 'Training works with existing program(1.3) MIL', 'static pipeline "
    "train_large')",
    "measured",
    "the stories_mil.h training kernels train on two M5 machines (101-128 ms/step)",
    ("m5",),
    DIRECT,
    "26.3",
)
M4_DYNAMIC = Evidence(
    f"{MADERIX} commit cb474e1 (training/training_dynamic/) and README.md ('tested on M4')",
    "measured",
    "the dynamic pipeline trains at 110 ms/step: every projection a matmul of the activations by weights "
    "sliced from the input's spatial columns; attention as matmul + softmax; RMSNorm on the CPU",
    ("m4",),
    DIRECT,
)
M4_ROPE = Evidence(
    f"{MADERIX} commit c3c5094 (training/training_dynamic/mil_dynamic.h gen_sdpa_fwd_dynamic)",
    "measured",
    "RoPE in the dynamic SDPA forward as rotate_half: reshape to pairs, slice even / odd, multiply by -1, "
    "concat, times the cos / sin tables ('Fixed the dynamic pipeline logit generation', M4)",
    ("m4",),
    DIRECT,
)
RUSTANE_M4 = Evidence(
    f"{RUSTANE_README} 'Training Pipeline Validation (M4 Max 128GB)' and {RUSTANE_SDPA}",
    "measured",
    "rustane trains 600M to 5B models: projections as matmuls by weights sliced from the input, RoPE as "
    "reshape + slice + negate + concat, attention as matmul + softmax, RMSNorm on the CPU (M4 Max)",
    ("m4",),
    DIRECT,
)
RUSTANE_M5 = Evidence(
    f"{RUSTANE_README} 'Forward-Only: M5 Max (community)' and {RUSTANE_SDPA}",
    "measured",
    "rustane's forward kernels (the same dynamic-weight matmuls, slice + concat RoPE, matmul + softmax "
    "attention) ran 5B to 20B forward passes on an M5 Max",
    ("m5",),
    DIRECT,
)
M5_DYNAMIC_26 = Evidence(
    MADERIX_PR35,
    "measured",
    "matmul of an activation by weights fed as a second input tensor, up to 4096 x 4096 (1.66-1.76 TFLOPS; "
    "the weights are their own input, not columns of the activation's)",
    ("m5",),
    DIRECT,
    "26.3",
)
RUSTANE_M3_26 = Evidence(
    f"{RUSTANE_PR9} and {RUSTANE_ISSUE16}",
    "measured",
    "after the RoPE change, all 8 kernels pass and 110M to 5B models train on the M3 Ultra: dynamic-weight "
    "matmul projections, matmul + softmax attention",
    ("m3",),
    DIRECT,
    "26.3.1",
)
M3_ROPE_REFUSED = Evidence(
    RUSTANE_PR9,
    "measured",
    "'M3 Ultra's ANE rejects width-axis reshape/slice/concat ops in sdpaFwd' (6 of 8 kernels compiled "
    "before the fix)",
    ("m3",),
    DIRECT,
    "26.3.1",
    refutes=True,
)
M3_ROPE_MATMUL = Evidence(
    RUSTANE_PR9,
    "measured",
    "rotate_half as a matmul by a constant hd x hd permutation ('rotate_half(x) = x @ P'): sdpaFwd compiles "
    "and 600M trains 500 steps on the M3 Ultra",
    ("m3",),
    DIRECT,
    "26.3.1",
)
M2_RUSTANE_FAILED = Evidence(
    RUSTANE_ISSUE11,
    "reported",
    "rustane's kernels (dynamic-weight matmuls, slice + concat RoPE) fail ANECCompile() on an M2 Max; "
    "which construct failed is not known",
    ("m2",),
    DIRECT,
    "15.7.4",
    refutes=True,
)
FUSED_NORM_REPORTED = Evidence(
    f"{MADERIX} commit c3c5094 (training/training_dynamic/mil_dynamic.h, the FFN kernel's comment)",
    "reported",
    "'RMSNorm stays on CPU (ANE can't handle RMS + 3 matmuls without BNNS fallback)'; commit cb474e1 and "
    "rustane likewise give the dynamic kernels the normalised input (M4)",
    ("m4",),
    DIRECT,
    refutes=True,
)
GUIDE_SOFTMAX = Evidence(
    f"{GUIDE_MATRIX} ('Activations') and {GUIDE_METHODS}",
    "measured",
    "softmax native on M1, M2 and M5 through the private Espresso runtime (macOS 14 or later, verified on "
    "26.5): an op-level result",
    ("m1", "m2", "m5"),
    E5RT,
)

_LEGACY = "the legacy kernels (kernels.route.LEGACY)"

CONSTRUCTS: dict[str, Construct] = {
    c.id: c
    for c in (
        Construct(
            "conv.baked",
            f"a projection or FFN matrix as a 1x1 conv whose weights are BLOBFILE consts ({MADERIX_STORIES})",
            (
                M1_STORIES_15,
                M1_CONV_26,
                M3_PEAK_15,
                M3_CONV_512_15,
                M3_STATIC_26,
                M4_TRAIN,
                ORION_M4_15,
                M5_STORIES_26,
            ),
            f"baked-engine-attention, conv-host-attention; {_LEGACY} (baked weights)",
            note="refused on the M3 under macOS 15 except at 512 channels: there only ch = 512 compiled "
            "(52 values tested, M3 Pro and M3 Ultra, the rule book's conv.channels-512-m3), and the training "
            "kernels' convs have the model's widths; under macOS 26.3 the M3 Ultra trained 768-channel convs",
            own_only=(M3_CONV_512_15,),
        ),
        Construct(
            "matmul.activations",
            "a matmul of two activations: Q K^T, probs @ V and their backward",
            (
                M1_STORIES_15,
                M1_MATMUL_26,
                GUIDE_MATMUL,
                M3_STATIC_26,
                M3_DYNAMIC_26,
                RUSTANE_M3_26,
                M4_TRAIN,
                ORION_M4_15,
                M4_DYNAMIC,
                RUSTANE_M4,
                M5_STORIES_26,
                RUSTANE_M5,
            ),
            "the engine-attention routes (dynamic-engine-attention[-rope-matmul], baked-engine-attention: "
            f"the SDPA kernels); {_LEGACY}",
        ),
        Construct(
            "matmul.dynamic-weights",
            "a matmul of an activation by weights sliced from the kernel's input (the dynamic kernels: "
            "compiled once, the weights travel in the spatial columns)",
            (
                M1_MATMUL_26,
                M2_RUSTANE_FAILED,
                M3_DYNAMIC_26,
                RUSTANE_M3_26,
                M4_DYNAMIC,
                RUSTANE_M4,
                M5_DYNAMIC_26,
                RUSTANE_M5,
            ),
            f"dynamic-engine-attention, dynamic-engine-attention-rope-matmul (projections, FFN); {_LEGACY} "
            "(dynamic weights)",
        ),
        Construct(
            "softmax.scores",
            "softmax of the masked attention scores over the key axis",
            (
                M1_STORIES_15,
                GUIDE_SOFTMAX,
                M3_STATIC_26,
                M3_DYNAMIC_26,
                RUSTANE_M3_26,
                M4_TRAIN,
                ORION_M4_15,
                M4_DYNAMIC,
                RUSTANE_M4,
                M5_STORIES_26,
                RUSTANE_M5,
            ),
            "the engine-attention routes (dynamic-engine-attention[-rope-matmul], baked-engine-attention: "
            f"the SDPA kernels); {_LEGACY}",
        ),
        Construct(
            "rmsnorm.fused-before-matmuls",
            "an RMSNorm in the same kernel ahead of the 3-4 matmuls that read it (the dynamic kernels)",
            (FUSED_NORM_REPORTED,),
            f"{_LEGACY} (dynamic weights); no route (every route normalises on the host)",
            note="no hardware run: maderix's dynamic pipeline (cb474e1, c3c5094) and rustane normalise on "
            "the CPU and hand the kernel the normalised input; c3c5094 reports the fused form falling back "
            "to BNNS (a report, not a measurement: it decides nothing, the construct stays without "
            "precedent)",
        ),
        Construct(
            "rmsnorm.plain",
            "reduce_sum of x*x, times 1/N, plus eps, pow -0.5, times x and the scale, in the kernel that "
            f"reads it ({MADERIX_STORIES})",
            (M1_STORIES_15, M3_STATIC_26, M4_TRAIN, ORION_M4_15, M5_STORIES_26),
            "no route (every route normalises on the host)",
        ),
        Construct(
            "rmsnorm.peak-normalised",
            "anekit's in-kernel RMSNorm dividing x by max|x| before the sum of squares (fp16 overflow guard)",
            (),
            f"{_LEGACY}",
            note="no hardware-run kernel divides by max|x| first: maderix stories_mil.h and Orion reduce "
            "x*x directly; the dynamic pipelines normalise on the CPU",
        ),
        Construct(
            "rmsnorm.scale-repeated",
            "the RMSNorm scale repeated over the S columns of a dynamic kernel's input",
            (),
            f"{_LEGACY} (dynamic weights)",
            note="no hardware-run dynamic kernel carries the norm scale: maderix mil_dynamic.h and rustane "
            "take the normalised input from the CPU",
        ),
        Construct(
            "rope.swap-conv",
            "the RoPE pair swap as a constant C x C 1x1 conv (forward and backward)",
            (),
            f"{_LEGACY}",
            note="no hardware-run kernel writes RoPE as a conv: maderix c3c5094 and rustane write "
            "rotate_half as reshape + slice + negate + concat; rustane pull request #9 as a matmul by a "
            "constant hd x hd permutation (rope.permutation-matmul)",
        ),
        Construct(
            "rope.slice-concat",
            "RoPE as reshape to pairs + slice even / odd + negate + concat, times the cos / sin tables "
            f"({MADERIX_DYNAMIC}, {RUSTANE_SDPA})",
            (M2_RUSTANE_FAILED, M3_ROPE_REFUSED, M4_ROPE, RUSTANE_M4, RUSTANE_M5),
            "dynamic-engine-attention, baked-engine-attention (the SDPA forward and backward kernels)",
        ),
        Construct(
            "rope.permutation-matmul",
            "rotate_half as a matmul by a constant hd x hd permutation matrix (rustane pull request #9)",
            (M3_ROPE_MATMUL,),
            "dynamic-engine-attention-rope-matmul (the SDPA forward and backward kernels: the form that ran "
            "on the M3 Ultra where rope.slice-concat was refused)",
        ),
        Construct(
            "gate.silu",
            f"the SwiGLU gate as sigmoid(h1) * h1 * h3 in the FFN kernel ({MADERIX_STORIES})",
            (M1_STORIES_15, M1_CONV_26, M3_STATIC_26, M3_DYNAMIC_26, M4_TRAIN, ORION_M4_15, M5_STORIES_26),
            "every route (the FFN forward and backward kernels of a SwiGLU model)",
        ),
        Construct(
            "gelu.tanh",
            'gelu(x, mode = "TANH_APPROXIMATION") (the FFN of a GELU model: Gemma 3)',
            (GUIDE_GELU, PR40_GELU),
            "the FFN kernels of a GELU model (Gemma 3), on every route",
            note="no run on the in-memory route: maderix pull request #40 ran it through e5rt (M4 Max), the "
            "ane-guide measured gelu native through e5rt; Orion's GPT-2 kernels decompose it to tanh",
        ),
    )
}


def construct(construct_id: str) -> Construct:
    """The construct with this id; UnknownConstruct naming the known ones otherwise."""
    try:
        return CONSTRUCTS[construct_id]
    except KeyError:
        raise UnknownConstruct(
            f"[engine] unknown construct '{construct_id}' (known: {', '.join(CONSTRUCTS)})"
        ) from None


# -- the policy ------------------------------------------------------------------------------------

_MAJOR = re.compile(r"(?<![\d.])(\d{1,3})(?:\.\d+)*")


def macos_major(macos: str) -> str:
    """The major of a macOS version ("26.3.1" -> "26"; "" stays ""); UnknownMacOS unless it is one of
    MACOS_MAJORS."""
    text = macos.strip()
    if not text:
        return ""
    m = re.fullmatch(r"(\d{1,3})(\.\d{1,3}){0,2}", text)
    if m is None or m.group(1) not in MACOS_MAJORS:
        raise UnknownMacOS(
            f"[engine] unknown macOS '{macos}' (choose one of: {', '.join(MACOS_MAJORS)}, a version of "
            "one of them such as 26.3, or '' for every one)"
        )
    return m.group(1)


def evidence_majors(macos: str) -> frozenset[str]:
    """The macOS majors an evidence record's ``macos`` names ("15.0, 15.6.1" -> {"15"}; "" -> none)."""
    return frozenset(_MAJOR.findall(macos))


def check_chip(chip: str) -> str:
    """The generation of a chip or device name, or "any"; UnknownChip naming the choices otherwise."""
    try:
        return generation(chip)
    except UnknownChip:
        raise UnknownChip(
            f"[engine] unknown chip '{chip}' (choose one of: {ANY}, {', '.join(GENERATIONS)}, or a device "
            "such as m1-pro, m4-max)"
        ) from None


def check_extra(extra: Mapping[str, Iterable[Evidence]] | None) -> dict[str, tuple[Evidence, ...]]:
    """``extra`` as a dict of tuples, every key a construct id."""
    out: dict[str, tuple[Evidence, ...]] = {}
    for key, items in (extra or {}).items():
        construct(key)
        out[key] = tuple(items)
    return out


def family(gen: str) -> tuple[str, ...]:
    """The other generations of ``gen``'s family."""
    return next(tuple(g for g in f if g != gen) for f in FAMILIES if gen in f)


def _counts(e: Evidence) -> bool:
    return e.is_hardware and "direct" in e.routes


def _applies(e: Evidence, gens: tuple[str, ...], major: str) -> bool:
    return any(g in e.chips for g in gens) and (not e.macos or major in evidence_majors(e.macos))


def _split(
    items: Iterable[Evidence], gens: tuple[str, ...], major: str
) -> tuple[list[Evidence], list[Evidence]]:
    """The measured refusals and runs among ``items`` on ``gens`` under ``major``."""
    hits = [e for e in items if _counts(e) and _applies(e, gens, major)]
    return [e for e in hits if e.refutes], [e for e in hits if not e.refutes]


def _one(
    c: Construct, gen: str, major: str, extra: tuple[Evidence, ...]
) -> tuple[str, tuple[Evidence, ...], str]:
    """(answer, evidence, reason) on one generation under one macOS major: the policy's steps 1-5, each
    step asking this Mac's report first and the record second."""
    tiers = (("this Mac's report", extra), ("the record", c.evidence))
    kin = family(gen)
    for label, items in tiers:
        refused, ran = _split(items, (gen,), major)
        if refused:
            return "refused", tuple(refused), f"measured failing on {gen} under macOS {major} ({label})"
        if ran:
            return "ran", tuple(ran), f"ran on {gen} under macOS {major} ({label})"
    for label, items in tiers:
        refused, ran = _split((e for e in items if e not in c.own_only), kin, major)
        if refused:
            return "refused", tuple(refused), f"its family ({', '.join(kin)}) measured it failing ({label})"
        if ran:
            return (
                "nearest",
                tuple(ran),
                f"ran on its family ({', '.join(kin)}) under macOS {major} ({label})",
            )
    others = tuple(m for m in MACOS_MAJORS if m != major)
    for label, items in tiers:
        ran = [e for m in others for e in _split(items, (gen,), m)[1]]
        if ran:
            return (
                "nearest",
                tuple(dict.fromkeys(ran)),
                f"ran on {gen} under macOS {', '.join(others)} ({label})",
            )
    everything = (*extra, *c.evidence)
    elsewhere = tuple(e for e in everything if _counts(e) and not e.refutes)
    reported = tuple(e for e in everything if e.refutes and not e.is_hardware)
    reason = "no hardware run in its family" if elsewhere else "no hardware run on the in-memory route"
    return "none", (*elsewhere, *reported), reason


def precedent(
    construct_id: str, chip: str, macos: str = "", extra: Mapping[str, Iterable[Evidence]] | None = None
) -> Precedent:
    """Whether ``construct_id`` has a hardware precedent on ``chip`` (a generation, a device name or "any")
    under ``macos`` (a major, a version, or "" for every major): the module docstring's policy."""
    c = construct(construct_id)
    gen = check_chip(chip)
    major = macos_major(macos)
    more = check_extra(extra).get(construct_id, ())
    cells = [
        (g, m)
        for g in (GENERATIONS if gen == ANY else (gen,))
        for m in (MACOS_MAJORS if not major else (major,))
    ]
    found = [_one(c, g, m, more) for g, m in cells]
    weakest = min(range(len(found)), key=lambda i: ANSWERS.index(found[i][0]))
    answer, items, reason = found[weakest]
    if len(cells) > 1 and answer != "ran":
        at = [f"{g}/{m}" for (g, m), f in zip(cells, found) if f[0] == answer]
        reason = f"{answer} on {', '.join(at)}: {reason}"
    return Precedent(construct_id, chip, macos, answer, items, reason)


def _where(chip: str, macos: str) -> str:
    return f"{chip} under macOS {macos}" if macos else f"{chip} under every macOS ({', '.join(MACOS_MAJORS)})"


__all__ = [
    "ANSWERS",
    "CONSTRUCTS",
    "FAMILIES",
    "MACOS_MAJORS",
    "Construct",
    "Precedent",
    "UnknownConstruct",
    "UnknownMacOS",
    "construct",
    "macos_major",
    "precedent",
]

"""The rule book: what the Neural Engine accepts, as data, each rule with the public source it rests on.

A rule is a fact learned from hardware (or reported by someone who ran hardware), never an anekit
assumption: every entry names its source — a public repository and file, or a law of the project's
reference ``ane-empirical-laws.md`` ("seed law"). Hardware-run public projects outrank the reference
documents; where two sources disagree, ``evidence`` records both and the decision taken.

Fields:

- ``scope``: what the rule is about — ``program`` (the program as a whole), ``op`` (one operation),
  ``tensor`` (a function input or output), ``surface`` (the IOSurfaces a backend allocates and binds),
  ``package`` (a CoreML package), ``quantization``, ``process`` (how a backend drives the framework).
- ``severity``: ``error`` — the engine refuses it or computes wrong numbers; ``warn`` — it falls off
  the engine, is slow, or has no hardware precedent.
- ``chips``: the chips the rule applies to (``CHIPS``); ``status``: ``measured`` (run on hardware by the
  source), ``reported`` (stated by a hardware-run project without a published measurement, or inferred
  from what hardware-run code avoids), ``seed law`` (ane-empirical-laws.md).
- ``checked_by``: where anekit enforces it (a check in ``anekit.rules.checks``, the macOS backend, the
  trainer) — rules about how the framework is driven are enforced by the backend, not by ``lint``.

Rules are the single place the simulator's strictness, ``anekit lint``, the kernels' structural tests,
the fake objc runtime and the README's "what the engine accepts" section read from.
"""

from __future__ import annotations

from dataclasses import dataclass

from anekit.errors import AnekitError

CHIPS = ("m1", "m2", "m3", "m4", "m5")
# How a program reaches the engine: "direct" (MIL text + weight files handed to the private framework,
# IOSurfaces the caller allocates) or "coreml" (a CoreML package, whose buffers CoreML allocates). The
# surface, descriptor and dialect rules hold only for the direct route; an op the private compiler
# refuses is, on the CoreML route, placed on the CPU instead (law 6), so those rules are direct-only too.
ROUTES = ("direct", "coreml")
DIRECT = ("direct",)
COREML = ("coreml",)
SCOPES = ("program", "op", "tensor", "surface", "package", "quantization", "process")
SEVERITIES = ("error", "warn")
STATUSES = ("measured", "reported", "seed law")

# Short names of the sources, expanded in every rule's ``source`` field.
ORION = "mechramc/Orion docs/ane_constraints.md"
MADERIX = "maderix/ANE"
RUSTANE = "ncdrone/rustane README.md, 'ANE Gotchas'"
RANE = "reference rane-api.md, 'MIL operations'"
LAWS = "reference ane-empirical-laws.md"


@dataclass(frozen=True)
class Rule:
    """One fact about what the engine accepts."""

    id: str
    statement: str
    scope: str
    severity: str
    status: str
    source: str
    chips: tuple[str, ...] = CHIPS
    evidence: str = ""
    checked_by: str = "anekit.rules.checks"
    routes: tuple[str, ...] = ROUTES  # the routes the rule holds on

    def __post_init__(self) -> None:
        problems = []
        if self.scope not in SCOPES:
            problems.append(f"scope {self.scope!r} not in {SCOPES}")
        if self.severity not in SEVERITIES:
            problems.append(f"severity {self.severity!r} not in {SEVERITIES}")
        if self.status not in STATUSES:
            problems.append(f"status {self.status!r} not in {STATUSES}")
        if not self.source.strip():
            problems.append("no source (a rule without a source does not go in)")
        if not set(self.chips) <= set(CHIPS) or not self.chips:
            problems.append(f"chips {self.chips} not a subset of {CHIPS}")
        if not set(self.routes) <= set(ROUTES) or not self.routes:
            problems.append(f"routes {self.routes} not a subset of {ROUTES}")
        if problems:
            raise ValueError(f"[rules] rule '{self.id}': " + "; ".join(problems))

    def on_route(self, route: str) -> bool:
        """Whether the rule holds for programs that reach the engine by ``route``."""
        return route in self.routes

    def applies_to(self, chip: str) -> bool:
        """Whether the rule holds on ``chip`` ("any": every rule of every chip applies)."""
        return chip == "any" or chip in self.chips


_RULES: tuple[Rule, ...] = (
    # -- surfaces: how inputs and outputs cross the host boundary --------------------------------
    Rule(
        "surface.uniform-input-size",
        "Every input surface of one kernel has the same IOSurface allocation size (pad to the largest).",
        "surface",
        "error",
        "measured",
        f"{ORION} §12 (status 0x1d at eval with inputs [768,32] and [768,16], M4 Max)",
        checked_by="anekit.runtime.ane surfaces; anekit.rules.checks.check_surface_plan",
        routes=DIRECT,
    ),
    Rule(
        "surface.uniform-output-size",
        "Every output surface of one kernel has the same IOSurface allocation size (pad to the largest).",
        "surface",
        "error",
        "measured",
        f"{ORION} §2 (status 0x1d with outputs [d,s] and [h,s], M4 Max); {MADERIX} README reports "
        "multi-input requests failing with 0x1d",
        checked_by="anekit.runtime.ane surfaces; anekit.rules.checks.check_surface_plan",
        routes=DIRECT,
    ),
    Rule(
        "surface.bind-alphabetical",
        "The engine binds input surfaces to the function's parameters, and outputs to its results, in "
        "alphabetical order of their MIL names, not in declaration or return order.",
        "surface",
        "error",
        "measured",
        f"{ORION} §3 and §13 (all 6 permutations of 3 inputs tried; only alphabetical order is right)",
        checked_by="anekit.runtime.ane requests; anekit.rules.checks.check_surface_plan",
        routes=DIRECT,
    ),
    Rule(
        "surface.packed-data",
        "A surface larger than its tensor holds the tensor packed at its start ([1,C,1,S] channel-major, "
        "no row stride), whatever the allocation size.",
        "surface",
        "error",
        "measured",
        f"{ORION} §14 (stride-padded data gave a ~260x smaller result)",
        checked_by="anekit.runtime.ane surfaces",
        routes=DIRECT,
    ),
    Rule(
        "surface.spatial-multiple-16",
        "The spatial width (last dimension) of every kernel input and output is a multiple of 16.",
        "tensor",
        "error",
        "reported",
        f"{RUSTANE}: 'IOSurface spatial width must be multiple of 16 (silent data corruption otherwise)'; "
        f"{ORION} §4: 'ANE internally uses a stride of 16 for the seq dimension'",
        routes=DIRECT,
    ),
    Rule(
        "surface.min-row-bytes",
        "Every kernel input and output row (the spatial width times the element size) is at least 64 "
        "bytes: spatial >= 32 for fp16.",
        "tensor",
        "error",
        "reported",
        f"{ORION} §4 (seq=1 surfaces fail with status 0x1d, M4 Max); the smallest shapes run by "
        f"hardware-run projects are 64-byte rows ({MADERIX} real-time benchmark at 64x32)",
        routes=DIRECT,
    ),
    Rule(
        "surface.min-bytes",
        "Surfaces under about 48 KB failed at eval in one hardware-run project.",
        "tensor",
        "warn",
        "measured",
        f"{ORION} §4 (minimum working [768,16] = 49,152 bytes, M4 Max)",
        evidence=f"{MADERIX} benchmarked 64x32 fp16 kernels (4 KB) on M4 through the real-time path, so "
        "small surfaces are not refused everywhere: a warning, not an error.",
        routes=DIRECT,
    ),
    Rule(
        "surface.max-bytes",
        "A single input or output surface over 16 MB: hardware-run pipelines split such kernels.",
        "tensor",
        "warn",
        "reported",
        f"{MADERIX} training/training_dynamic/mil_dynamic.h splits the FFN backward and the SDPA "
        "forward (no Wo) into kernels with smaller inputs",
        routes=DIRECT,
    ),
    # -- weights ------------------------------------------------------------------------------------
    Rule(
        "weights.blobfile-offset",
        "A BLOBFILE offset points at a blob's 64-byte metadata record (64 for a file's first blob), never "
        "at its data.",
        "op",
        "error",
        "measured",
        f"{ORION} §8 (a wrong offset reads garbage silently)",
        routes=DIRECT,
    ),
    Rule(
        "weights.baked",
        "Weights are baked at compile time: overwriting a weight file and reloading changes nothing; new "
        "weights need a recompile (or dynamic weights carried in an input).",
        "process",
        "warn",
        "measured",
        f"{ORION} §7; {MADERIX} training/test_weight_reload.m",
        checked_by="anekit.llama.trainer (baked mode recompiles every batch)",
        routes=DIRECT,
    ),
    Rule(
        "weights.reserved-name",
        "Weight file names must not collide with files the framework writes into the model's directory "
        "(model.mil, net.plist, data, ...).",
        "process",
        "error",
        "reported",
        f"{MADERIX} pull request #40 docs/ANE_CHAINING_RESEARCH.md: 'tmpDir contents: (weights, "
        "model.mil, net.plist, data)' (M4 Max); mechramc/Orion core/ane_runtime.h: the compiler's "
        "'data' file is the BLOBFILE",
        checked_by="anekit.runtime.ane; anekit.rules.checks.check_weight_names",
        routes=DIRECT,
    ),
    # -- how the framework is driven ------------------------------------------------------------
    Rule(
        "descriptor.mil-text-nsdata",
        "The descriptor's MIL text is NSData of UTF-8 bytes, not an NSString.",
        "process",
        "error",
        "measured",
        f"{ORION} §9 (an NSString crashes or fails silently)",
        checked_by="anekit.runtime.ane",
        routes=DIRECT,
    ),
    Rule(
        "descriptor.empty-weights-dict",
        "A program without weights still gets an empty weights dictionary, never nil.",
        "process",
        "error",
        "measured",
        f"{ORION} §11 (nil crashes)",
        checked_by="anekit.runtime.ane",
        routes=DIRECT,
    ),
    Rule(
        "process.compile-budget",
        "A process can compile about 119 programs before the compiler fails or the process becomes "
        "unstable; anekit's budget is 100, after which the trainer checkpoints and re-executes itself.",
        "process",
        "error",
        "measured",
        f"{ORION} §5, first documented by {MADERIX}",
        checked_by="anekit.runtime.base.Backend.compile; anekit.llama.trainer",
        routes=DIRECT,
    ),
    Rule(
        "process.request-per-load",
        "The _ANERequest is built after load and rebuilt on every load; a request is not reused across "
        "an unload and a reload.",
        "process",
        "error",
        "reported",
        f"{MADERIX} training/ane_runtime.h (ane_compile builds the request after loadWithQoS)",
        checked_by="anekit.runtime.ane",
        routes=DIRECT,
    ),
    Rule(
        "process.realtime-eval",
        "The real-time path (_ANEClient evaluateRealTimeWithModel:options:request:error:) is an opt-in: it "
        "was faster only for small kernels, and beginRealTimeTask may need an entitlement.",
        "process",
        "warn",
        "measured",
        f"{MADERIX} pull request #40 docs/ANE_INTERNALS.md (M4 Max: 0.093 vs 0.175 ms at 64x32, slower at "
        "768x256; 'beginRealTimeTask: NO (possibly needs entitlement)'); pull request #16 (M5: 'works but "
        "no perf gain')",
        evidence="Public code disagrees on the model object: pull request #40 passes the _ANEInMemoryModel "
        "itself, a bridge passes its underlying _ANEModel after loadRealTimeModel:, bracketed by "
        "beginRealTimeTask / endRealTimeTask (pull request #22 brackets too). anekit follows the bridge and "
        "falls back to the standard call on any failure.",
        checked_by="anekit.runtime.ane (realtime=True)",
        routes=DIRECT,
    ),
    # -- ops --------------------------------------------------------------------------------------
    Rule(
        "op.gelu",
        "gelu is refused by the compiler: write it with tanh, mul, add and pow.",
        "op",
        "error",
        "measured",
        f"{ORION} §10 (ANECCompile() FAILED)",
        routes=DIRECT,
    ),
    Rule(
        "op.concat",
        "concat was refused by the compiler in one hardware-run project; others run it.",
        "op",
        "warn",
        "reported",
        f"{ORION} §1 (ANECCompile() FAILED for programs using concat, M4 Max)",
        evidence=f"{MADERIX} training/training_dynamic/mil_dynamic.h and training/stories_mil.h run "
        "concat on axis 1 (output taps, GQA tiling) and on the last axis (RoPE) on hardware: a warning.",
    ),
    Rule(
        "op.concat-axis",
        "concat along an axis other than channels (1) or the last axis has no hardware precedent.",
        "op",
        "warn",
        "reported",
        f"{MADERIX} training/training_dynamic/mil_dynamic.h (concat on axes 1 and 3 only)",
        routes=DIRECT,
    ),
    Rule(
        "op.sdpa-mask",
        "scaled_dot_product_attention ignores its attention mask: write attention as matmul, add the "
        "mask, softmax, matmul.",
        "op",
        "error",
        "measured",
        f"{ORION} §6 (also seen by {MADERIX} and ANEgpt)",
    ),
    Rule(
        "op.rane-rejected",
        "reduce_mean and rsqrt are rejected by the engine: use reduce_sum times 1/N, and pow(x, -0.5).",
        "op",
        "error",
        "reported",
        f"{RANE}; hollance/neural-engine issue #44: 'reduce_mean does NOT exist in raw MIL text format'; "
        "christopherkarani/Espresso issue #18 (M1 Ultra: reduce_mean fails with ANECCompile() FAILED)",
        evidence="rane also lists reduce_sum and pow as rejected, but the hardware-run training kernels "
        f"of {MADERIX} (README: 'RMSNorm folded into forward kernels as MIL ops (reduce_sum + pow + mul)', "
        f"trained on M1 to M5) use both and {RUSTANE} recommends pow(-0.5): decided that reduce_sum and "
        "pow are accepted.",
        routes=DIRECT,
    ),
    Rule(
        "op.sqrt-after-reduce",
        "sqrt or rsqrt after a reduction fails to compile: use pow(x, -0.5).",
        "op",
        "error",
        "reported",
        f"{RUSTANE}: 'ANE compiler fails on rsqrt/sqrt after reduce ops — use pow(-0.5)'",
        routes=DIRECT,
    ),
    Rule(
        "op.identity-output",
        "A function output produced by identity: hardware-run kernels end in their last compute op.",
        "op",
        "warn",
        "reported",
        "hollance/neural-engine issue #44: 'ANE eval unstable on some hosts even for single-input "
        f"identity kernels'; every kernel of {MADERIX} training/stories_mil.h returns its last compute op",
        evidence="No public op sweep refusing identity was found: sbryngelson/ANEForge docs/op-catalog.md "
        "marks identity Y on M1-M5 ('aliases Cast/no-op') and a maderix/ANE PR (#6, inmem_peak.m) ends in "
        "identity. Since identity lowers to cast and cast is reported missing on M1/M2 (op.cast-m1-m2), "
        "anekit's kernels avoid it: a warning.",
        routes=DIRECT,
    ),
    Rule(
        "op.cast-m1-m2",
        "M1 and M2 have no cast (fp32 <-> fp16): their kernels take and return fp16.",
        "op",
        "error",
        "reported",
        f"{MADERIX} pull request #6 (commit 709b602, tested on M1 Pro): 'M1/M2 ANE doesn't support the "
        "cast op (fp32<->fp16)'",
        chips=("m1", "m2"),
        routes=DIRECT,
    ),
    Rule(
        "op.softmax-axis-size",
        "softmax over an axis whose size is not a power of two was refused (InvalidMILProgram).",
        "op",
        "warn",
        "reported",
        "hollance/neural-engine issue #44: 'softmax on non-power-of-2 dimensions -> InvalidMILProgram'",
        evidence=f"{MADERIX} training/ane_classifier.h runs softmax over a 32000-wide vocabulary on the "
        "engine (train_large_ane): a warning.",
    ),
    Rule(
        "op.reshape-noop",
        "A reshape to the shape it already has has no hardware precedent: leave it out.",
        "op",
        "warn",
        "reported",
        f"no kernel of {MADERIX} training/stories_mil.h or training_dynamic/mil_dynamic.h has one",
        routes=DIRECT,
    ),
    Rule(
        "op.transposed-weight-matmul",
        "A large operand (both of its last two dimensions over 128) is never the transposed operand of "
        "matmul: transpose the activations instead, as the dynamic-matmul pattern does.",
        "op",
        "warn",
        "reported",
        f"{MADERIX} training/training_dynamic/mil_dynamic.h gen_dyn_matmul (activations transposed, "
        "weights consumed as they are; transposes only on head-sized operands)",
        routes=DIRECT,
    ),
    Rule(
        "op.matmul-const-weight",
        "Projections by constant weights are conv ops (1x1), not matmul with a constant operand.",
        "op",
        "warn",
        "seed law",
        f"{LAWS} law 2 (ios18.conv for every projection); {MADERIX} training/stories_mil.h bakes "
        "weights as 1x1 convs",
    ),
    Rule(
        "conv.input-channels-refused",
        "A conv with 32000 or more input channels is refused.",
        "op",
        "error",
        "reported",
        f"{MADERIX} training/ane_classifier.h: 'ANE rejects conv with 32000 input channels'",
        routes=DIRECT,
    ),
    Rule(
        "conv.input-channels-unproven",
        "A conv with more than 2048 input channels has no hardware precedent.",
        "op",
        "warn",
        "reported",
        f"2048 is the largest conv input seen working in hardware-run kernels ({MADERIX} "
        "training/training_dynamic: Qwen3-0.6B Q_DIM 2048)",
        routes=DIRECT,
    ),
    Rule(
        "numerics.fp16-sum-of-squares",
        "A sum of squares over N elements in fp16 overflows to inf once RMS(x) > sqrt(65504 / N) (about "
        "9 for N = 768), and RMSNorm then normalises to zeros: scale x by at most 1/sqrt(N) first, or "
        "divide it by its largest |x| (reduce_max of abs).",
        "op",
        "error",
        "reported",
        "IEEE 754 binary16 (largest finite 65504) applied to the RMSNorm of "
        f"{MADERIX} training/stories_mil.h (reduce_sum of x*x in fp16)",
    ),
    # -- tensors ----------------------------------------------------------------------------------
    Rule(
        "io.rank4-batch1",
        "Every function input and output is a rank-4 tensor with batch 1 ([1, C, H, W]; [1, C, 1, S] "
        "for the direct kernels).",
        "tensor",
        "error",
        "seed law",
        f"{LAWS} law 1; every kernel of {MADERIX} and {ORION} uses [1, C, 1, S] surfaces",
        routes=DIRECT,
    ),
    Rule(
        "dialect.m1-m2",
        "M1 (and, by its author's report, M2) take MIL in the older program(1.0) / <ios16> form with "
        "tensor<string, []> scalars: ops newer than iOS16 cannot be written there.",
        "program",
        "error",
        "reported",
        f"{MADERIX} pull request #6 (commit 709b602, M1 Pro): 'targets program(1.0) with <ios16> instead "
        "of program(1.3)/<ios18>'; benchmarks/ANE_BENCHMARK_REPORT.md: program(1.3) / ios18 'PARTIAL' on M1",
        chips=("m1", "m2"),
        evidence="maderix's stories_mil.h kernels (program(1.3), ios18) train on M1 Pro / Max, so the "
        "newer form is not refused outright; the backend writes the older dialect on M1 / M2.",
        checked_by="anekit.runtime.ane picks the dialect by chip; anekit.rules.checks (ops newer than iOS16)",
        routes=DIRECT,
    ),
    Rule(
        "weights.one-blob-per-file-m1",
        "On M1 each weight is its own BLOBFILE (offset 64): files holding several blobs, referred to at "
        "other offsets, fail.",
        "op",
        "error",
        "measured",
        f"{MADERIX} benchmarks/ANE_BENCHMARK_REPORT.md, 'Cross-Generation MIL Compatibility': single-blob "
        "weights FAIL and BLOBFILE offset refs FAIL on M1; per-matrix weight blobs YES",
        chips=("m1",),
        routes=DIRECT,
    ),
    # -- the CoreML route (ane-empirical-laws.md) ---------------------------------------------------
    Rule(
        "package.rank4-shape",
        "Every input and output of an ANE-bound CoreML model is [1, C, T, 1].",
        "package",
        "warn",
        "seed law",
        f"{LAWS} law 1",
        checked_by="anekit.rules.checks (function I/O); CoreML packages once they are written",
        routes=COREML,
    ),
    Rule(
        "quant.int8-per-tensor",
        "int8 per-tensor weights keep every conv on the engine; int4 per-block weights make every conv "
        "fall off to the CPU in small shards.",
        "quantization",
        "warn",
        "seed law",
        f"{LAWS} law 3",
    ),
    Rule(
        "package.shard-size",
        "A package over ~250 MB of weights fails to compile for the engine (ANEF error -14); over ~1 GB "
        "no quantization helps.",
        "package",
        "warn",
        "seed law",
        f"{LAWS} law 4 (validated ceiling 223 MB)",
        checked_by="anekit.rules.checks.check_package (anekit lint MODEL.mlpackage)",
        routes=COREML,
    ),
    Rule(
        "package.layers-per-shard",
        "Large models go 1-3 transformer layers per shard, embedding and classifier on their own.",
        "package",
        "warn",
        "seed law",
        f"{LAWS} law 5",
        checked_by="the export's shard planner",
        routes=COREML,
    ),
    Rule(
        "package.residency",
        "Compiling is not proof of placement: only MLComputePlan shows each conv on the Neural Engine.",
        "process",
        "warn",
        "seed law",
        f"{LAWS} law 6",
        checked_by="the export's residency check (macOS only)",
        routes=COREML,
    ),
    Rule(
        "process.chaining",
        "Multi-stage dispatch without a host round trip goes through _ANEChainingRequest; it is not "
        "proven to work with in-memory MIL models.",
        "process",
        "warn",
        "seed law",
        f"{LAWS} law 7; {MADERIX} docs/ANE_CHAINING_RESEARCH.md (blocked on Code=15, needs Espresso IR)",
        checked_by="anekit.runtime.ane (chaining is opt-in with a sequential fallback)",
        routes=DIRECT,
    ),
    Rule(
        "package.kv-state",
        "Autoregressive decode keeps its KV cache in MLState, not in inputs and outputs.",
        "package",
        "warn",
        "seed law",
        f"{LAWS} law 8",
        checked_by="the model export (states)",
        routes=COREML,
    ),
)

RULES: dict[str, Rule] = {r.id: r for r in _RULES}
assert len(RULES) == len(_RULES), "duplicate rule ids"


class UnknownRule(AnekitError, KeyError):
    """A rule id that the book does not have."""


def rule(rule_id: str) -> Rule:
    """The rule with this id."""
    try:
        return RULES[rule_id]
    except KeyError:
        raise UnknownRule(f"[rules] no rule '{rule_id}' (known: {', '.join(RULES)})") from None


def check_chip(chip: str) -> str:
    """``chip`` if it names a chip or "any"; an error naming the choices otherwise."""
    if chip != "any" and chip not in CHIPS:
        raise AnekitError(f"[rules] unknown chip '{chip}' (choose one of: any, {', '.join(CHIPS)})")
    return chip

"""The rule book: what the Neural Engine accepts, each rule weighed by its evidence.

A rule (``anekit.engine.rule.Rule``) keeps every observation behind it — supporting and contradicting,
each with its source, status, chips, routes and macOS version where known — and its severity on a chip
and route follows from them by one policy (``anekit.engine.evidence.POLICY``). This module holds the
rules written by hand (surfaces, weights, the framework's protocol, ops with a measured quirk, the
CoreML laws); ``anekit.engine.ops`` adds the op tables read off the operation-by-device matrix and
``anekit.engine.extents`` the per-chip extents.

Where sources disagree, ``decision`` says what anekit does. Three disagreements resolve by route: the
surface rules of the in-memory route (Orion, maderix, m0at, Espresso) say nothing about the e5rt
runtime's buffers the book measured through, and the op rejections reported for the in-memory route
(gelu, concat) were written without the optional arguments the compiler's MIL reader needs there.
"""

from __future__ import annotations

from anekit.engine.chips import GENERATIONS
from anekit.engine.evidence import COMPILED, COREML, DIRECT, E5RT, ROUTES, Evidence
from anekit.engine.extents import EXTENT_RULES
from anekit.engine.ops import OP_RULES
from anekit.engine.rule import Rule
from anekit.engine.sources import (
    ESPRESSO,
    FORGE,
    GUIDE,
    GUIDE_MATRIX,
    HOLLANCE_44,
    LAWS,
    M0AT,
    MADERIX,
    MADERIX_COMMUNITY,
    MADERIX_REPORT,
    ORION,
    RANE,
    RUSTANE,
)
from anekit.errors import AnekitError

M4 = ("m4",)
M5 = ("m5",)
M1 = ("m1",)
ORION_OS = "15"  # mechramc/Orion docs/ane_api_reference.md, 'Verified On' (Mac Studio M4 Max, macOS 15)
PR40 = f"{MADERIX} pull request #40"
PR6 = f"{MADERIX} pull request #6 (commit 709b602, 'Tested on M1 Pro, macOS 26.3')"
M0AT_README = f"{M0AT} README.md"
ESPRESSO_DOCS = f"{ESPRESSO} docs/reverse-engineering-apple-neural-engine.html"
GUIDE_COMPILED = "through the e5rt runtime; the in-memory route calls the same compiler"


def _orion(section: str, observed: str, consequence_chips: tuple[str, ...] = M4) -> Evidence:
    return Evidence(f"{ORION} {section}", "measured", observed, consequence_chips, DIRECT, ORION_OS)


def _guide_native(ops: str, chips: tuple[str, ...] = ("m1", "m2", "m5")) -> Evidence:
    return Evidence(
        GUIDE_MATRIX,
        "measured",
        f"{ops} native ({GUIDE_COMPILED})",
        chips,
        COMPILED,
        refutes=True,
    )


_SURFACE_RULES = (
    Rule(
        "surface.uniform-input-size",
        "Every input surface of one kernel has the same IOSurface allocation size (pad to the largest).",
        "surface",
        "refused",
        (_orion("§12", "status 0x1d at eval when input IOSurfaces have different allocation sizes"),),
        checked_by="anekit.runtime.ane surfaces; anekit.rules.checks.check_surface_plan",
    ),
    Rule(
        "surface.uniform-output-size",
        "Every output surface of one kernel has the same IOSurface allocation size (pad to the largest).",
        "surface",
        "refused",
        (_orion("§2", "status 0x1d at eval when output IOSurfaces have different allocation sizes"),),
        checked_by="anekit.runtime.ane surfaces; anekit.rules.checks.check_surface_plan",
    ),
    Rule(
        "surface.bind-alphabetical",
        "The engine binds input surfaces to the function's parameters, and outputs to its results, in "
        "alphabetical order of their MIL names, not in declaration or return order.",
        "surface",
        "wrong numbers",
        (
            _orion(
                "§3 and §13",
                "outputs arrive in alphabetical order of their MIL names; of the 6 orders of 3 inputs only "
                "the alphabetical one is right",
            ),
        ),
        checked_by="anekit.runtime.ane requests; anekit.rules.checks.check_surface_plan",
    ),
    Rule(
        "surface.packed-data",
        "A surface larger than its tensor holds the tensor packed at its start ([1,C,1,S] channel-major, "
        "no row stride), whatever the allocation size.",
        "surface",
        "wrong numbers",
        (
            _orion(
                "§14", "the engine reads the first C*S contiguous fp16 values; stride-padded data was wrong"
            ),
        ),
        checked_by="anekit.runtime.ane surfaces",
    ),
    Rule(
        "surface.min-row-bytes",
        "Every input and output row of a kernel (the last dimension times the element size) is at least 64 "
        "bytes: S >= 32 for fp16, S >= 16 for fp32.",
        "tensor",
        "wrong numbers",
        (
            Evidence(
                f"{M0AT_README}, '10. Minimum Sequence Length'",
                "measured",
                "'silent all-zeros output for sequence lengths below S = 16 (fp32 I/O) or S = 32 (fp16 I/O)' "
                "(tests/ane_s1_investigate.m sweeps S = 1 ... 256)",
                M5,
                DIRECT,
                "26.3",
            ),
            Evidence(
                ESPRESSO_DOCS,
                "measured",
                "'Smaller widths (< 32) on trunk kernels reliably produce statusType=0x9 at eval time' "
                "(M3 Max)",
                ("m3",),
                DIRECT,
                "15",
            ),
            _orion(
                "§4",
                "seq = 1 surfaces fail with status 0x1d ([768, 1]: 'too small'); 'Minimum working size: "
                "[768, 16] = 49,152 bytes' — fp32 I/O, 64-byte rows",
            ),
            Evidence(
                "mechramc/Orion docs/ane_api_reference.md, 'Constraints & Gotchas'",
                "measured",
                "'Very small tensors (e.g., [1,4,1,4]) fail at evaluation'",
                M4,
                DIRECT,
                ORION_OS,
            ),
        ),
        decision="Three projects measured short rows failing on M3, M4 and M5 (zeros or an eval error). "
        "Orion's LoRA adapter [1,768,1,16] is not counted against it: its surface was allocated for "
        "[768,32], 64-byte rows, and the tensor read packed from it (surface.packed-data). Orion §4's "
        "'~49 KB minimum surface' is read as this rule, not as a size of its own: its smallest working shape "
        "has 64-byte rows, and 4 KB (maderix pull request #40, M4 Max; pull request #6, M1 Pro) and 12 KB "
        "(maderix training/test_ane_sdpa5.m, M4) surfaces with longer rows ran.",
    ),
    Rule(
        "surface.spatial-multiple-16",
        "The last dimension of every kernel input and output is a multiple of 16.",
        "tensor",
        "wrong numbers",
        (
            Evidence(
                RUSTANE,
                "reported",
                "'IOSurface spatial width must be multiple of 16 (silent data corruption otherwise)' "
                "(M4 Max)",
                M4,
                DIRECT,
            ),
            Evidence(
                f"{ORION} §4",
                "reported",
                "'ANE internally uses a stride of 16 for the seq dimension'",
                M4,
                DIRECT,
            ),
        ),
    ),
    Rule(
        "surface.global-over-16mb",
        "An input surface over 16 MB (dynamic weights) is created with kIOSurfaceIsGlobal for the engine to "
        "reach it.",
        "tensor",
        "refused",
        (
            Evidence(
                f"{MADERIX} pull request #35 README.md, 'Implementation Notes' item 3 (M5, macOS 26.3)",
                "reported",
                "'For large weights (>16MB), use ane_create_weights_surface() which adds kIOSurfaceIsGlobal'",
                M5,
                DIRECT,
                "26.3",
            ),
        ),
    ),
    Rule(
        "surface.max-outputs",
        "A kernel has at most two outputs: with three or more, every output but the last is corrupted.",
        "tensor",
        "wrong numbers",
        (
            Evidence(
                f"{M0AT} docs/ANE_FUSED_KV.md, 'Why 3 Outputs Fail'; README '6. Maximum 2 Outputs Per "
                f"Program'",
                "measured",
                "'with 3 outputs (fused Q+K+V), only the last output (index 2) contains correct data ... "
                "even 3 identical [256->64] convs fail'",
                M5,
                DIRECT,
                "26.3",
            ),
            Evidence(
                "mechramc/Orion archive/milgen/inference/gpt2_decode_ane.milgen.h",
                "measured",
                "the GPT-2 decode kernel returns three outputs (q, k_new, v_new) and generates text",
                M4,
                DIRECT,
                ORION_OS,
                refutes=True,
            ),
        ),
        decision="Measured on M5 and contradicted on M4 Max, where Orion §3 explains wrong multi-output "
        "data by "
        "the alphabetical binding order: an error on M5, a warning on M1 to M3. anekit's kernels concatenate "
        "their outputs into one surface.",
    ),
    Rule(
        "surface.shared-between-kernels",
        "One IOSurface bound to two kernels (one's output as the other's input) fails at eval.",
        "process",
        "refused",
        (
            Evidence(
                f"{ESPRESSO} docs/fused-decode-and-next-steps.md and AGENTS.md, 'Proven Dead Ends' (M3 Max, "
                "macOS 15)",
                "measured",
                "'IOSurface aliasing between kernels | statusType=0x9: Program Inference error'",
                ("m3",),
                DIRECT,
                "15",
            ),
        ),
        checked_by="anekit.runtime.ane (every kernel owns its surfaces; chains copy outputs to inputs)",
    ),
)

_WEIGHT_RULES = (
    Rule(
        "weights.blobfile-offset",
        "A BLOBFILE offset points at a blob's 64-byte metadata record (64 for a file's first blob), never "
        "at its data.",
        "op",
        "wrong numbers",
        (
            _orion(
                "§8", "the const's offset points to the chunk header at byte 64; a wrong offset reads garbage"
            ),
        ),
    ),
    Rule(
        "weights.baked",
        "Weights are baked at compile time: overwriting a weight file and reloading changes nothing; new "
        "weights need a recompile (or dynamic weights carried in an input).",
        "process",
        "wrong numbers",
        (
            _orion("§7", "overwriting BLOBFILE weight files and reloading does not change outputs"),
            Evidence(
                f"{MADERIX} training/test_weight_reload.m",
                "measured",
                "reloaded weights are ignored",
                routes=DIRECT,
            ),
        ),
        checked_by="anekit.training.loop (baked mode recompiles every batch)",
    ),
    Rule(
        "weights.reserved-name",
        "Weight file names must not collide with files the framework writes into the model's directory "
        "(model.mil, net.plist, data, ...).",
        "process",
        "refused",
        (
            Evidence(
                f"{PR40} docs/ANE_CHAINING_RESEARCH.md",
                "reported",
                "'tmpDir contents: (weights, model.mil, net.plist, data)' (M4 Max)",
                M4,
                DIRECT,
            ),
        ),
        checked_by="anekit.runtime.ane; anekit.rules.checks.check_weight_names",
    ),
    Rule(
        "weights.one-blob-per-file-m1",
        "On the M1 each weight is its own BLOBFILE (offset 64): files holding several blobs, referred to at "
        "other offsets, fail.",
        "op",
        "refused",
        (
            Evidence(
                f"{MADERIX_REPORT}, 'Cross-Generation MIL Compatibility'",
                "measured",
                "'Single-blob weights FAIL' and 'BLOBFILE offset refs FAIL' on M1; 'Per-matrix weight blobs "
                "YES'",
                M1,
                DIRECT,
            ),
        ),
        chips=M1,
    ),
)

_PROCESS_RULES = (
    Rule(
        "descriptor.mil-text-nsdata",
        "The descriptor's MIL text is NSData of UTF-8 bytes, not an NSString.",
        "process",
        "refused",
        (_orion("§9", "an NSString milText crashes or fails silently"),),
        checked_by="anekit.runtime.ane",
    ),
    Rule(
        "descriptor.empty-weights-dict",
        "A program without weights still gets an empty weights dictionary, never nil.",
        "process",
        "refused",
        (_orion("§11", "a nil weight dictionary crashes"),),
        checked_by="anekit.runtime.ane",
    ),
    Rule(
        "descriptor.hex-id-weights",
        "A model's hexStringIdentifier (its NSTemporaryDirectory() directory) follows the MIL text and the "
        "weight dictionary's keys, not the weight bytes, and a load reads the compiled files of that "
        "directory: programs that differ only in weight bytes must not share names, or reloading one runs "
        "the weights of the last one compiled.",
        "process",
        "wrong numbers",
        (
            Evidence(
                "mechramc/Orion core/ane_runtime.m, orion_program_patch_weights",
                "reported",
                "'Same hexId as donor (same MIL text + weight dict keys)'; a model is loaded without "
                "compiling from the net.plist and data files of its directory ('The compiled ANE data file "
                "IS the BLOBFILE')",
                M4,
                DIRECT,
                ORION_OS,
            ),
        ),
        checked_by="anekit.runtime.ane.weights.content_names (weight files named by their bytes); "
        "anekit.runtime.ane.lifecycle.TempDirs (a live directory is never rewritten with other content)",
    ),
    Rule(
        "process.compile-budget",
        "A process can compile about 119 programs before the compiler fails or the process becomes "
        "unstable; anekit's budget is 100 per process, counted over every backend object of the process, "
        "after which the trainer checkpoints and re-executes itself.",
        "process",
        "refused",
        (
            _orion(
                "§5 (first documented by maderix/ANE)",
                "after about 119 ANECompile() calls the compiler fails",
            ),
            Evidence(
                f"{MADERIX} training/stories_config.h and training/stories_io.h; mechramc/Orion "
                "core/ane_runtime.m",
                "reported",
                "one process-wide counter (g_compile_count) against MAX_COMPILES 100 / orion_compile_count()",
                routes=DIRECT,
            ),
        ),
        checked_by="anekit.runtime.base.PROCESS_COMPILES (AneBackend); anekit.training.loop",
    ),
    Rule(
        "process.failed-compile-pause",
        "A failed compile restarts the shared compile service; the next compile waits one restart "
        "interval (about 15 s), or a run of failures stalls unrelated compiles.",
        "process",
        "slow",
        (
            Evidence(
                "sbryngelson/ane-guide part-5-practice/19-pitfalls-and-limits.md, 'Pacing compiles after a "
                "failure'",
                "measured",
                "failures faster than the service restarts slow unrelated compiles down; failures spaced "
                "past the restart interval cause no degradation: 'wait at least one restart interval, "
                "roughly 15 seconds, before the next compile'",
                routes=COMPILED,
            ),
        ),
        checked_by="anekit.runtime.ane.pacing (FAILED_COMPILE_PAUSE)",
    ),
    Rule(
        "process.loaded-program-ceiling",
        "A process can hold near 128 loaded programs; the next load fails ('GetANEFModel: must "
        "re-compile'). anekit keeps at most 120 loaded per process and unloads the least recently used "
        "kernel to load another (it reloads itself before its next run).",
        "process",
        "refused",
        (
            Evidence(
                "sbryngelson/ane-guide part-4-workloads/14-llm-case-study.md",
                "measured",
                "'The loaded-program cap is near 128 programs per process: the next load fails with "
                "`GetANEFModel: must re-compile`'",
                routes=COMPILED,
            ),
        ),
        checked_by="anekit.runtime.ane.residency (MAX_LOADED, least recently used unload)",
    ),
    Rule(
        "process.request-per-load",
        "The _ANERequest is built after load and rebuilt on every load; a request is not reused across "
        "an unload and a reload.",
        "process",
        "refused",
        (
            Evidence(
                f"{MADERIX} training/ane_runtime.h",
                "reported",
                "ane_compile builds the request after loadWithQoS; nothing public reuses one across a reload",
                routes=DIRECT,
            ),
        ),
        checked_by="anekit.runtime.ane",
    ),
    Rule(
        "process.realtime-eval",
        "The real-time path (_ANEClient evaluateRealTimeWithModel:options:request:error:) is an opt-in: it "
        "was "
        "faster only for small kernels, gains nothing on M5, and beginRealTimeTask may need an entitlement.",
        "process",
        "slow",
        (
            Evidence(
                f"{PR40} docs/ANE_INTERNALS.md, 'Execution Paths'; docs/ANE_CHAINING_RESEARCH.md, '4. "
                f"Evaluation Path Benchmarks'",
                "measured",
                "0.093 ms real-time vs 0.175 ms standard at 64x32, 0.246 vs 0.205 ms at 768x256 (M4 Max)",
                M4,
                DIRECT,
                "15",
            ),
            Evidence(
                f"{PR40} docs/ANE_CHAINING_RESEARCH.md, 'v2: test_chaining_v2.m Results (M4 Max)'",
                "measured",
                "'beginRealTimeTask: NO (possibly needs entitlement)'",
                M4,
                DIRECT,
            ),
            Evidence(
                f"{MADERIX} pull request #16 README.md, 'M5 Hardware Investigation'",
                "measured",
                "'evaluateRealTimeWithModel works but no perf gain'",
                M5,
                DIRECT,
                "26.3",
            ),
            Evidence(
                f"{ESPRESSO} AGENTS.md (M3 Max, macOS 15)",
                "measured",
                "'loadRealTimeModel: returns NO with no error. Silent entitlement gate.'",
                ("m3",),
                DIRECT,
                "15",
            ),
            Evidence(
                f"{MADERIX} commit 99ba013 training/ane_runtime.h (ane_eval_rt), "
                "training/test_bench_paths.m, docs/ANE_CHAINING_RESEARCH.md '5a: Real-time eval'",
                "measured",
                "evaluateRealTimeWithModel: handed the _ANEInMemoryModel itself with @{} options, no "
                "loadRealTimeModel and beginRealTimeTask returning NO: 'RT vs Standard speedup: 1.74x' "
                "(M4 Max)",
                M4,
                DIRECT,
                "15",
            ),
        ),
        checked_by="anekit.runtime.ane.realtime (realtime=True: the in-memory model first, then the model "
        "property, then the standard call; what worked is remembered per chip and macOS)",
    ),
    Rule(
        "process.chaining",
        "Multi-stage dispatch without a host round trip goes through _ANEChainingRequest; it is not proven "
        "to work with in-memory MIL models.",
        "process",
        "falls back",
        (
            Evidence(f"{LAWS} law 7", "seed law", "chaining needs _ANEChainingRequest", routes=DIRECT),
            Evidence(
                f"{PR40} docs/ANE_CHAINING_RESEARCH.md",
                "measured",
                "prepareChainingWithModel: fails with code 15; in-memory models crash on getUUID (M4 Max)",
                M4,
                DIRECT,
            ),
        ),
        checked_by="anekit.runtime.ane (chaining is opt-in with a sequential fallback)",
    ),
    Rule(
        "process.dual-die-throughput",
        "On a two-die Ultra the engine's throughput degrades within one process after tens of thousands of "
        "evaluations (about 28K measured): anekit reloads every loaded kernel after each 100K evaluations "
        "of the process (rustane's refresh), and long runs restart the process.",
        "process",
        "slow",
        (
            Evidence(
                "ncdrone/rustane pull request #9 (commit 9af4c6e; scripts/train-chunked.sh), M3 Ultra, "
                "macOS 26.3.1",
                "measured",
                "'Measured degradation onset at step ~43 (~28K ANE dispatches)'; first reported as ~100K "
                "evaluations in the pull request's description",
                ("m3",),
                DIRECT,
                "26.3.1",
            ),
            Evidence(
                "ncdrone/rustane pull request #9 description (M3 Ultra 512GB, macOS 26.3.1)",
                "measured",
                "'ANE throughput degrades after ~100K cumulative doEvaluateDirectWithModel: calls (~150 "
                "steps at 600M). Added periodic kernel recompile to reset firmware state.'",
                ("m3",),
                DIRECT,
                "26.3.1",
            ),
        ),
        checked_by="anekit.runtime.ane.residency (every loaded kernel unloaded and reloaded after each "
        "100K evaluations of the process); the trainer's compile budget re-executes long runs every 100 "
        "compiles",
    ),
)

_OP_RULES = (
    Rule(
        "op.gelu-mode",
        "gelu written without its mode argument was refused by the in-memory compiler; write the mode "
        '(mode = string("EXACT") or "TANH_APPROXIMATION").',
        "op",
        "refused",
        (
            _orion("§10", "'Using gelu(x) in MIL text causes ANECCompile() FAILED'"),
            _guide_native("gelu"),
            Evidence(
                f"{PR40} docs/ANE_CHAINING_RESEARCH.md, 'Experiment X1'",
                "measured",
                'gelu(x=x16, mode="TANH_APPROXIMATION") verified against a reference (M4 Max, e5rt)',
                M4,
                E5RT,
                refutes=True,
            ),
        ),
        decision="Orion wrote gelu(x) with no mode; the book measured gelu native on M1, M2 and M5 and "
        "maderix ran it with a mode on M4 Max. anekit flags only a gelu without its mode: an error on M4 "
        "where the refusal was measured, no finding where gelu was measured native.",
    ),
    Rule(
        "op.concat-interleave",
        "concat written without its interleave argument was refused by the in-memory compiler; write "
        "interleave = false.",
        "op",
        "refused",
        (
            _orion("§1", "'ANECCompile() FAILED: err=() for any program using concat(axis=1, values=(...))'"),
            Evidence(
                f"{PR40} docs/ANE_INTERNALS.md",
                "reported",
                "'concat requires interleave param' (M4 Max)",
                M4,
                DIRECT,
            ),
            _guide_native("concat"),
        ),
        decision="Every hardware-run concat on the in-memory route (maderix training/stories_mil.h, M1 to "
        "M5) passes interleave: anekit flags a concat without it, an error on M4, no finding where the book "
        "measured concat native.",
    ),
    Rule(
        "op.concat-axis",
        "concat along an axis other than channels (1) or the last axis has no hardware precedent on the "
        "in-memory route.",
        "op",
        "no precedent",
        (
            Evidence(
                f"{MADERIX} training/training_dynamic/mil_dynamic.h",
                "reported",
                "concat runs on axes 1 and 3 only",
                routes=DIRECT,
            ),
        ),
    ),
    Rule(
        "op.sdpa-mask",
        "scaled_dot_product_attention ignores its attention mask: write attention as matmul, add the mask, "
        "softmax, matmul.",
        "op",
        "wrong numbers",
        (
            _orion(
                "§6 (also seen by maderix/ANE and ANEgpt)",
                "a causal mask compiles and runs but has no effect",
            ),
        ),
    ),
    Rule(
        "op.reduce-mean-rsqrt",
        "reduce_mean and rsqrt were reported rejected: use reduce_sum times 1/N, and pow(x, -0.5).",
        "op",
        "refused",
        (
            Evidence(
                RANE, "reference", "lists reduce_mean, rsqrt, reduce_sum and pow as rejected", routes=DIRECT
            ),
            Evidence(
                HOLLANCE_44, "reported", "'reduce_mean does NOT exist in raw MIL text format'", routes=DIRECT
            ),
            Evidence(
                f"{M0AT_README}, '4. No Reduction Ops'",
                "reported",
                "'ANE cannot execute reduce_mean, reduce_sum, rsqrt, or any element-wise reduction' (M5)",
                M5,
                DIRECT,
            ),
            _guide_native("reduce_mean and rsqrt"),
        ),
        decision="No public measurement refuses reduce_mean or rsqrt; the book measured both native on M1, "
        "M2 and M5 and m0at's reduce_sum claim is contradicted by maderix's M5 training. A warning on M3 and "
        "M4, where only reports speak; the rane list is a private reference with no public source.",
    ),
    Rule(
        "op.sqrt-after-reduce",
        "sqrt or rsqrt after a reduction was reported to fail to compile: use pow(x, -0.5).",
        "op",
        "refused",
        (
            Evidence(
                RUSTANE,
                "reported",
                "'ANE compiler fails on rsqrt/sqrt after reduce ops — use pow(-0.5)'",
                M4,
                DIRECT,
            ),
            Evidence(
                f"{GUIDE} part-1-machine/03-numerics.md",
                "measured",
                f"RMS normalisation (a mean of squares, then rsqrt) runs on the M1 ({GUIDE_COMPILED})",
                M1,
                COMPILED,
                refutes=True,
            ),
        ),
        decision="The book's only rule after a reduction is about square (the fused form needs the M2; the "
        "M1 gets the unfused form, no failure). A warning where only the report speaks.",
    ),
    Rule(
        "op.identity-output",
        "A function output produced by identity: hardware-run kernels end in their last compute op.",
        "op",
        "no precedent",
        (
            Evidence(
                HOLLANCE_44,
                "reported",
                "'ANE eval unstable on some hosts even for single-input identity kernels'",
                routes=DIRECT,
            ),
            _guide_native("identity ('aliases a cast or no-op')"),
        ),
        decision="Measured native on M1, M2 and M5: the report stands only where nothing was measured.",
    ),
    Rule(
        "op.identity-alone",
        "A function whose only op is identity (its output is its input) was refused by the compiler on the "
        "M5: give the engine an op that computes, or copy on the host.",
        "op",
        "refused",
        (
            Evidence(
                f"{FORGE} docs/capabilities.json (commit 067717a), entry 'identity' (arch-gated-negative, "
                "negative-confirmed; evidence 'docs/full_mil_vocabulary_sweep.json (klass=compile-walled)')",
                "measured",
                "'compiles-walled: the authored minimal MIL program fails ANECCompile "
                "(ane_e5rt_program_compile, mask=0x4) on M5'",
                M5,
                COMPILED,
            ),
            Evidence(
                f"{GUIDE_MATRIX} row 'identity'; {GUIDE} part-1-machine/04-capability-surface.md ('Every "
                "operation marked native in Appendix A was compiled and run on the M1', each in 'a graph "
                "that contains ONLY that operation')",
                "measured",
                f"identity native, 'Aliases a cast or no-op' ({GUIDE_COMPILED})",
                ("m1", "m2", "m5"),
                COMPILED,
                refutes=True,
            ),
        ),
        decision="Measured both ways on the M5, each side compiling identity alone through e5rt (ANEForge's "
        "sweep: refused; the book's one-op confirmation: native, its M5 column measured): a warning there "
        "naming both. On the M1 and M2 only the book's run speaks: the rule does not apply. On the M3 and "
        "M4, measured on neither side, a warning. Identity after a computing op (a function output) is "
        "op.identity-output's; anekit's kernels end in their last compute op.",
    ),
    Rule(
        "op.cast-m1-m2",
        "M1 and M2 were reported to lack cast (fp32 <-> fp16) on the in-memory route: their kernels take and "
        "return fp16.",
        "op",
        "refused",
        (
            Evidence(PR6, "measured", "'M1/M2 ANE can't do the cast op (fp32<->fp16)'", M1, DIRECT, "26.3"),
            Evidence(
                GUIDE_MATRIX,
                "measured",
                f"'fp16 to fp32 and bool native on the M1; cast to int32 is rejected on the M1' "
                f"({GUIDE_COMPILED})",
                ("m1", "m2"),
                COMPILED,
                refutes=True,
            ),
        ),
        chips=("m1", "m2"),
        decision="Measured both ways on the M1 (maderix pull request #6 on macOS 26.3, the book on the e5rt "
        "runtime): a warning on the M1; anekit's kernels take and return fp16.",
    ),
    Rule(
        "op.matmul-sdpa-m1",
        "matmul and scaled_dot_product_attention fail on M1 / M2 under macOS 26 on the in-memory route (they "
        "ran there under macOS 15).",
        "op",
        "refused",
        (
            Evidence(
                PR6,
                "measured",
                "'matmul and scaled_dot_product_attention ops still fail on M1/M2 -- these are M4+ ANE ops' "
                "(the attention tests do not run on the M1 Pro)",
                M1,
                DIRECT,
                "26.3",
            ),
            Evidence(
                PR6,
                "reported",
                "the same commit message names the M2 with the M1 ('fail on M1/M2'); it was tested on the M1 "
                "Pro only",
                ("m2",),
                DIRECT,
                "26.3",
            ),
            Evidence(
                f"{GUIDE_MATRIX} rows 'matmul', 'scaled_dot_product_attention'; {GUIDE} back-matter/"
                "methodology.md ('on macOS 14 or later (verified on macOS 26.5)')",
                "measured",
                "matmul ('Engine lane or convolution fold') and scaled_dot_product_attention native on the "
                "M1 and M2, each compiled alone and run through the e5rt runtime",
                ("m1", "m2"),
                E5RT,
                "26.5",
                refutes=True,
            ),
            Evidence(
                f"{MADERIX_COMMUNITY} (M1 Pro macOS 15.0, M1 Max 15.6.1: 'Training works via stories_mil.h')",
                "measured",
                "the training kernels, whose attention is matmul, train on M1 Pro and M1 Max",
                M1,
                DIRECT,
                "15.0, 15.6.1",
                refutes=True,
            ),
        ),
        chips=("m1", "m2"),
        decision="Split by macOS version on the in-memory route: measured failing on an M1 Pro under macOS "
        "26.3 (pull request #6, which names M1 and M2) and training on M1 Pro / Max under macOS 15. Under "
        "macOS 26 it is an error on the M1 and, by the policy (measured on the M1, nothing run against it on "
        "the M2 on this route), on the M2; under macOS 15 it does not apply; with no macOS named it is a "
        "warning on the M1 and the M2, both sides counted. The book's measurement (M1, M2, through e5rt, "
        "macOS 26.5) weighs on the e5rt route only: e5rt lowers a matmul its own way (the book's note: "
        "'Engine lane or convolution fold') before ANECCompile, the in-memory route hands the MIL as "
        "written, and on the in-memory route two hardware runs answer the question per macOS version. "
        "anekit's training route for M1 / M2 under macOS 26 uses no matmul.",
    ),
    Rule(
        "op.softmax-axis-size",
        "softmax over an axis whose size is not a power of two was reported refused (InvalidMILProgram).",
        "op",
        "refused",
        (
            Evidence(
                HOLLANCE_44,
                "reported",
                "'softmax on non-power-of-2 dimensions -> InvalidMILProgram'",
                routes=DIRECT,
            ),
            Evidence(
                f"{MADERIX} training/ane_classifier.h (train_large_ane)",
                "measured",
                "softmax over the 32000-wide vocabulary runs on the engine",
                M4,
                DIRECT,
                refutes=True,
            ),
        ),
        decision="Contradicted on M4; a warning where nothing was measured.",
    ),
    Rule(
        "op.reshape-noop",
        "A reshape to the shape it already has has no hardware precedent: leave it out.",
        "op",
        "no precedent",
        (
            Evidence(
                f"{MADERIX} training/stories_mil.h, training_dynamic/mil_dynamic.h",
                "reported",
                "no kernel has one",
                routes=DIRECT,
            ),
        ),
    ),
    Rule(
        "op.transposed-weight-matmul",
        "A large operand (both of its last two dimensions over 128) is never the transposed operand of "
        "matmul: transpose the activations instead, as the dynamic-matmul pattern does.",
        "op",
        "no precedent",
        (
            Evidence(
                f"{MADERIX} training/training_dynamic/mil_dynamic.h gen_dyn_matmul",
                "reported",
                "activations transposed, weights consumed as they are; transposes only on head-sized "
                "operands",
                routes=DIRECT,
            ),
        ),
    ),
    Rule(
        "op.matmul-const-weight",
        "Projections by constant weights are conv ops (1x1), not matmul with a constant operand.",
        "op",
        "slow",
        (
            Evidence(f"{LAWS} law 2", "seed law", "ios18.conv for every projection", routes=COREML),
            Evidence(
                f"{MADERIX} training/stories_mil.h", "reported", "bakes weights as 1x1 convs", routes=DIRECT
            ),
        ),
    ),
    Rule(
        "conv.channels-512-m3",
        "On the M3 only 512-channel convolutions compiled in one benchmark (on macOS 15.7.4); the M3 Ultra "
        "trained with 768 channels on macOS 26.3.",
        "op",
        "refused",
        (
            Evidence(
                f"{MADERIX_COMMUNITY} (M3 Pro, macOS 15.7.4); {MADERIX} issue #42 (M3 Ultra, macOS 15.7.4)",
                "measured",
                "'Only ch=512 compiles. 52 values tested.'; '512ch is the only valid channel count'",
                ("m3",),
                DIRECT,
                "15.7.4",
            ),
            Evidence(
                f"{MADERIX} pull request #28 benchmarks/submissions/m3-ultra-mac-studio-2026-03-03 (raw/"
                "system_info.txt: macOS 26.3; raw/inmem_peak.log, raw/train_large.log)",
                "measured",
                "on the M3 Ultra the inmem_peak convs of 256 and 384 channels ran (64x / 128x conv 256ch and "
                "384ch sp64) and the static pipeline's 768-channel conv kernels trained Stories110M",
                ("m3",),
                DIRECT,
                "26.3",
                refutes=True,
            ),
        ),
        chips=("m3",),
        decision="Measured both ways on the M3, split by macOS version (the M3 Ultra on both sides): under "
        "macOS 15 an error (no run against it there), under macOS 26 it does not apply, with no version "
        "named a warning.",
    ),
    Rule(
        "op.square-activation-width-m5",
        "On the M5 a square op followed by a nonlinearity fails to compile when the width modulo 128 exceeds "
        "64; write mul(x, x).",
        "op",
        "refused",
        (
            Evidence(
                f"{FORGE} docs/developer/capabilities-and-targets.md, 'square_opcode_tiling'",
                "measured",
                "'the native square opcode fused with a following nonlinearity fails ANECCompile when "
                "(Width % 128) > 64' (M5 HWX code generation)",
                ("m5",),
                COMPILED,
            ),
        ),
        chips=("m5",),
    ),
    Rule(
        "op.layer-norm-one-affine",
        "On M1 and M2 layer_norm fails to compile when exactly one of its affine terms is live (gamma not "
        "all ones or beta not all zeros) and the other folds away.",
        "op",
        "refused",
        (
            Evidence(
                f"{FORGE} bench/layer_norm_compile_probe.py (commit 0ff05de; issue #149)",
                "measured",
                "'layer_norm compile-fails whenever EXACTLY ONE affine term is non-constant (one folded, one "
                "live). Uniform -- no shape or seed dependence' (M1 Max, M2 Pro; the M5 passes)",
                ("m1", "m2"),
                COMPILED,
            ),
        ),
        chips=("m1", "m2"),
        checked_by="anekit.rules.checks (from the const values, inline or in the weight files given)",
    ),
    Rule(
        "conv.input-channels-refused",
        "A conv with 32000 input channels was refused.",
        "op",
        "refused",
        (
            Evidence(
                f"{MADERIX} training/ane_classifier.h, gen_classifier_bwd",
                "reported",
                "'ANE rejects conv with 32000 input channels' (the repository's chip: M4)",
                M4,
                DIRECT,
            ),
        ),
    ),
    Rule(
        "conv.input-channels-unproven",
        "A conv with more than 14336 input channels has no hardware precedent.",
        "op",
        "no precedent",
        (
            Evidence(
                f"{M0AT_README}, 'Architecture: 4 Programs Per Layer' (mistral/ane_mil_gen_mistral.h)",
                "measured",
                "the fused FFN's down projection takes 14336 input channels; Q and Wo take 4096 (M5)",
                M5,
                DIRECT,
                "26.3",
            ),
            Evidence(
                f"{MADERIX} pull request #25 docs/BENCHMARK_RESULTS.md (Mac16,5, macOS 26.2)",
                "measured",
                "square 1x1 convs up to 8192 channels ran (8192ch x 32sp: 4.195 ms)",
                M4,
                DIRECT,
                "26.2",
            ),
        ),
    ),
    Rule(
        "numerics.fp16-sum-of-squares",
        "A sum of squares over N elements in fp16 overflows to inf once RMS(x) > sqrt(65504 / N) (about 9 "
        "for N = 768), and RMSNorm then normalises to zeros: scale x by at most 1/sqrt(N) first, or divide "
        "it by its largest |x| (reduce_max of abs). Checked for N >= 256 (an RMS over 16 to overflow).",
        "op",
        "hazard",
        (
            Evidence(
                f"{GUIDE} part-1-machine/03-numerics.md, 'Saturation hazard'",
                "measured",
                "'A reduce-sum rounds to 65504 first and then overflows' (M1)",
                M1,
                ROUTES,
            ),
            Evidence(
                f"IEEE 754 binary16 applied to the RMSNorm of {MADERIX} training/stories_mil.h",
                "derived",
                "reduce_sum of x*x in fp16 exceeds 65504 once RMS(x) > sqrt(65504 / N)",
            ),
        ),
    ),
    Rule(
        "io.rank4-batch1",
        "Every function input and output of a kernel on the in-memory route is a rank-4 tensor with batch 1 "
        "([1, C, H, W]; [1, C, 1, S] for the direct kernels).",
        "tensor",
        "no precedent",
        (
            Evidence(
                f"every kernel of {MADERIX}, {ORION}, {M0AT} and {RUSTANE}",
                "reported",
                "function inputs and outputs are [1, C, 1, S] surfaces",
                routes=DIRECT,
            ),
        ),
    ),
    Rule(
        "tensor.channels-multiple-64",
        "Channel counts under 64 were said to fail silently; no measurement of it is public.",
        "tensor",
        "wrong numbers",
        (
            Evidence(
                ESPRESSO_DOCS,
                "reported",
                "advice only: 'Keep channel dimensions as multiples of 64 where possible' (M3 Max); no "
                "public measurement of channels below 64 failing silently was found",
                ("m3",),
                DIRECT,
            ),
            Evidence(
                f"{MADERIX} training/test_ane_sdpa5.m, 'Test 1: no mask'",
                "measured",
                "scaled_dot_product_attention on [1, 12, 8, 64] inputs (12 channels) matched the CPU (M4)",
                M4,
                DIRECT,
                refutes=True,
            ),
        ),
        decision="An unmeasured claim: a warning on what it touches, except where a hardware-run program "
        "with fewer channels ran (M4).",
    ),
    Rule(
        "dialect.m1-m2",
        "M1 (and, by its author's report, M2) needed the older program(1.0) / <ios16> form with "
        "tensor<string, "
        "[]> scalars on macOS 26; the same machines ran program(1.3) / <ios18> on macOS 15. Ops newer than "
        "iOS 16 cannot be written in the older form.",
        "program",
        "refused",
        (
            Evidence(
                PR6,
                "measured",
                "program(1.3) / ios18 failed; the kernels ran as program(1.0) / ios16",
                M1,
                DIRECT,
                "26.3",
            ),
            Evidence(
                f"{MADERIX_REPORT}, 'Cross-Generation MIL Compatibility'",
                "measured",
                "'program(1.3) / ios18  PARTIAL' on M1",
                M1,
                DIRECT,
            ),
            Evidence(
                f"{MADERIX_COMMUNITY} (M1 Pro macOS 15.0, M1 Max macOS 15.6.1)",
                "measured",
                "'Training works via stories_mil.h', whose kernels are program(1.3) / ios18",
                M1,
                DIRECT,
                "15",
                refutes=True,
            ),
        ),
        chips=("m1", "m2"),
        checked_by="anekit.runtime.ane (the dialect trial: anekit.engine.trials); anekit.rules.checks (ops "
        "the older form cannot write)",
        decision="Split by macOS version: the backend tries the dialects in the order with the most hardware "
        "runs for its chip and macOS and remembers what compiled; lint warns where the older form cannot be "
        "written.",
    ),
)

_PACKAGE_RULES = (
    Rule(
        "package.rank4-shape",
        "Every input and output of an ANE-bound CoreML model is [1, C, T, 1].",
        "package",
        "falls back",
        (Evidence(f"{LAWS} law 1", "seed law", "ANE-bound I/O is [1, C, T, 1]", routes=COREML),),
        checked_by="anekit.rules.checks (function I/O of a CoreML package)",
    ),
    Rule(
        "quant.int8-per-tensor",
        "int8 per-tensor weights keep every conv on the engine; int4 per-block weights make every conv fall "
        "off to the CPU in small shards.",
        "quantization",
        "falls back",
        (Evidence(f"{LAWS} law 3", "seed law", "int4 per-block convs fall off the engine", routes=COREML),),
    ),
    Rule(
        "package.shard-size",
        "A package over ~250 MB of weights fails to compile for the engine (ANEF error -14); over ~1 GB no "
        "quantization helps.",
        "package",
        "falls back",
        (Evidence(f"{LAWS} law 4", "seed law", "validated ceiling 223 MB", routes=COREML),),
        checked_by="anekit.rules.checks.check_package (anekit lint MODEL.mlpackage)",
    ),
    Rule(
        "package.layers-per-shard",
        "Large models go 1-3 transformer layers per shard, embedding and classifier on their own.",
        "package",
        "slow",
        (Evidence(f"{LAWS} law 5", "seed law", "1-3 layers per shard", routes=COREML),),
        checked_by="the export's shard planner",
    ),
    Rule(
        "package.residency",
        "Compiling is not proof of placement: only MLComputePlan shows each conv on the Neural Engine.",
        "process",
        "falls back",
        (Evidence(f"{LAWS} law 6", "seed law", "MLComputePlan shows placement", routes=COREML),),
        checked_by="the export's residency check (macOS only)",
    ),
    Rule(
        "package.kv-state",
        "Autoregressive decode keeps its KV cache in MLState, not in inputs and outputs.",
        "package",
        "slow",
        (Evidence(f"{LAWS} law 8", "seed law", "KV cache in MLState", routes=COREML),),
        checked_by="the model export (states)",
    ),
)

GUIDE_LLM = "sbryngelson/ane-guide part-4-workloads/14-llm-case-study.md"
FORGE_PR45 = (
    "sbryngelson/ANEForge pull request #45 ('segmented decode: run large models past the ~2GB ANE program "
    "ceiling')"
)
COREMLTOOLS_PR2593 = "apple/coremltools pull request #2593 ('ANE can now do 2gb')"
WEIGHT_CEILING_BYTES = 2**31  # the compiler's stated maximum weight file (2147483648 bytes)

_GENERATION_RULES = (
    Rule(
        "program.state-ops-direct",
        "A program with read_state / write_state ops or state<> inputs is refused on the direct route: the "
        "front end parses them, the backend's conversion to the engine program rejects them (no state "
        "object to bind). A KV cache is a plain input surface the host writes.",
        "program",
        "refused",
        (
            Evidence(
                f"{GUIDE_LLM}, 'Two residency mechanisms'",
                "measured",
                "'On the unentitled runtime path that type parses but does not reach the engine. The front "
                "end recognizes the state operations, but the backend rejects them during the conversion to "
                "the engine program, because the read-state has no state object to bind to'",
                routes=COMPILED,
            ),
        ),
        checked_by="anekit.engine.generation (the direct route's generation kernels hold no state ops)",
    ),
    Rule(
        "program.weight-ceiling",
        "One program's baked weights are at most 2 GiB (2147483648 bytes): a larger weight file fails to "
        "compile, so a model past it is segmented into several programs.",
        "program",
        "refused",
        (
            Evidence(
                FORGE_PR45,
                "measured",
                "'A single compiled ANE program holds only ~2 GB of baked-constant weights (measured: ~1.5 "
                'GB compiles, ~3.4 GB fails with Espresso "Not implemented")\'; Qwen3-8B decodes in nine '
                "segments",
                routes=COMPILED,
            ),
            Evidence(
                COREMLTOOLS_PR2593,
                "reported",
                "'ane: Weight file size (2525476480 bytes) exceeds the maximum (2147483648 bytes)'",
            ),
        ),
        checked_by="anekit.generate.plan (segments the layers so no kernel's weights exceed the ceiling)",
        decision="The rule package.shard-size's ~250 MB is a seed law (reference ane-empirical-laws.md law "
        "4) for a CoreML package on the coreml route; the 2 GiB ceiling is measured on the compiled routes "
        "(ANEForge) and stated by the compiler's own message (coremltools). DESIGN.md 'Evidence': "
        "measurements outrank the reference documents, so the direct route's generation kernels are "
        "segmented at 2 GiB of weights per program, and a CoreML package keeps its 250 MB shards.",
    ),
)

_ALL: tuple[Rule, ...] = (
    *_SURFACE_RULES,
    *_WEIGHT_RULES,
    *_PROCESS_RULES,
    *_OP_RULES,
    *OP_RULES,
    *EXTENT_RULES,
    *_PACKAGE_RULES,
    *_GENERATION_RULES,
)
RULES: dict[str, Rule] = {r.id: r for r in _ALL}
if len(RULES) != len(_ALL):
    raise ValueError("[rules] duplicate rule ids in the book")
CHIPS = GENERATIONS


class UnknownRule(AnekitError, KeyError):
    """A rule id that the book does not have."""

    def __str__(self) -> str:
        return str(self.args[0])


def rule(rule_id: str) -> Rule:
    """The rule with this id."""
    try:
        return RULES[rule_id]
    except KeyError:
        raise UnknownRule(f"[rules] no rule '{rule_id}' (known: {', '.join(RULES)})") from None

"""Programs measured to fail on real Neural Engines: refused by the compiler, failing at evaluation, or
computing wrong numbers (see the package docstring). ``observed`` says which, ``source`` where."""

from __future__ import annotations

import numpy as np

from tests.engine_corpus import Case
from tests.engine_corpus._programs import case
from tests.engine_corpus.known_good import (
    ANEFORGE,
    APPENDIX_A,
    CATALOG,
    CENSUS,
    EMITTER,
    GUIDE,
    MADERIX,
    ORION,
    PEAK,
    PR6,
    REPORT,
    SWEEP,
)

# -- the direct route -------------------------------------------------------------------------------
PR6_MESSAGE = (
    'its commit message: \'The MIL scalar types used shorthand syntax (string("x"), int32(1)) that only works '
    "on M4' and 'M1/M2 ANE doesn't support the cast op (fp32<->fp16), so on first compile failure it retries "
    "with native fp16 inputs/outputs'"
)
DIRECT_CASES: tuple[Case, ...] = (
    case(
        "maderix-sdpa5-blob-mask",
        ("m4",),
        "direct",
        f"{MADERIX} training/test_ane_sdpa5.m 'Test 3: BLOBFILE causal mask' (scaled_dot_product_attention with "
        "attn_mask = a [1, 1, 8, 8] causal-mask const; HEADS 12, SEQ 8, HD 64; the file's header: 'Debug: why "
        "causal mask doesn't apply. Try different approaches.'); README.md Limitations; "
        f"{ORION} docs/ane_constraints.md section 6 ('Confirmed', T022, M4 Max)",
        "wrong numbers: compiles and evaluates, but the mask has no effect - 'ANE hardware ignores attn_mask in "
        "SDPA ops' (README.md), 'Attention scores are computed as if no mask exists' (Orion)",
    ),
    case(
        "orion-gelu-op",
        ("m4",),
        "direct",
        f"{ORION} docs/ane_constraints.md section 10 ('Using gelu(x) in MIL text causes ANECCompile() FAILED', "
        "T021) and commit d2b4924 ('Key finding: gelu MIL op not available'), M4 Max. The failing text was not "
        "committed: written here as the one gelu op in the fp32-cast harness of tests/test_mil_builder.m "
        "(CH 256, SP 64), where the committed orion_mil_gelu() decomposition (orion-test-gelu-tanh) runs",
        "ANECCompile() FAILED",
    ),
    case(
        "orion-hello-mil-4x4",
        ("m4",),
        "direct",
        f"{ORION} experiments/hello_mil.m hello_mil_text() at CH 4, SP 4 ([1, 4, 1, 4]); commit 2002a50 (T008) "
        "CHECKPOINT.md: 'First attempt with [1,4,1,4] tensors failed (ANE rejects small tensors at eval time)', "
        "docs/ane_api_reference.md 'Minimum tensor size: Very small tensors (e.g., [1,4,1,4]) fail at "
        "evaluation', M4 Max. The first attempt's exact text was not committed; this is the committed "
        "generator at 4x4",
        "compiled, then failed at evaluation",
    ),
    case(
        "maderix-weight-reload-64ch-on-m1",
        ("m1",),
        "direct",
        f"{MADERIX} training/test_weight_reload.m gen_mil(64, 32) (program(1.3), shorthand scalars, fp32 I/O with "
        f"casts), the text {PR6} rewrote for the M1; {PR6_MESSAGE}. The same program runs on the M5 (known_good)",
        "ANE compile failed on an M1 Pro (shorthand / program(1.3) syntax and the fp32<->fp16 cast, per PR #6)",
        program_name="maderix-weight-reload-64ch",
        contested=("op.cast-m1-m2",),
        macos="26.3",
    ),
    case(
        "maderix-pr6-weight-reload-64ch-cast",
        ("m1",),
        "direct",
        f"{PR6} training/test_weight_reload.m gen_mil() without g_fp16_io: program(1.0) / <ios16> verbose form, "
        f"fp32 input cast to fp16 and back; {PR6_MESSAGE}; the test prints '[ANE] fp32 compile failed, retrying "
        "with fp16 I/O (M1/M2 fallback)'",
        "compile failed on an M1 Pro: the cast op (fp32 <-> fp16); the fp16-I/O text compiles (known_good)",
        contested=("op.cast-m1-m2",),
        macos="26.3",
    ),
    case(
        "maderix-pr6-sdpa5-no-mask-ios16",
        ("m1",),
        "direct",
        f"{PR6} training/test_ane_sdpa5.m 'Test 1: no mask' in the program(1.0) / <ios16> form (scaled_dot_product"
        "_attention, HEADS 12, SEQ 8, HD 64); the commit message: 'Note: matmul and scaled_dot_product_attention "
        "ops still fail on M1/M2 - these are M4+ ANE ops. The attention tests (test_ane_causal_attn, "
        "test_ane_sdpa5, test_full_fused attention part) require M4 hardware.' (scaled_dot_product_attention is "
        "not an iOS16 op either)",
        "failed on an M1 Pro under macOS 26.3 (the attention tests do not run there); M1 Pro / Max trained "
        "with matmul attention under macOS 15 (known_good 'maderix-stories-sdpa-fwd-taps-m1-macos15')",
        contested=("op.matmul-sdpa-m1",),
        macos="26.3",
    ),
    case(
        "maderix-inmem-peak-256ch-64x-on-m1",
        ("m1",),
        "direct",
        f"{PEAK}; config {{256, 64, 64}}; {REPORT} 'Peak ANE Throughput': M1 Pro and M1 Max 'FAIL (MIL compat "
        "issue)', 'Cross-Generation MIL Compatibility': 'Single-blob weights FAIL' and 'BLOBFILE offset refs "
        "FAIL' on M1",
        "M1 Pro / M1 Max: the benchmark fails (no TFLOPS)",
        program_name="maderix-inmem-peak-256ch-64x",
    ),
    case(
        "maderix-inmem-peak-256ch-64x-on-m3",
        ("m3",),
        "direct",
        f"{PEAK}; config {{256, 64, 64}}; {MADERIX} benchmarks/community_results.json M3 Pro (D-Ogi, macOS "
        "15.7.4): 'Only ch=512 compiles. 52 values tested.' (the report: 'Only ch=512 compiles - 52 channel "
        "values tested (1-4096), only 512 accepted'); the M3 Ultra trained 768-channel kernels on macOS 26.3",
        "M3 Pro: a channel count other than 512 does not compile",
        program_name="maderix-inmem-peak-256ch-64x",
        contested=("conv.channels-512-m3",),
    ),
    case(
        "maderix-inmem-peak-512ch-32x-on-m1",
        ("m1",),
        "direct",
        f"{PEAK}; config {{512, 64, 32}}; {REPORT} 'Peak ANE Throughput': M1 Pro and M1 Max 'FAIL (MIL compat "
        "issue)'; 'Key Findings - M1/M1 Pro/M1 Max: Standalone benchmarks fail - ane_mil_gen.h single-blob "
        "weight format rejected'. Runs on M3 Pro, M4 Pro / Max and M5 (known_good)",
        "the benchmark fails on M1 Pro and M1 Max (several blobs in one weight file, referred to by offset)",
        program_name="maderix-inmem-peak-512ch-32x",
    ),
)

# -- the e5rt route ----------------------------------------------------------------------------------
NO_PATH = (
    f"{APPENDIX_A}: 'No path: rejected on every family from the M1 through the M5' (the M1, M2 and M5 columns are "
    "measured on silicon)"
)


def _no_path(op: str, sweep: bool = True, note: str = "") -> Case:
    sweep_part = (
        f"; {SWEEP} op '{op}': compile false, klass not-implemented-on-ANE ('ane_e5rt_program_compile failed "
        "(... mask=0x4)')"
        if sweep
        else "; not in the M5 sweep"
    )
    return case(
        f"aneforge-{op.replace('_', '-')}",
        ("m1", "m2", "m5"),
        "e5rt",
        f"{NO_PATH}, row '{op}'{sweep_part}; the one-op program is written in the style of {EMITTER} (its shapes "
        "chosen here)" + (f"; {note}" if note else ""),
        "refused by the compiler: 'Some ops are not supported on any of the specified backends' / "
        "ane_e5rt_program_compile failed" + ("" if sweep else " (appendix A)"),
    )


def _rng_gamma(n: int) -> np.ndarray:
    rng = np.random.default_rng(13)  # bench/layer_norm_compile_probe.py: gamma = N(0, 1) * 0.1 + 1.0, seed 13
    return (rng.standard_normal(n).astype(np.float32) * 0.1 + 1.0).astype(np.float16).reshape(1, n, 1, 1)


E5RT_CASES: tuple[Case, ...] = (
    *(_no_path(op) for op in ("tan", "asin", "acos", "atanh", "sinh", "cosh")),
    *(_no_path(op, sweep=False) for op in ("asinh", "acosh")),
    _no_path("mod"),
    *(
        _no_path(
            op, note="the op's inputs come from comparisons and its result feeds select (bool I/O is refused)"
        )
        for op in ("logical_and", "logical_or", "logical_xor")
    ),
    _no_path("reduce_prod"),
    _no_path("shape", note="its int32 result is cast to fp16 for the output"),
    _no_path("one_hot", note="const indices, added to the fp16 input"),
    _no_path("scatter", note="const indices"),
    _no_path("scatter_nd", note="const indices"),
    _no_path("band_part"),
    _no_path("non_zero"),
    _no_path("reverse_sequence", note="const lengths"),
    _no_path("sliding_windows"),
    _no_path("random_normal", note="its result is added to the input"),
    *(
        case(
            f"aneforge-{op}-on-m1-m2",
            ("m1", "m2"),
            "e5rt",
            f"{APPENDIX_A} row '{op}': 'Family-gated' on M1 and M2, 'Native from the M3; the M1 and M2 use a host "
            f"polynomial'; {CATALOG} row '{op}': 'F4 trig, native A15+ only (REJECTED on M1/A14 - silicon-measured)'; "
            f"{GUIDE} part-1-machine/04-capability-surface.md: 'the M1 and the A14 reject them'. Runs on the M5 "
            "(known_good)",
            "refused by the compiler on M1 and M2 (A14)",
            program_name=f"aneforge-{op}",
        )
        for op in ("sin", "cos")
    ),
    case(
        "aneforge-cumsum",
        ("m5",),
        "e5rt",
        f"{CENSUS} entry 'cumsum' (arch-gated-negative, negative-confirmed): 'the native MIL cumsum op is "
        "unimplemented on the ANE backend - a native-op gap'; "
        f"{CATALOG} row 'cumsum': 'The standard MIL cumsum op is unimplemented'; {APPENDIX_A} row 'cumsum': "
        "'Native through a curated runtime path, not the standard compile path'. The one-op program is written "
        f"in the style of {EMITTER} (its shape chosen here); the curated path's matmul runs (known_good "
        "'aneforge-cumsum-triangular-matmul')",
        "refused: the MIL op has no implementation on the engine's backend",
    ),
    case(
        "aneforge-identity-on-m5",
        ("m5",),
        "e5rt",
        f"{CENSUS} entry 'identity' (arch-gated-negative, evidence 'docs/full_mil_vocabulary_sweep.json "
        "(klass=compile-walled)'): 'the authored minimal MIL program fails ANECCompile (ane_e5rt_program_"
        f"compile, mask=0x4) on M5'; against it, {APPENDIX_A} row 'identity': Native, its M5 column measured, "
        "each op confirmed alone (known_good 'aneforge-identity' on the M1 and M2)",
        "ANECCompile fails on the M5 (one-op identity program)",
        program_name="aneforge-identity",
        contested=("op.identity-alone",),
    ),
    case(
        "aneforge-topk",
        ("m1",),
        "e5rt",
        f"{CATALOG} row 'topk': 'rank/sort bridge, A14+ (_OP_FLOOR); bridge validator callable on M1 but "
        f"codegen-rejected (measured)'; {APPENDIX_A} row 'topk': Family-gated on M1; {GUIDE} part-1-machine/"
        "04-capability-surface.md 'On the M1 the top-k, sort, and dynamic-slice validators are all callable, yet "
        "the code generator rejects all three'",
        "rejected by the code generator on the M1",
    ),
    case(
        "aneforge-reduce-argmin",
        ("m1", "m2"),
        "e5rt",
        f"{APPENDIX_A} row 'reduce_argmin': Bridge on M1 and M2, 'the intermediate-language route is gated to the "
        f"M3'; {CATALOG} row 'reduce_argmin': 'M1/M2 walled on the MIL route (HAL 0x4f2, A15+)'; the int32 "
        "indices are cast to fp16 for the output",
        "refused on the MIL (e5rt) route on M1 and M2",
    ),
    case(
        "aneforge-cast-int32",
        ("m1",),
        "e5rt",
        f"{CATALOG} row 'cast': 'cast(->int32) is walled on M1 (empirically confirmed)'; {APPENDIX_A} row 'cast': "
        f"'cast to int32 is rejected on the M1'; {GUIDE} part-5-practice/17-model-design-rules.md 'The M1 "
        "rejects a cast to int32'",
        "refused by the compiler on the M1",
    ),
    case(
        "aneforge-conv-1x14",
        ("m1",),
        "e5rt",
        f"program text as {EMITTER} _e_conv writes it, kernel width 14; {GUIDE} part-5-practice/"
        "17-model-design-rules.md 'On the M1 the fp16 convolution kernel width is bounded at 13: a kernel of "
        "width 14 rejects' (measured by sweeping until compile flipped); part-1-machine/04-capability-surface.md "
        "'an fp16 kernel of width 14 or 15 still rejects at lowering'",
        "rejected at lowering on the M1 (fp16 kernel width above 13)",
    ),
    case(
        "aneforge-conv-1x16",
        ("m1", "m5"),
        "e5rt",
        f"program text as {EMITTER} _e_conv writes it, kernel 1x16; M5: {ANEFORGE} docs/developer/"
        "capabilities-and-targets.md 'conv_kernel_ge16 - conv ... is capped at kernel K<=15 on M5: a 1xK kernel "
        "with K>=16 fails ANECCompile' (section 'validator accepts schema, M5 HWX codegen fails'); M1: "
        f"{GUIDE} part-1-machine/04-capability-surface.md table 'conv kernel width kW = 16: reject' (and width 14 "
        "already rejects at lowering on the M1)",
        "ANECCompile fails (M5); rejected on the M1",
    ),
    case(
        "aneforge-conv-3x16",
        ("m1",),
        "e5rt",
        f"program text as {EMITTER} _e_conv writes it, kernel height 3, width 16; {GUIDE} part-1-machine/"
        "04-capability-surface.md 'a 16x3 kernel compiles and a 3x16 kernel does not' (M1, compile-only); "
        f"{ANEFORGE} docs/developer/op-quirks.md 'verified: 16x3 compiles, 3x16 does not'",
        "refused by the compiler (kernel width 16)",
    ),
    case(
        "aneforge-relu-width-16385",
        ("m1", "m2"),
        "e5rt",
        f"{GUIDE} part-5-practice/17-model-design-rules.md 'Width 16384 compiles and 16385 rejects' (measured on "
        f"the M1); part-1-machine/04-capability-surface.md 'any axis = 16385: reject'; {ANEFORGE} docs/"
        "cross-chip.md 'The A13 row is now measured on the live M1 and equals A14 exactly (16385 W/H ... "
        "reject)'. The M5's cap is 65536 (appendix A)",
        "rejected at compile time: 'exceeds ANE family 2's max dimension 16384'",
    ),
    case(
        "aneforge-relu-channels-65537",
        ("m1", "m2"),
        "e5rt",
        f"{GUIDE} part-5-practice/17-model-design-rules.md 'Channel axis 65536: 65537 rejects at compile' (M1); "
        f"{ANEFORGE} docs/cross-chip.md '(16385 W/H, 65537 C both reject)' on A13 and A14",
        "rejected at compile time",
    ),
    case(
        "aneforge-argmax-width-2049",
        ("m1",),
        "e5rt",
        f"{GUIDE} part-5-practice/17-model-design-rules.md 'The arg-min and arg-max operations reduce ... height "
        "or width at 2048 the same way; 2049 rejects' and table 'Arg-min/arg-max reduction axis 2048: 2049 "
        "rejects for fp16 accuracy' (measured on the M1)",
        "rejected at compile time (reduced axis above 2048)",
    ),
    case(
        "aneforge-bmm-rank5",
        ("m1",),
        "e5rt",
        f"program text as {EMITTER} _e_bmm writes it, rank-5 operands; {GUIDE} part-1-machine/"
        "04-capability-surface.md 'a rank-5 batched matrix multiply builds yet the on-device matrix-multiply "
        "backend rejects it' (table: 'batched matmul rank 5 | reject | on-device'), measured compile-only on "
        "the M1",
        "rejected by the on-device compiler: 'Some ops are not supported on any of the specified backends'",
    ),
    case(
        "aneforge-reshape-rank6",
        ("m5",),
        "e5rt",
        f"{ANEFORGE} aneforge/_capabilities.py _BRIDGE_ROUTES 'space_to_channel': 'ANECCompile rejects reshape "
        "rank>5 ('Rank of the shape parameter must be between 0 and 5'). Confirmed on-device - the rank-5 wall "
        "(see arch-gated rank5_transpose_matmul)', listed with the 'M5 HWX codegen fails' walls; docs/developer/"
        f"op-quirks.md 'A rank-6+ tensor (reshape/stack/expand_dims past 5D) fails ANECCompile'; {GUIDE} "
        "part-1-machine/04-capability-surface.md 'tensor rank 6 | reject' (M1, by its frontend)",
        "ANECCompile: 'Rank of the shape parameter must be between 0 and 5'",
    ),
    case(
        "aneforge-layer-norm-64x512-asymmetric-affine",
        ("m1", "m2"),
        "e5rt",
        f"{EMITTER} _e_layer_norm at [64, 512], the same text as known_good 'aneforge-layer-norm-64x512', but with "
        "gamma random (N(0, 1) * 0.1 + 1, seed 13) and beta all zeros (the probe's 'rz' column); "
        f"{ANEFORGE} bench/layer_norm_compile_probe.py (commit 0ff05de; issue #149): 'M1 / M2 (compile stage): "
        "layer_norm compile-fails whenever EXACTLY ONE affine term is non-constant (one folded, one live). "
        "Uniform -- no shape or seed dependence', verified on M1 Max and M2 Pro (M5 passes this configuration)",
        "compile fails (C-FAIL) on M1 Max and M2 Pro; the program text alone does not show it, the weights do",
        program_name="aneforge-layer-norm-64x512",
        values={
            ("@model_path/weights.bin", 64): _rng_gamma(512),
            ("@model_path/weights.bin", 1152): np.zeros((1, 512, 1, 1), np.float16),
        },
    ),
    case(
        "aneforge-dynamic-conv-batch2",
        ("m1",),
        "e5rt",
        f"program text as {EMITTER} _e_dynamic_conv writes it (weight = the second program input), batch 2; "
        f"{GUIDE} part-5-practice/19-pitfalls-and-limits.md 'At a batch of two or more the same program crashes "
        "the compiler service ... batch one passes, batch two fails, every time' (M1); "
        f"{ANEFORGE} docs/developer/op-quirks.md 'dynamic_conv ... batch must be 1'",
        "the compiler service crashes mid-compile ('lost helper application'); batch 1 runs (known_good)",
    ),
    case(
        "aneforge-square-sigmoid-width96",
        ("m5",),
        "e5rt",
        f"{ANEFORGE} docs/developer/capabilities-and-targets.md 'square_opcode_tiling - the native square opcode "
        "fused with a following nonlinearity fails ANECCompile when (Width % 128) > 64' (section 'validator "
        f"accepts schema, M5 HWX codegen fails'); {EMITTER} _e_square emits mul(x, x) instead for this reason",
        "ANECCompile fails (width 96: 96 % 128 > 64)",
    ),
)

KNOWN_REFUSED: tuple[Case, ...] = tuple(c for c in (*DIRECT_CASES, *E5RT_CASES) if not c.contested)
KNOWN_CONTESTED: tuple[Case, ...] = tuple(c for c in (*DIRECT_CASES, *E5RT_CASES) if c.contested)

_names = [c.name for c in (*KNOWN_REFUSED, *KNOWN_CONTESTED)]
assert len(set(_names)) == len(_names), "duplicate case names"

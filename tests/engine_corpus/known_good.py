"""Programs public hardware-run projects compiled and ran on real Neural Engines (see the package docstring)."""

from __future__ import annotations

import numpy as np

from tests.engine_corpus import Case
from tests.engine_corpus._programs import case

# -- sources ----------------------------------------------------------------------------------------
MADERIX = "maderix/ANE (snapshot d91c984)"
REPORT = f"{MADERIX} benchmarks/ANE_BENCHMARK_REPORT.md"
PR6 = f"{MADERIX} pull request #6 (commit 709b602, 'Tested on M1 Pro, macOS 26.3')"
ORION = "mechramc/Orion (snapshot 65372ff)"
GUIDE = "sbryngelson/ane-guide (snapshot 9eb1afe)"
APPENDIX_A = f"{GUIDE} appendices/a-op-device-matrix.md"
ANEFORGE = "sbryngelson/ANEForge"
EMITTER = f"{ANEFORGE} aneforge/_compile.py (commit 03eea5a)"
SWEEP = f"{ANEFORGE} aneforge/full_mil_vocabulary_sweep.json (commit 067717a; an M5 sweep, aneforge/_capabilities.py)"
CATALOG = f"{ANEFORGE} docs/op-catalog.md (commit 669c897)"
CENSUS = f"{ANEFORGE} docs/capabilities.json (commit 067717a; each op's entry records its sweep result)"
COMMUNITY = f"{MADERIX} benchmarks/community_results.json"

# -- maderix/ANE training kernels -------------------------------------------------------------------
STORIES_DIMS = (
    "generated here at DIM 288, HIDDEN 768, HEADS 6 (HD 48), SEQ 64 (the project ran Stories110M: DIM 768, "
    "HIDDEN 2048, HEADS 12, SEQ 256)"
)
STATIC_CHIPS = (
    f"{REPORT} 'Training Performance (Static Pipeline)': M3 Ultra 91 ms/step (the reference platform), "
    "M4 Pro 69-73, M4 Max 64, M5 101-120. The same table lists M1 Pro / M1 Max, but its 'Cross-Generation MIL "
    f"Compatibility' marks program(1.3) / ios18 PARTIAL on M1 and {PR6} switched M1 to program(1.0) / "
    "<ios16>, so M1 is not claimed for this text"
)
STATIC_OBSERVED = (
    "compiled with baked weights, loaded and evaluated every step of training/train_large.m (Stories110M "
    "trained, static pipeline)"
)


def _stories(name: str, fn: str, dims: str = STORIES_DIMS) -> Case:
    return case(
        name,
        ("m3", "m4", "m5"),
        "direct",
        f"{MADERIX} training/stories_mil.h {fn}(), compiled by training/train_large.m; {dims}; chips: "
        f"{STATIC_CHIPS}",
        STATIC_OBSERVED,
    )


DYN_DIMS = (
    "generated here at DIM 288, HIDDEN 768, HEADS 6, HD 48, SEQ 64 (the project ran Stories110M and "
    "Qwen3-0.6B, SEQ 256)"
)
DYN_CHIPS = (
    f"{MADERIX} README.md 'Training throughput (M4)': Stories110M 91 ms/step, Qwen3-0.6B 412 ms/step, dynamic "
    "pipeline ('Requires macOS 15+ on Apple Silicon (tested on M4)')"
)
DYN_OBSERVED = (
    "compiled once, then evaluated every step of training/training_dynamic/train.m with the weights packed "
    "into the input's spatial axis"
)


def _dynamic(name: str, fn: str, dims: str = DYN_DIMS, model: str = "") -> Case:
    return case(
        name,
        ("m4",),
        "direct",
        f"{MADERIX} training/training_dynamic/mil_dynamic.h {fn}(), compiled by training/training_dynamic/"
        f"train.m{model}; {dims}; chip: {DYN_CHIPS}",
        DYN_OBSERVED,
    )


GQA_DIMS = (
    "generated here with the Qwen3-0.6B shape of the model header (models/qwen3_06b.h: GQA_RATIO 2, head "
    "dimension not DIM / HEADS) at DIM 256, HIDDEN 768, HEADS 4, KV_HEADS 2, HD 64, SEQ 64 (the project: DIM "
    "1024, HEADS 16, KV_HEADS 8, HD 128, SEQ 256)"
)

MADERIX_CASES: tuple[Case, ...] = (
    _stories("maderix-stories-sdpa-fwd-taps", "gen_sdpa_fwd_taps"),
    _stories("maderix-stories-ffn-fwd-taps", "gen_ffn_fwd_taps"),
    _stories("maderix-stories-ffn-bwd", "gen_ffn_bwd"),
    _stories("maderix-stories-qkv-bwd", "gen_qkvb"),
    _stories("maderix-stories-sdpa-bwd1", "gen_sdpa_bwd1"),
    _stories("maderix-stories-sdpa-bwd2", "gen_sdpa_bwd2"),
    _stories(
        "maderix-stories-sdpa-bwd2-110m",
        "gen_sdpa_bwd2",
        "at the Stories110M dims it trained at (DIM 768, HEADS 12, SEQ 256: input [1, 7680, 1, 256])",
    ),
    case(
        "maderix-stories-sdpa-fwd-taps-m1-macos15",
        ("m1",),
        "direct",
        f"{MADERIX} training/stories_mil.h gen_sdpa_fwd_taps() (program(1.3) on the main line through d91c984; "
        f"the program(1.0) rewrite of {PR6} stayed on its branch), compiled by training/train_large.m; "
        f"{STORIES_DIMS}; chips and macOS: {COMMUNITY} M1 Pro (macOS 15.0, 148-163 ms/step: 'Training works "
        "via stories_mil.h') and M1 Max (macOS 15.6.1, 143-167 ms/step); "
        f"{REPORT} 'Key Findings - M1/M1 Pro/M1 Max: Training works via stories_mil.h' and 'macOS 15.x - Works "
        "for all M-series with correct MIL format'. Its attention is matmul: the run that "
        f"{PR6} contradicts under macOS 26.3 (known_refused 'maderix-pr6-sdpa5-no-mask-ios16')",
        "compiled and evaluated every step of Stories110M training on M1 Pro and M1 Max under macOS 15",
        program_name="maderix-stories-sdpa-fwd-taps",
        macos="15.0, 15.6.1",
    ),
    case(
        "maderix-pr6-stories-ffn-fwd-taps-ios16",
        ("m1",),
        "direct",
        f"{PR6} training/stories_mil.h gen_ffn_fwd_taps() in the program(1.0) / <ios16> / tensor<string, []> "
        f"form; {STORIES_DIMS}. The commit message: 'Conv-based kernels (training, QKV projections, FFN) work "
        "on all generations. Tested on M1 Pro'",
        "compiled and ran on an M1 Pro (the FFN forward kernel of the static training pipeline)",
    ),
    _dynamic("maderix-dynamic-sdpa-fwd", "gen_sdpa_fwd_dynamic"),
    _dynamic("maderix-dynamic-ffn-fused", "gen_ffn_fused_dynamic"),
    _dynamic("maderix-dynamic-ffn-bwd-w2t", "gen_ffn_bwd_w2t_dynamic (gen_dyn_matmul_mil(DIM, HIDDEN, SEQ))"),
    _dynamic("maderix-dynamic-ffn-bwd-w13t", "gen_ffn_bwd_w13t_dynamic"),
    _dynamic("maderix-dynamic-sdpa-bwd1", "gen_sdpa_bwd1_noweight"),
    _dynamic("maderix-dynamic-sdpa-bwd2", "gen_sdpa_bwd2"),
    _dynamic(
        "maderix-dynamic-matmul-110m",
        "gen_wot_dynamic (gen_dyn_matmul_mil(DIM, Q_DIM, SEQ), the dynamic-matmul pattern)",
        "at the Stories110M dims (IC 768, OC 768, SEQ 256: input [1, 768, 1, 1024])",
    ),
    _dynamic(
        "maderix-dynamic-gqa-sdpa-fwd", "gen_sdpa_fwd_dynamic", GQA_DIMS, " (GQA: K / V tiled by concat)"
    ),
    _dynamic("maderix-dynamic-gqa-kv-bwd", "gen_kv_bwd_dynamic", GQA_DIMS),
    _dynamic(
        "maderix-dynamic-gqa-q-bwd", "gen_q_bwd_dynamic (gen_dyn_matmul_mil(Q_DIM, DIM, SEQ))", GQA_DIMS
    ),
)

# -- maderix/ANE benchmarks and probes ----------------------------------------------------------------
PEAK = (
    f"{MADERIX} inmem_peak.m genMIL(ch, sp, depth): fp32 input cast to fp16, `depth` 1x1 convs whose weights are "
    "blobs of ONE file (weights/weight.bin) at offsets 64 + i * (64 + ch*ch*2), cast back to fp32"
)
BENCH_PROBES: tuple[Case, ...] = (
    case(
        "maderix-inmem-peak-512ch-32x",
        ("m3", "m4", "m5"),
        "direct",
        f"{PEAK}; config {{512, 64, 32}} of its sweep; chips: {REPORT} 'Peak ANE Throughput (inmem_peak, 128x conv "
        "512ch sp64)': M3 Pro 9.98, M4 Pro 12.57, M4 Max 10.93, M5 12.17 / 12.44 TFLOPS; benchmarks/"
        "community_results.json (M3 Pro: 'Only ch=512 compiles')",
        "compiled, loaded and benchmarked (the 512-channel configurations set the reported peaks)",
    ),
    case(
        "maderix-inmem-peak-256ch-64x",
        ("m4", "m5"),
        "direct",
        f"{PEAK}; config {{256, 64, 64}} of its sweep; chips: {REPORT} (M4 Pro / M4 Max: 'Flexible channel support "
        "(256/384/512/768+)'; M5 peaks 12.17 / 12.44 with no failing configuration reported)",
        "compiled, loaded and benchmarked in the inmem_peak sweep",
    ),
    case(
        "maderix-weight-reload-64ch",
        ("m5",),
        "direct",
        f"{MADERIX} training/test_weight_reload.m gen_mil(64, 32) (fp32 I/O cast to fp16 around one 64x64 conv); "
        "chip: training/m5result.md 'test_weight_reload' (Apple M5, macOS 26.3)",
        "'Compile+load: 33.3ms | Unload: 0.5ms | Reload: 3.8ms', outputs read back [0.0100, 0.0200, ...] (the "
        "test's FAIL is about weight reloading, not about this program)",
    ),
    case(
        "maderix-qos-sweep-256ch",
        ("m5",),
        "direct",
        f"{MADERIX} training/test_qos_sweep.m (the 256x256 conv, spatial 64, fp32 I/O with casts); chip: "
        "training/m5result.md 'test_qos_sweep' (Apple M5)",
        "'All QoS values 0-63 compile, load, and eval successfully' (eval ~0.07 ms)",
    ),
    case(
        "maderix-pr6-weight-reload-64ch-fp16io",
        ("m1",),
        "direct",
        f"{PR6} training/test_weight_reload.m gen_mil() with g_fp16_io set (program(1.0) / <ios16>, fp16 I/O, no "
        "cast): the M1 / M2 fallback the commit adds ('on first compile failure it retries with native fp16 "
        "inputs/outputs')",
        "compiled and ran on an M1 Pro (the fallback that works where the cast version fails)",
    ),
    case(
        "maderix-sdpa5-no-mask",
        ("m4",),
        "direct",
        f"{MADERIX} training/test_ane_sdpa5.m 'Test 1: no mask' (scaled_dot_product_attention, HEADS 12, SEQ 8, "
        "HD 64, three fp16 inputs); chip: the author's M4 (README.md: 'tested on M4'; the Limitations section "
        "reports what these tests found)",
        "compiled and evaluated; output matches non-causal attention (the baseline the masked variants were "
        "compared against)",
    ),
    case(
        "maderix-int8-w8a8-conv-chain",
        ("m4",),
        "direct",
        f"{MADERIX} ane_int8_bench.m genMILInt8(ch, sp, depth) (constexpr_affine_dequantize int8 weights from one "
        "file, quantize / dequantize between convs), generated here at ch 64, sp 32, depth 3 (the project ran "
        "512 / 256 / 384 channels, 64x64, depth 64-256); chip: README.md 'INT8 W8A8 quantization - 1.88x "
        "throughput (M4, H16G)'",
        "compiled and benchmarked: 35.1 TOPS at 128x conv 512ch 64x64 (README table)",
    ),
)

# -- mechramc/Orion (M4 Max) ----------------------------------------------------------------------------
ORION_M4 = "M4 Max (README.md 'M0: Upstream Validation - Verified ANE private APIs on M4 Max')"
ORION_CASES: tuple[Case, ...] = (
    case(
        "orion-hello-mil",
        ("m4",),
        "direct",
        f"{ORION} experiments/hello_mil.m hello_mil_text() (z = x + y on [1, 256, 1, 64], fp32 I/O with casts); "
        f"commit 2002a50 (T008); {ORION_M4}",
        "'hello_mil.m compiles z=add(x,y) on ANE and verifies all 16384 elements' (compile 17.1 ms, eval 0.223 "
        "ms)",
    ),
    case(
        "orion-test-silu",
        ("m4",),
        "direct",
        f"{ORION} tests/test_mil_builder.m test_silu() with core/mil_builder.m orion_mil_silu() at CH 256, SP 64; "
        f"commit d2b4924 (T019-T023): 'Test: 12/12 pass on ANE'; {ORION_M4}",
        "compiled and evaluated: SiLU(1.0) = 0.731 within 0.01",
    ),
    case(
        "orion-test-gelu-tanh",
        ("m4",),
        "direct",
        f"{ORION} tests/test_mil_builder.m test_gelu() with core/mil_builder.m orion_mil_gelu() (tanh "
        f"approximation from mul / add / tanh) at CH 256, SP 64; commit d2b4924: 'Test: 12/12 pass on ANE'; "
        f"{ORION_M4}",
        "compiled and evaluated: GELU(1.0) in (0.8, 0.9)",
    ),
    case(
        "orion-test-rmsnorm",
        ("m4",),
        "direct",
        f"{ORION} tests/test_mil_builder.m test_rmsnorm() with core/mil_builder.m orion_mil_rmsnorm() "
        f"(reduce_sum, pow(-0.5)) at CH 256, SP 64; commit d2b4924: 'Test: 12/12 pass on ANE'; {ORION_M4}",
        "compiled and evaluated: RMSNorm(2.0, w=1.0) = 1.0 within 0.05",
    ),
    case(
        "orion-gpt2-final-layernorm",
        ("m4",),
        "direct",
        f"{ORION} archive/milgen/inference/gpt2_final.milgen.m orion_milgen_gpt2_final_ln() with core/"
        "mil_builder.m orion_mil_layernorm() (reduce_mean, sub, mul, pow(-0.5)), d_model 768, seq 32 (the "
        "smallest GPT-2 prefill bucket, core/bucket: {32, 64, ..., 1024}); commit a89c6f7 (T049-T053): 'Full "
        f"prefill runner compiles 25 MIL programs (12 attn + 12 FFN + final LN) ... Test: 31/31 pass'; {ORION_M4}",
        "compiled and evaluated as the GPT-2 final LayerNorm: 'exact CPU match, 5/5 top-5 overlap'",
    ),
)


# -- single ops on the e5rt route (sbryngelson/ANEForge, sbryngelson/ane-guide) -----------------------
NATIVE_ALL = "Native on M1, M2 and M4/M5 (the M1, M2 and M5 columns are measured)"
RAN_M1 = (
    "compiled and ran on the engine ('Every operation marked native in Appendix A was compiled and run on the "
    "M1', part-1-machine/04-capability-surface.md)"
)


def _native(
    name: str,
    op: str,
    sweep: str,
    chips: tuple[str, ...] = ("m1", "m2", "m5"),
    note: str = "",
    appendix: str = NATIVE_ALL,
    observed: str = RAN_M1,
) -> Case:
    """A single-op program written as ANEForge's emitter writes the op, native per appendix A and, where the
    op is in it, reachable in the M5 vocabulary sweep."""
    sweep_part = f"; {SWEEP} op '{sweep}': {_SWEEP[sweep]}" if sweep else ""
    return case(
        name,
        chips,
        "e5rt",
        f"program text as {EMITTER} writes it (handler of '{op}', header and signature of "
        "_emit_program_dir; the [1, 64, 1, 64] input is chosen here: neither source publishes its probe "
        f"shapes); {APPENDIX_A} row '{op}': {appendix}{sweep_part}" + (f"; {note}" if note else ""),
        observed + ("; M5: compile and run true in the sweep" if sweep else ""),
    )


_SWEEP = {
    op: f"reachable+correct, relerr {err}"
    for op, err in {
        "relu": 0.0,
        "sigmoid": 0.00384,
        "tanh": 0.00126,
        "exp": 0.00047,
        "sqrt": 0.00043,
        "abs": 0.0,
        "erf": 0.0007,
        "silu": 0.00997,
        "softplus": 0.00078,
        "atan": 0.01881,
        "floor": 0.0,
        "ceil": 0.0,
        "round": 0.0,
        "sign": 0.0,
        "exp2": 0.00048,
        "gelu_exact": 0.00239,
        "rsqrt": 0.00104,
        "log": 0.0008,
        "inverse": 0.00028,
        "leaky_relu": 1e-05,
        "elu": 0.00506,
        "clip": 0.0,
        "add": 0.00033,
        "sub": 0.0003,
        "mul": 0.00017,
        "real_div": 0.00017,
        "maximum": 0.0,
        "minimum": 0.0,
        "pow": 0.00018,
        "select": 0.0,
        "reduce_sum": 0.0008,
        "reduce_mean": 0.0008,
        "reduce_max": 0.0,
        "reduce_min": 0.0,
        "reduce_l1_norm": 0.00071,
        "reduce_sum_square": 0.00054,
        "reduce_log_sum_exp": 0.00077,
        "layer_norm": 0.00039,
        "matmul": 0.0003,
        "conv": 0.00028,
        "transpose": 0.0,
        "concat": 0.0,
        "slice_by_size": 0.0,
        "tile": 0.0,
        "pixel_shuffle": 0.0,
        "max_pool": 0.0,
        "scaled_dot_product_attention": 0.00027,
        "sin": 0.0005,
        "cos": 0.00056,
    }.items()
} | {
    op: "reachable (compile and run true, not checked numerically)"
    for op in ("equal", "less", "greater_equal")
}

_SIMPLE = [
    "relu",
    "sigmoid",
    "tanh",
    "exp",
    "sqrt",
    "abs",
    "erf",
    "silu",
    "softplus",
    "atan",
    "floor",
    "ceil",
    "round",
    "sign",
    "exp2",
    "rsqrt",
    "log",
    "inverse",
    "clip",
    "add",
    "sub",
    "mul",
    "maximum",
    "minimum",
    "pow",
]

E5RT_CASES: tuple[Case, ...] = (
    *(_native(f"aneforge-{op}", op, op) for op in _SIMPLE),
    _native("aneforge-leaky-relu", "leaky_relu", "leaky_relu"),
    _native("aneforge-elu", "elu", "elu"),
    _native("aneforge-real-div", "real_div", "real_div"),
    _native(
        "aneforge-gelu-exact",
        "gelu",
        "gelu_exact",
        note=f"{CATALOG} 'gelu ... (M1 probe: ~0.08 rel err vs exact - LUT approximation, still native)'",
    ),
    *(
        _native(
            f"aneforge-{op.replace('_', '-')}-select",
            op,
            op,
            note="the bool result feeds select (bool I/O is refused)",
        )
        for op in ("equal", "less", "greater_equal")
    ),
    _native(
        "aneforge-softmax",
        "softmax",
        "",
        note="softmax is not in the M5 sweep; part-1-machine/03-numerics.md measures it on the M1 (softmax of "
        "[1000, 1, 2, 3] returns [1, 0, 0, 0])",
    ),
    *(
        _native(f"aneforge-{op.replace('_', '-')}", op, op)
        for op in (
            "reduce_sum",
            "reduce_mean",
            "reduce_max",
            "reduce_min",
            "reduce_l1_norm",
            "reduce_sum_square",
            "reduce_log_sum_exp",
        )
    ),
    case(
        "aneforge-layer-norm-64x512",
        ("m1", "m2", "m5"),
        "e5rt",
        f"{EMITTER} _e_layer_norm (reshape to [M, D, 1, 1], reduce_mean, sub, mul, reduce_mean, add eps, rsqrt, "
        f"gamma, beta) at [64, 512] with both affine terms random; {ANEFORGE} bench/layer_norm_compile_probe.py "
        "(commit 0ff05de; issue #149), 'Verified across three families (M1 Max, M2 Pro, M5 Pro)': both terms "
        "live fails only on M5 at D >= ~10240, and only the one-live-term configurations fail on M1 / M2",
        "compiled and dispatched ('OK') on M1 Max, M2 Pro and M5 Pro (the probe's 'rr' column at D below 10240)",
    ),
    _native(
        "aneforge-layer-norm-op",
        "layer_norm",
        "layer_norm",
        note="written here as the single MIL layer_norm op (ANEForge's emitter decomposes it)",
    ),
    _native("aneforge-matmul", "matmul", "matmul", note="the weight is a BLOBFILE const, transpose_y = true"),
    _native(
        "aneforge-bmm",
        "matmul",
        "matmul",
        note="the bmm handler: two runtime operands, [1, 4, 64, 32] x [1, 4, 32, 64]",
    ),
    _native("aneforge-conv-3x3", "conv", "conv", note="3x3 kernel, 16 channels, 32x32, pad 1"),
    case(
        "aneforge-conv-16x3",
        ("m1",),
        "e5rt",
        f"program text as {EMITTER} _e_conv writes it, kernel height 16, width 3; {GUIDE} part-1-machine/"
        "04-capability-surface.md 'The kernel height is unconstrained, so a 16x3 kernel compiles and a 3x16 "
        f"kernel does not' (compile-legal envelope, measured compile-only on the M1); {ANEFORGE} docs/developer/"
        "op-quirks.md 'verified: 16x3 compiles, 3x16 does not'",
        "compiled (compile-only probe)",
    ),
    case(
        "aneforge-conv-1x13",
        ("m1",),
        "e5rt",
        f"program text as {EMITTER} _e_conv writes it, kernel width 13; {GUIDE} part-5-practice/"
        "17-model-design-rules.md 'On the M1 the fp16 convolution kernel width is bounded at 13: a kernel of "
        "width 14 rejects' (measured by sweeping until compile flipped)",
        "compiled (the widest fp16 kernel the M1 accepts)",
    ),
    *(
        _native(f"aneforge-{op.replace('_', '-')}", op, op)
        for op in ("transpose", "concat", "slice_by_size", "tile", "pixel_shuffle", "max_pool")
    ),
    _native(
        "aneforge-sdpa",
        "scaled_dot_product_attention",
        "scaled_dot_product_attention",
        note="no mask, [1, 4, 64, 32] query / key / value",
    ),
    case(
        "aneforge-cast-fp16-fp32",
        ("m1", "m2"),
        "e5rt",
        f"{CATALOG} 'cast ... fp16<->fp32/bool native on M1'; {APPENDIX_A} row 'cast': Native on M1 and M2, 'fp16 "
        "to fp32 and bool native on the M1'; written as the emitter writes its cast handler",
        "compiled and ran natively on the M1 (catalog and appendix A)",
    ),
    case(
        "aneforge-relu-width-16384",
        ("m1", "m2"),
        "e5rt",
        f"{GUIDE} part-5-practice/17-model-design-rules.md 'Width 16384 compiles and 16385 rejects' (measured on "
        f"the M1 by sweeping each axis); {ANEFORGE} docs/cross-chip.md 'The A13 row is now measured on the live "
        "M1 and equals A14 exactly (16385 W/H, 65537 C both reject)'",
        "compiled (width 16384 is the largest accepted)",
    ),
    case(
        "aneforge-relu-channels-65536",
        ("m1", "m2"),
        "e5rt",
        f"{GUIDE} part-5-practice/17-model-design-rules.md 'A tensor may span up to ... 65536 along channel' "
        f"(measured on the M1); {ANEFORGE} docs/cross-chip.md (A13 and A14 measured: 65537 channels reject)",
        "compiled (65536 channels is the largest accepted)",
    ),
    case(
        "aneforge-argmax-width-2048",
        ("m1",),
        "e5rt",
        f"{GUIDE} part-5-practice/17-model-design-rules.md 'The arg-min and arg-max operations reduce a channel of "
        "at most 2048, and the spatial form caps height or width at 2048 the same way; 2049 rejects' (measured "
        f"on the M1); {APPENDIX_A} row 'reduce_argmax': Native on M1",
        "compiled (a reduced axis of 2048 is the largest accepted)",
    ),
    case(
        "aneforge-dynamic-conv-batch1",
        ("m1",),
        "e5rt",
        f"program text as {EMITTER} _e_dynamic_conv writes it (the weight is the second program input), batch 1; "
        f"{GUIDE} part-5-practice/19-pitfalls-and-limits.md 'At a batch of one it compiles and runs and matches a "
        "reference convolution to a cosine of 1.0000' (M1, the guide's primary host)",
        "compiled and ran, cosine 1.0000 against a reference convolution",
    ),
    *(
        _native(
            f"aneforge-{op}",
            op,
            op,
            chips=("m5",),
            appendix="Family-gated on M1 and M2, Native on M3 and M4/M5 ('Native from the M3'; M5 measured)",
            observed="compiled and ran on the M5",
        )
        for op in ("sin", "cos")
    ),
    _native(
        "aneforge-identity",
        "identity",
        "",
        chips=("m1", "m2"),
        appendix="Native on M1, M2 and M4/M5, 'Aliases a cast or no-op'",
        note=f"compiled alone ('a graph that contains ONLY that operation', {GUIDE} part-1-machine/"
        "04-capability-surface.md). The M5 is not claimed: ANEForge's M5 sweep refused the same program "
        "(known_refused 'aneforge-identity-on-m5', contested)",
    ),
    case(
        "aneforge-cumsum-triangular-matmul",
        ("m1",),
        "e5rt",
        f"{CATALOG} row 'cumsum': 'runs ON the ANE as a single op (verified M1 2026-06-09: cos 1.0) ... The "
        f"standard MIL cumsum op is unimplemented, so it is reached via the curated e5rt path'; {CENSUS} entry "
        "'cumsum': 'The prefix-sum capability is reachable on the same e5rt path via an upper-triangular ones "
        "matmul (x @ U; relerr ~3e-4; O(N^2) in the matmul)'. Written here as that matmul (the matmul handler "
        f"of {EMITTER}, U a [64, 64] BLOBFILE const of ones on and above the diagonal, transpose_y = false)",
        "ran on the M1: the curated path (by the census, this matmul) verified there, cosine 1.0 against a "
        "prefix sum",
        values={("@model_path/weights.bin", 64): np.triu(np.ones((64, 64), np.float16))},
    ),
)

KNOWN_GOOD: tuple[Case, ...] = (*MADERIX_CASES, *BENCH_PROBES, *ORION_CASES, *E5RT_CASES)

_names = [c.name for c in KNOWN_GOOD]
assert len(set(_names)) == len(_names), "duplicate case names"

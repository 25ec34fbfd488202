"""The kernels of the engine-attention routes: which constructs they are made of (no in-kernel RMSNorm but
Qwen 3's / Gemma 3's per-head q / k norm, no repeated norm scale, no swap conv), the slice RoPE against a
float64 rotation written here, the rule book's verdict on every chip, and the legacy kernels unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from anekit import runtime
from anekit.engine import CHIPS
from anekit.engine.constructs import MACOS_MAJORS
from anekit.engine.training_routes import training_route
from anekit.kernels import ModelConfig, catalog
from anekit.kernels.blocks import KernelBuilder
from anekit.kernels.composable import DynamicKernelSpec
from anekit.kernels.config import preset
from anekit.kernels.route import LEGACY, ROUTES, BadKernelRoute
from anekit.kernels.route_specs import route_specs
from anekit.kernels.spec import KernelSpec, Layout
from anekit.mil.ir import Op, Var
from anekit.rules.lint import lint_program
from tests import test_llama_step as llama_step
from tests import test_llama_step_gemma as gemma_step
from tests.test_kernels_route_step import QWEN3

ENGINE_ROUTES = ("dynamic-engine-attention", "baked-engine-attention")
PROFILES = ("any", *CHIPS)
LLAMA = llama_step.CONFIGS["gqa-rope-tied"][0]
CONFIGS = {"llama": LLAMA, "stories15M": preset("stories15M"), "qwen3": QWEN3, "gemma3": gemma_step.CFG}
# Ops only an RMSNorm emits in these kernels (KernelBuilder.rms_inverse: max |x|, then pow(-0.5)).
RMSNORM_OPS = ("reduce_max", "pow")
NORM_SCALES = ("rms_att", "rms_ffn", "post_att_norm", "post_ffn_norm")


def _ops(spec: KernelSpec) -> list[Op]:
    return list(spec.program.functions["main"].block.ops)


def _name(op: Op) -> str:
    return op.outputs[0].name


def _scalar(op: Op, name: str) -> object:
    """The value of a scalar input written as a const."""
    arg = op.inputs[name]
    assert isinstance(arg, Var) and arg.const is not None, (op.op_type, name)
    return np.asarray(arg.const.value).reshape(()).item()


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("route", ENGINE_ROUTES)
def test_the_route_kernels_compute_no_rmsnorm_but_the_per_head_qk_norm(route, config):
    """maderix c3c5094 mil_dynamic.h: 'RMSNorm stays on CPU'; only Qwen 3's / Gemma 3's q / k norm, after
    the projections, stays in the SDPA forward (the construct rmsnorm.peak-normalised, per head)."""
    cfg = CONFIGS[config]
    for name, spec in route_specs(cfg, ROUTES[route]).items():
        norms = [_name(op) for op in _ops(spec) if op.op_type in RMSNORM_OPS]
        if cfg.qk_norm and name.startswith("sdpa_fwd"):
            assert norms and all(n.startswith(("qn_", "kn_")) for n in norms), (name, norms)
        else:
            assert not norms, (name, norms)
        assert "xnorm" not in spec.outputs.names and "x2norm" not in spec.outputs.names


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("route", ENGINE_ROUTES)
def test_the_route_kernels_take_no_norm_scale(route, config):
    """No RMSNorm scale baked, nor repeated over S columns of a dynamic input (rmsnorm.scale-repeated)."""
    cfg = CONFIGS[config]
    for name, spec in route_specs(cfg, ROUTES[route]).items():
        if isinstance(spec, DynamicKernelSpec):
            assert not set(spec.columns.names) & set(NORM_SCALES), name
        weights = {_name(op) for op in _ops(spec) if op.op_type == "const"}
        assert not weights & set(NORM_SCALES), name


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("route", ENGINE_ROUTES)
def test_the_route_kernels_have_no_swap_conv_and_rotate_with_slices(route, config):
    """RoPE (sdpa_fwd*) and its inverse (sdpa_bwd2*) as reshape, two one-wide slices of the last axis, a
    mul by -1 and a concat on the last axis: maderix c3c5094 mil_dynamic.h, ncdrone/rustane sdpa_fwd.rs."""
    cfg = CONFIGS[config]
    for name, spec in route_specs(cfg, ROUTES[route]).items():
        ops = _ops(spec)
        convs = [op for op in ops if op.op_type == "conv"]
        assert not [op for op in convs if "rope" in op.inputs["weight"].name], name
        concats = [op for op in ops if op.op_type == "concat" and _name(op) != "out"]
        if name.startswith(("sdpa_fwd", "sdpa_bwd2")):
            assert len(concats) == 2, name  # q and k, or dq and dk
            for op in concats:
                assert op.outputs[0].type.shape[-1] == 2
                assert _scalar(op, "axis") == 3 and _scalar(op, "interleave") is False
        else:
            assert not concats, name


@pytest.mark.parametrize("config", CONFIGS)
def test_the_dynamic_route_kernels_have_no_conv(config):
    """Weights in the inputs, consumed by matmuls; SDPA backward 1 is fed da itself rather than baking
    Wo = I as a conv (the legacy kernel's): no conv.baked construct in the route."""
    for name, spec in route_specs(CONFIGS[config], ROUTES["dynamic-engine-attention"]).items():
        assert not [_name(op) for op in _ops(spec) if op.op_type == "conv"], name


def _rotation64(x: np.ndarray, hd: int, theta: float, inverse: bool) -> np.ndarray:
    """Each head's pairs (2i, 2i + 1) of x (C, S) turned by +-(position * theta^(-2i / hd)), in float64."""
    c, s = x.shape
    freq = theta ** (-np.arange(0, hd, 2) / hd)  # (hd/2,)
    angle = freq[:, None] * np.arange(s)[None, :] * (-1.0 if inverse else 1.0)  # (hd/2, S)
    pairs = x.astype(np.float64).reshape(c // hd, hd // 2, 2, s)
    a, b = pairs[:, :, 0], pairs[:, :, 1]
    out = np.stack([a * np.cos(angle) - b * np.sin(angle), a * np.sin(angle) + b * np.cos(angle)], axis=2)
    return out.reshape(c, s)


def _rope_kernel(
    cfg: ModelConfig, channels: int, kind: str, inverse: bool, form: str = "slice"
) -> KernelSpec:
    layout = Layout.of([("x", channels)], cfg.seq_len)
    kb = KernelBuilder("rope", cfg, layout, None, kind, rope=form)
    y = kb.rope(kb.part("x"), channels, "r", inverse=inverse)  # (1, C, 1, S)
    return kb.finish(Layout.of([("y", channels)], cfg.seq_len), {"y": y})


@pytest.mark.parametrize("chip", PROFILES)
@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize("form", ["slice", "matmul"])
def test_the_heads_view_rope_is_the_float64_rotation(form, inverse, chip):
    """Both forms hardware-run code writes (slice + negate + concat; a matmul by the rotate-half
    permutation, rustane pull request #9): full layers (base 10^6 for the Gemma config) and sliding ones
    (its local base 10^4); q (4 heads) and k (2 heads) widths; the inverse rotates by minus the angle."""
    cfg = gemma_step.CFG
    rng = np.random.default_rng(31)
    backend = runtime.open("sim", chip=chip)
    for kind, theta in (("full", cfg.rope_theta), ("sliding", cfg.rope_local_theta)):
        for channels in (cfg.q_dim, cfg.kv_dim):
            spec = _rope_kernel(cfg, channels, kind, inverse, form)
            x = rng.standard_normal((channels, cfg.seq_len)).astype(np.float16).astype(np.float32)
            got = spec.run(backend, x=x)["y"]
            want = _rotation64(x, cfg.head_dim, theta, inverse)
            # the tables are fp16, x cos and (-b, a) sin are rounded once each and their sum once
            assert np.max(np.abs(got - want)) <= 4 * 2**-11 * np.max(np.abs(want)), (kind, channels)


def test_a_wide_pair_view_folds_positions_into_channels():
    """S * hd / 2 past the 16384 an M1 to M3 takes on a spatial axis: the pairs view [1, n*S, hd/2, 2]."""
    cfg = ModelConfig(256, 512, 1, 2, 2, 64, 512, attn_head_dim=128)  # S * hd / 2 = 32768
    spec = _rope_kernel(cfg, cfg.q_dim, "full", False)
    shapes = [op.outputs[0].type.shape for op in _ops(spec) if op.op_type == "concat"]
    assert shapes == [(1, 2 * 512, 64, 2)]
    x = np.random.default_rng(32).standard_normal((cfg.q_dim, cfg.seq_len)).astype(np.float32)
    x = x.astype(np.float16).astype(np.float32)
    got = spec.run(runtime.open("sim"), x=x)["y"]
    want = _rotation64(x, cfg.head_dim, cfg.rope_theta, False)
    assert np.max(np.abs(got - want)) <= 4 * 2**-11 * np.max(np.abs(want))


def test_a_kernel_builder_refuses_an_unknown_choice():
    layout = Layout.of([("x", LLAMA.dim)], LLAMA.seq_len)
    with pytest.raises(BadKernelRoute, match=r"\[k\] rope 'swap'"):
        KernelBuilder("k", LLAMA, layout, None, rope="swap")
    with pytest.raises(BadKernelRoute, match=r"\[k\] norm 'cpu'"):
        KernelBuilder("k", LLAMA, layout, None, norm="cpu")


@pytest.mark.parametrize("chip", PROFILES)
@pytest.mark.parametrize("route", ENGINE_ROUTES)
def test_the_rule_book_finds_no_error_in_the_route_kernels(route, chip):
    """Every kernel of the route, with the weights it is built with (a preset's random ones), on every
    chip: no error, and nothing about the slice RoPE's concat (rules op.concat-axis / op.concat-interleave:
    axis 3 of a rank-4 tensor, interleave written, as the hardware-run kernels write it)."""
    for config, cfg in CONFIGS.items():
        weights = catalog.random_weights(cfg) if config == "stories15M" else None
        for name, spec in route_specs(cfg, ROUTES[route], weights).items():
            files = spec.weight_files() if spec.weights.complete else None
            result = lint_program(spec.program, name, chip, files)
            assert result.errors == 0, [str(f) for f in result.findings if f.is_error]
            concat = [f for f in result.findings if f.rule.id.startswith("op.concat")]
            assert not concat, [str(f) for f in concat]


@pytest.mark.parametrize("config", ["stories15M", "gemma3"])
def test_the_legacy_route_gives_the_cataloged_kernels_byte_for_byte(config):
    cfg = CONFIGS[config]
    weights = catalog.random_weights(cfg)
    specs = route_specs(cfg, LEGACY)
    assert list(specs) == catalog.with_kinds(
        cfg, [*catalog.DYNAMIC_KERNELS, *catalog.DYNAMIC_HELPERS, "sdpa_bwd2"]
    )
    for name, spec in specs.items():
        assert spec.text() == catalog.build(name, cfg, weights).text(), name


def test_the_baked_route_names_are_the_catalogs():
    cfg = CONFIGS["gemma3"]
    specs = route_specs(cfg, ROUTES["baked-engine-attention"])
    base = ["sdpa_fwd", "ffn_fwd", "ffn_bwd", "sdpa_bwd1", "sdpa_bwd2", "qkv_bwd"]
    assert list(specs) == catalog.with_kinds(cfg, base)


@pytest.mark.parametrize("config", ["stories15M", "stories110M"])
def test_where_the_engine_layer_chooses_an_engine_route_its_kernels_lint_clean(config):
    """For every chip and macOS major whose training route (``anekit.engine.training_routes``) is one of
    these routes, the rule book finds in its kernels, at a preset's sizes, no error and no warning of a
    rule that hardware-run evidence disputes (a contested rule: it has counter-evidence)."""
    cfg = preset(config)
    weights = catalog.random_weights(cfg)
    chosen = 0
    for chip in CHIPS:
        for macos in MACOS_MAJORS:
            route = training_route(chip, macos)
            if route.id not in (*ENGINE_ROUTES, "dynamic-engine-attention-rope-matmul"):
                continue
            chosen += 1
            assert ROUTES[route.id].describe() == route.describe()
            for name, spec in route_specs(cfg, ROUTES[route.id], weights).items():
                result = lint_program(spec.program, name, chip, spec.weight_files())
                bad = [str(f) for f in result.findings if f.is_error or f.rule.conflicted]
                assert not bad, (chip, macos, route.id, name, bad)
    assert chosen  # the engine layer gives these routes somewhere (today: M3, M4 and M5)

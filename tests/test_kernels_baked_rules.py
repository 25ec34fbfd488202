"""The baked kernels emit only constructs with hardware precedent, for every preset; RMSNorm and RoPE
stay exact where the old constructs failed (fp16 sums of squares of large activations).

The structural checks walk the Program IR of every cataloged baked kernel: the output is a compute op
named ``out`` (no trailing identity), concat joins channels, no reshape keeps its shape, no conv reads
more than 2048 channels, sums of squares over channels are pre-scaled, and only ops seen in
hardware-run kernels (maderix/ANE training/stories_mil.h, training/training_dynamic/mil_dynamic.h)
appear. The numeric checks compare with the float64 references.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from anekit import runtime
from anekit.cli.train_cmd import _config as train_config
from anekit.kernels import ModelConfig, backward, catalog, forward, preset, reference
from anekit.kernels.blocks import KernelBuilder
from anekit.kernels.spec import KernelSpec, Layout, LayoutError
from anekit.mil.ir import Op, Var
from tests.kernel_weights import fp16_exact, random_layer

CONFIGS = {
    "stories260K": preset("stories260K"),
    "stories15M": preset("stories15M"),
    "stories110M": preset("stories110M"),
    "default": train_config("default"),  # ``anekit train``'s own model
    "mha-norope": ModelConfig(48, 96, 1, 6, 6, 100, 32, rope=False),
}
BAKED = [*catalog.LAYER_KERNELS, *catalog.HEAD_KERNELS]
# Every op type of the hardware-run kernels the baked ones are modelled on (maderix/ANE
# training/stories_mil.h, training/training_dynamic/mil_dynamic.h): no identity, rsqrt, sqrt,
# reduce_mean.
PRECEDENTED_OPS = {
    "const",
    "conv",
    "matmul",
    "mul",
    "add",
    "sub",
    "pow",
    "reduce_sum",
    "softmax",
    "sigmoid",
    "reshape",
    "transpose",
    "slice_by_size",
    "concat",
    # RMSNorm's statistics from x / max|x| (KernelBuilder.rms_inverse): abs, reduce_max, maximum and
    # real_div are native on M1 through M5 (sbryngelson/ane-guide appendices/a-op-device-matrix.md), and
    # coremltools' max-rescaled rms_norm ran on an M3 Max (apple/coremltools pull request #2822).
    "abs",
    "reduce_max",
    "maximum",
    "real_div",
}
MAX_CONV_INPUT_CHANNELS = 2048  # the widest conv seen working (maderix/ANE training/stories_mil.h)
TOL = 5e-3  # kernel vs float64 reference, relative to the output's max-abs (as the other kernel tests)

_SPECS: dict[tuple[str, str], KernelSpec] = {}


def _spec(cfg_name: str, kernel: str) -> KernelSpec:
    """A cataloged kernel generated from shapes only (cached: stories110M's programs are large)."""
    key = (cfg_name, kernel)
    if key not in _SPECS:
        _SPECS[key] = catalog.build(kernel, CONFIGS[cfg_name], None)
    return _SPECS[key]


def _ops(spec: KernelSpec) -> list[Op]:
    return spec.program.functions["main"].block.ops


def _shape(v: object) -> tuple[int, ...]:
    assert isinstance(v, Var)
    return tuple(v.type.shape)  # type: ignore[union-attr]


def _const(v: object) -> np.ndarray | None:
    """The value of a const input (not a BLOBFILE weight), else None."""
    if isinstance(v, Var) and v.const is not None and isinstance(v.const.value, np.ndarray):
        return v.const.value
    return None


def _scalar(v: object) -> float | None:
    """The value of a scalar const input, else None."""
    a = _const(v)
    return float(a) if a is not None and a.ndim == 0 else None


def _ints(v: object) -> list[int]:
    a = _const(v)
    assert a is not None
    return [int(n) for n in np.atleast_1d(a)]


WALK = [(c, k) for c in CONFIGS for k in BAKED]


@pytest.mark.parametrize(("cfg_name", "kernel"), WALK)
def test_the_output_is_a_compute_op_named_out(cfg_name, kernel):
    fn = _spec(cfg_name, kernel).program.functions["main"]
    (out,) = fn.outputs
    assert out.name == "out"
    assert out.op is not None and out.op.op_type not in ("identity", "const"), out.op
    assert out.op.name == "out"


@pytest.mark.parametrize(("cfg_name", "kernel"), WALK)
def test_only_ops_with_hardware_precedent(cfg_name, kernel):
    types = {op.op_type for op in _ops(_spec(cfg_name, kernel))}
    assert types <= PRECEDENTED_OPS, types - PRECEDENTED_OPS


@pytest.mark.parametrize(("cfg_name", "kernel"), WALK)
def test_concat_joins_channels(cfg_name, kernel):
    for op in _ops(_spec(cfg_name, kernel)):
        if op.op_type == "concat":
            (axis,) = _ints(op.inputs["axis"])
            assert axis == 1, op.where()


@pytest.mark.parametrize(("cfg_name", "kernel"), WALK)
def test_no_reshape_keeps_its_shape(cfg_name, kernel):
    for op in _ops(_spec(cfg_name, kernel)):
        if op.op_type == "reshape":
            assert _shape(op.inputs["x"]) != _shape(op.outputs[0]), op.where()


@pytest.mark.parametrize(("cfg_name", "kernel"), WALK)
def test_every_conv_reads_at_most_2048_channels(cfg_name, kernel):
    for op in _ops(_spec(cfg_name, kernel)):
        if op.op_type == "conv":
            assert _shape(op.inputs["weight"])[1] <= MAX_CONV_INPUT_CHANNELS, op.where()
            assert _shape(op.inputs["x"])[1] <= MAX_CONV_INPUT_CHANNELS, op.where()


@pytest.mark.parametrize(("cfg_name", "kernel"), WALK)
def test_matmuls_are_rank_4(cfg_name, kernel):
    for op in _ops(_spec(cfg_name, kernel)):
        if op.op_type == "matmul":
            assert len(_shape(op.inputs["x"])) == len(_shape(op.inputs["y"])) == 4, op.where()


def _prescale(v: object) -> float | None:
    """The scalar a tensor was multiplied by, when it is ``mul(tensor, scalar const)``."""
    if not isinstance(v, Var) or v.op is None or v.op.op_type != "mul":
        return None
    for a, b in (("x", "y"), ("y", "x")):
        s = _scalar(v.op.inputs[b])
        if s is not None and _scalar(v.op.inputs[a]) is None:
            return s
    return None


@pytest.mark.parametrize(("cfg_name", "kernel"), WALK)
def test_sums_of_products_over_channels_are_prescaled(cfg_name, kernel):
    """reduce_sum over channels of a product: one factor scaled by at most 1/sqrt(C) first, so the fp16
    sum is bounded by a mean; a square is of x / max|x| (each at most 1: the sum at most C) or of one
    tensor scaled by 1/sqrt(C) (a mean of squares)."""
    checked = 0
    for op in _ops(_spec(cfg_name, kernel)):
        if op.op_type != "reduce_sum" or _ints(op.inputs["axes"]) != [1]:
            continue
        prod = op.inputs["x"]
        assert isinstance(prod, Var) and prod.op is not None and prod.op.op_type == "mul", op.where()
        channels = _shape(prod)[1]
        limit = (1 + 1e-3) / math.sqrt(channels)
        x, y = prod.op.inputs["x"], prod.op.inputs["y"]
        if x is y and _max_normalized(x):  # a square of x / max|x|: at most 1 each, the sum at most C
            checked += 1
            continue
        scales = [s for s in (_prescale(x), _prescale(y)) if s is not None]
        assert scales and min(abs(s) for s in scales) <= limit, op.where()
        if x is y:  # a square: the squared tensor itself is pre-scaled
            assert abs(_prescale(x)) <= limit, op.where()  # type: ignore[arg-type]
        checked += 1
    norms = {"sdpa_fwd": 1, "ffn_fwd": 1, "final_rmsnorm": 1}
    if kernel.startswith("rmsnorm_"):
        assert checked == 2  # r of x, and the mean of g * xhat
    else:
        assert checked == norms.get(kernel, 0)


def _max_normalized(v: object) -> bool:
    """``v`` = real_div(a, maximum(reduce_max(abs(a)), c)): every |v| <= 1 (an independent reading of the
    graph, not the rule book's)."""
    if not isinstance(v, Var) or v.op is None or v.op.op_type != "real_div":
        return False
    a, m = v.op.inputs["x"], v.op.inputs["y"]
    if not isinstance(m, Var) or m.op is None or m.op.op_type != "maximum":
        return False
    peak = m.op.inputs["x"]
    assert isinstance(peak, Var) and peak.op is not None and peak.op.op_type == "reduce_max"
    assert _ints(peak.op.inputs["axes"]) == [1] and (_scalar(m.op.inputs["y"]) or 0) > 0
    absolute = peak.op.inputs["x"]
    return (
        isinstance(absolute, Var)
        and absolute.op is not None
        and absolute.op.op_type == "abs"
        and (absolute.op.inputs["x"] is a)
    )


def test_qkv_bwd_of_stories110m_is_three_convs():
    # one conv over [Wq^T | Wk^T | Wv^T] would read 768 + 2 * 768 = 2304 channels
    convs = [op for op in _ops(_spec("stories110M", "qkv_bwd")) if op.op_type == "conv"]
    assert [_shape(op.inputs["weight"]) for op in convs] == [(768, 768, 1, 1)] * 3


def test_the_classifier_backward_is_not_a_kernel():
    """embed^T @ dlogits contracts over the vocabulary (32000): the training step does it on the CPU."""
    assert "classifier_bwd" not in BAKED
    assert not hasattr(backward, "classifier_bwd")


# -- RoPE ---------------------------------------------------------------------------------------------


def _rope_kernel(cfg: ModelConfig, channels: int, inverse: bool) -> KernelSpec:
    layout = Layout.of([("x", channels)], cfg.seq_len)
    kb = KernelBuilder("rope", cfg, layout, {})
    y = kb.rope(kb.part("x"), channels, "rot", inverse=inverse)  # (1, C, 1, S)
    return kb.finish(layout, {"x": y})


@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize("channels", [64, 32])
def test_rope_is_llama2c_rotation_of_pairs(channels, inverse):
    cfg = ModelConfig(64, 128, 1, 8, 4, 100, 32)  # head_dim 8: channels span several heads
    x = fp16_exact(np.random.default_rng(1).standard_normal((channels, cfg.seq_len)))
    spec = _rope_kernel(cfg, channels, inverse)
    got = spec.run(runtime.open("sim"), x=x)["x"]
    assert _rel(got, reference.rope(x, cfg, inverse=inverse)) < TOL
    types = [op.op_type for op in _ops(spec) if op.op_type != "const"]
    assert types == ["mul", "conv", "mul", "sub" if inverse else "add"]


def test_rope_pair_swap_is_exact():
    """The swap conv (0 / +-1 weights) moves fp16 values without rounding: rope at position 0 is x."""
    cfg = ModelConfig(64, 128, 1, 8, 4, 100, 32)
    x = fp16_exact(100 * np.random.default_rng(2).standard_normal((64, cfg.seq_len)))
    got = _rope_kernel(cfg, 64, False).run(runtime.open("sim"), x=x)["x"]
    np.testing.assert_array_equal(got[:, 0], x[:, 0])


# -- RMSNorm with large activations ---------------------------------------------------------------------

NORM_CONFIGS = {
    "dim64": ModelConfig(64, 128, 1, 8, 4, 100, 32),
    "dim768": ModelConfig(768, 2048, 1, 12, 12, 100, 32),  # stories110M's width: old limit rms ~9
}


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


@pytest.mark.parametrize("x_rms", [50.0, 100.0])
@pytest.mark.parametrize("cfg_name", NORM_CONFIGS)
def test_rmsnorm_forward_of_large_activations(cfg_name, x_rms):
    cfg = NORM_CONFIGS[cfg_name]
    w = random_layer(cfg, seed=21)
    w["rms_final"] = w["rms_final"] + 0.1 * np.random.default_rng(22).standard_normal(cfg.dim)
    x = fp16_exact(x_rms * np.random.default_rng(23).standard_normal((cfg.dim, cfg.seq_len)))
    got = forward.final_rmsnorm(cfg, w).run(runtime.open("sim"), x=x)["xnorm"]
    assert np.all(np.isfinite(got))
    assert _rel(got, reference.final_rmsnorm(cfg, x, w)["xnorm"]) < TOL


@pytest.mark.parametrize("x_rms", [50.0, 100.0])
def test_layer_kernels_normalise_large_activations(x_rms):
    cfg = NORM_CONFIGS["dim64"]
    w = random_layer(cfg, seed=24)
    x = fp16_exact(x_rms * np.random.default_rng(25).standard_normal((cfg.dim, cfg.seq_len)))
    sim = runtime.open("sim")
    att = forward.sdpa_fwd(cfg, w).run(sim, x=x)
    ffn = forward.ffn_fwd(cfg, w).run(sim, x=x)
    assert _rel(att["xnorm"], reference.sdpa_fwd(cfg, x, w)["xnorm"]) < TOL
    assert _rel(att["o_out"], reference.sdpa_fwd(cfg, x, w)["o_out"]) < TOL
    assert _rel(ffn["x2norm"], reference.ffn_fwd(cfg, x, w)["x2norm"]) < TOL


@pytest.mark.parametrize("x_rms", [50.0, 100.0])
@pytest.mark.parametrize("cfg_name", NORM_CONFIGS)
def test_rmsnorm_backward_of_large_activations(cfg_name, x_rms):
    cfg = NORM_CONFIGS[cfg_name]
    rng = np.random.default_rng(26)
    scale = 1 + 0.1 * rng.standard_normal(cfg.dim)
    dy = fp16_exact(rng.standard_normal((cfg.dim, cfg.seq_len)))
    x = fp16_exact(x_rms * rng.standard_normal((cfg.dim, cfg.seq_len)))
    got = backward.rmsnorm_bwd(cfg, {"w": scale}).run(runtime.open("sim"), dy=dy, x=x)["dx"]
    want, _ = reference.rmsnorm_bwd(dy, x, scale, cfg.norm_eps)
    assert np.all(np.isfinite(got))
    assert _rel(got, want) < TOL


def test_rmsnorm_backward_of_large_gradients():
    """The sum of g * xhat over 768 channels, about 768 * 100 here, would overflow fp16 unscaled."""
    cfg = NORM_CONFIGS["dim768"]
    rng = np.random.default_rng(27)
    x = fp16_exact(rng.standard_normal((cfg.dim, cfg.seq_len)))
    dy = fp16_exact(100 * x + 300 * rng.standard_normal((cfg.dim, cfg.seq_len)))  # mean(g * xhat) ~ 100
    scale = np.ones(cfg.dim)
    got = backward.rmsnorm_bwd(cfg, {"w": scale}).run(runtime.open("sim"), dy=dy, x=x)["dx"]
    want, _ = reference.rmsnorm_bwd(dy, x, scale, cfg.norm_eps)
    assert np.all(np.isfinite(got))
    assert _rel(got, want) < TOL


# -- the builder's guards -------------------------------------------------------------------------------


def test_a_pass_through_output_still_ends_in_a_compute_op():
    cfg = NORM_CONFIGS["dim64"]
    layout = Layout.of([("x", cfg.dim)], cfg.seq_len)
    kb = KernelBuilder("pass", cfg, layout, {})
    spec = kb.finish(layout, {"x": kb.part("x")})
    (out,) = spec.program.functions["main"].outputs
    assert out.name == "out" and out.op is not None and out.op.op_type == "mul"
    x = fp16_exact(np.random.default_rng(28).standard_normal((cfg.dim, cfg.seq_len)))
    np.testing.assert_array_equal(spec.run(runtime.open("sim"), x=x)["x"], x)


def test_a_conv_wider_than_2048_channels_is_refused():
    cfg = ModelConfig(64, 128, 1, 8, 4, 100, 32)
    kb = KernelBuilder("wide", cfg, Layout.of([("x", 4096)], cfg.seq_len), None)
    with pytest.raises(LayoutError, match=r"\[wide\] conv 'y' reads 4096 input channels"):
        kb.conv(kb.part("x"), kb.weight("w", (64, 4096, 1, 1), None), "y")
